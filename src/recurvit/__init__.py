"""recurvit: recurrent-depth vision transformers.

Public API: ``create_model``, ``list_models``, ``load_model`` and the config dataclasses.
"""
from .config import DataConfig, ModelConfig, RunConfig, TrainConfig, load_config
from .models import create_model, list_models, model_config


def load_model(path, map_location="cpu"):
    """Model from a run directory or checkpoint file, with its trained weights, in eval mode."""
    from .train.checkpoint import load_model as _load

    return _load(path, map_location=map_location)


__version__ = "0.1.0"
__all__ = ["create_model", "list_models", "load_model", "model_config", "load_config",
           "ModelConfig", "DataConfig", "TrainConfig", "RunConfig"]
