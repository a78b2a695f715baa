"""LoopVAE training, evaluation and recurrence studies (`recurvit vae train|eval|intervene|profile`).

    from recurvit.vae import load_vae_config, train_vae, load_vae_run, evaluate_vae
    cfg = load_vae_config(None, ["train.epochs=2"])           # the embedded default is configs/vae/photos.yaml
    metrics = train_vae(cfg, "runs/vae-demo")                 # config.yaml, metrics.jsonl, last.pt
    model, cfg, _ = load_vae_run("runs/vae-demo")

The model itself lives in :mod:`recurvit.models.loopvae` (presets loopvae_conv, loopvae_transformer,
vae_unshared, vae_unshared_transformer).
"""
from .config import VAERunConfig, default_config_path, load_vae_config
from .data import build_vae_datasets, mean_image
from .evaluate import build_vae_model, evaluate_vae, load_vae_run, mean_image_baseline, save_grid
from .train import train_vae

__all__ = ["VAERunConfig", "load_vae_config", "default_config_path", "build_vae_datasets", "mean_image",
           "build_vae_model", "evaluate_vae", "load_vae_run", "mean_image_baseline", "save_grid", "train_vae"]
