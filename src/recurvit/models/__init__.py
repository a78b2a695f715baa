from .registry import create_model, list_models, model_config, register
from .vit import ViTConfig, VisionTransformer

__all__ = ["create_model", "list_models", "model_config", "register", "ViTConfig", "VisionTransformer"]
