"""Models: the registry of presets, the ViT family (vit.py, with cores/), DeepThinking's convolutional
network on the same cores (dtnet.py) and LoopVAE."""
from . import dtnet as _dtnet  # noqa: F401  (registers DeepThinking's dt_net / dt_net_recall presets)
from . import loopvae as _loopvae  # noqa: F401  (registers the loopvae presets)
from .registry import create_model, list_models, model_config, preset, register
from .vit import ViTConfig, VisionTransformer

__all__ = ["create_model", "list_models", "model_config", "preset", "register", "ViTConfig", "VisionTransformer"]
