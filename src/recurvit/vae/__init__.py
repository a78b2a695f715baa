"""LoopVAE data, evaluation and recurrence studies (`recurvit vae train|eval|intervene|profile`);
its training is the task :mod:`recurvit.tasks.vae` (``train_vae`` is re-exported here).

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


def __getattr__(name):  # train_vae on first use: recurvit.tasks.vae itself imports this package's modules
    if name == "train_vae":
        from ..tasks.vae import train_vae

        return train_vae
    raise AttributeError(f"module 'recurvit.vae' has no attribute {name!r}")


__all__ = ["VAERunConfig", "load_vae_config", "default_config_path", "build_vae_datasets", "mean_image",
           "build_vae_model", "evaluate_vae", "load_vae_run", "mean_image_baseline", "save_grid", "train_vae"]
