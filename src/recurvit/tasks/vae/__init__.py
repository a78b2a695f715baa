"""The LoopVAE tokenizer's home (`recurvit vae train|eval|intervene|profile`): its run config (config), data
(data), losses (losses), training task (task), evaluation and metrics (evaluate, metrics: PSNR / SSIM /
LPIPS / rFID), loop interventions (interventions), runtime profile (profile), and what a study asks of its
runs (evaluators, study).

    from recurvit.tasks.vae import load_vae_config, train_vae, load_vae_run, evaluate_vae
    cfg = load_vae_config(None, ["train.epochs=2"])           # the embedded default is configs/vae/photos.yaml
    metrics = train_vae(cfg, "runs/vae-demo")                 # config.yaml, metrics.jsonl, last.pt
    model, cfg, _ = load_vae_run("runs/vae-demo")

The model itself lives in :mod:`recurvit.models.loopvae` (presets loopvae_conv, loopvae_transformer,
vae_unshared, vae_unshared_transformer).
"""
from .config import VAERunConfig, default_config_path, load_vae_config
from .data import build_vae_datasets, mean_image
from .evaluate import build_vae_model, evaluate_vae, load_vae_run, mean_image_baseline, save_grid
from .task import VAETask, train_vae

__all__ = ["VAERunConfig", "load_vae_config", "default_config_path", "build_vae_datasets", "mean_image",
           "build_vae_model", "evaluate_vae", "load_vae_run", "mean_image_baseline", "save_grid", "VAETask",
           "train_vae"]
