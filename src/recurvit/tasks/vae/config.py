"""Typed run configuration of `recurvit vae`: model / data / train dataclasses (OmegaConf structured
configs, YAML file + dotted overrides, as `recurvit train` does with :mod:`recurvit.config`).

    cfg = load_vae_config("recurvit/configs/vae/photos.yaml", ["train.epochs=2", "model.embed_dim=16"])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from ...config import AMP_MODES, OptimConfig, apply_overrides, as_dict, choice, load_config, to_yaml
from ...config import config_from_dict as _config_from_dict
from ...model_fields import LoopVAEFields, preset_schema


RECON = ("l1", "l2")  # reconstruction losses (vae/losses.py)


VAEModelConfig = preset_schema(
    "VAEModelConfig", LoopVAEFields, "loopvae_conv", module=__name__,
    doc="""A LoopVAE preset (loopvae_conv | loopvae_transformer | vae_unshared | vae_unshared_transformer)
    and what differs from it: every field of :class:`recurvit.model_fields.LoopVAEFields` (the fields of
    ``LoopVAEConfig``), left None to take the preset's value (img_size, in_chans: the data set's).""")


@dataclass
class VAEDataConfig:
    name: str = "photos"  # photos (scikit-learn's sample photographs) | digits | fashion_mnist | cifar10 | cifar100 | imagefolder | synthetic
    root: Optional[str] = None  # data directory (cifar, fashion_mnist, imagefolder)
    img_size: Optional[int] = None  # photos: crop size (None: 32); others: resize to this (None: native)
    num_workers: int = 0  # DataLoader workers
    hflip: Optional[bool] = None  # random horizontal flips for training (None: on for photos, data-set default otherwise)
    photo_scale: float = 0.5  # photos: resize factor applied to the photographs before cropping
    train_crops: int = 2048  # photos: random training crops drawn per epoch
    test_fraction: float = 0.25  # photos: the right-most fraction of each photograph is held out for test
    test_stride: int = 8  # photos: stride of the fixed grid of test crops in the held-out region
    max_test: Optional[int] = None  # evaluate on at most this many test images (None: all)


@dataclass
class AdversarialConfig:
    """Second training stage: a patch discriminator (hinge loss) switched on after `start_step` steps."""

    start_step: int = -1  # global training step at which the adversarial stage starts; -1: never
    weight: float = 0.1  # weight of the generator's adversarial term
    channels: int = 32  # discriminator base width
    layers: int = 2  # stride-2 conv layers (receptive field grows with each)
    lr: float = 2.0e-4  # discriminator Adam learning rate
    betas: List[float] = field(default_factory=lambda: [0.5, 0.9])


@dataclass
class VAETrainConfig(OptimConfig):  # the optimizer schema every task shares, with the VAE's defaults
    epochs: int = 10
    batch_size: int = 64
    lr: float = 2.0e-3  # peak learning rate (AdamW, warmup + cosine)
    min_lr: float = 1.0e-5
    weight_decay: float = 0.0  # not applied to norms, biases, embeddings
    warmup_epochs: float = 0.5
    betas: List[float] = field(default_factory=lambda: [0.9, 0.99])
    grad_clip: float = 1.0  # max global grad norm; 0 disables
    recon: str = choice("l1", RECON)  # l1 | l2 reconstruction loss (mean over pixels, images in [-1, 1])
    sample: bool = True  # the latent in training: a posterior sample (false: its mean, a deterministic step)
    kl_weight: float = 1.0e-4  # KL (nats summed over latent elements) is divided by the pixel values per image
    perceptual_weight: float = 0.0  # > 0: LPIPS term; needs lpips_weights and vgg_weights as local files
    lpips_weights: Optional[str] = None  # LPIPS linear layers (the lpips package's weights/v0.1/vgg.pth)
    vgg_weights: Optional[str] = None  # torchvision VGG16 ImageNet weights (vgg16-397923af.pth)
    adv: AdversarialConfig = field(default_factory=AdversarialConfig)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = choice("auto", AMP_MODES)  # auto (bf16 on CUDA, off on CPU) | bf16 | off
    threads: int = 0  # CPU threads for torch (0: torch's default)
    eval_every: int = 1  # epochs between test evaluations
    progress: bool = True  # tqdm bars
    log_every: int = 0  # > 0: a `Train: epoch [i/N]` log line every N batches (cluster logs); 0: none
    tensorboard: bool = False  # also write TensorBoard event files in RUN/tb (needs the [tb] extra)


@dataclass
class VAERunConfig:
    model: VAEModelConfig = field(default_factory=VAEModelConfig)
    data: VAEDataConfig = field(default_factory=VAEDataConfig)
    train: VAETrainConfig = field(default_factory=VAETrainConfig)


def load_vae_config(path: Optional[str | Path] = None, overrides: Optional[List[str]] = None) -> VAERunConfig:
    """Defaults <- YAML file <- dotted `key=value` overrides; returns a typed VAERunConfig."""
    return load_config(path, overrides, schema=VAERunConfig)


def config_from_dict(d: dict) -> VAERunConfig:
    """A VAERunConfig from the plain dict stored in a checkpoint."""
    return _config_from_dict(d, schema=VAERunConfig)


def default_config_path() -> str:
    """The embedded default: the packaged LoopVAE-on-photographs config."""
    from importlib.resources import files

    return str(files("recurvit") / "configs" / "vae" / "photos.yaml")


__all__ = ["VAEModelConfig", "VAEDataConfig", "AdversarialConfig", "VAETrainConfig", "VAERunConfig",
           "load_vae_config", "apply_overrides", "config_from_dict", "to_yaml", "as_dict", "default_config_path"]
