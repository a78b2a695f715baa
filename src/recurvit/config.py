"""Typed run configuration: model / data / train dataclasses, loaded from YAML with dotted overrides.

OmegaConf structured configs give type checking and `a.b=c` overrides; the resolved config is
written into every run directory and is what `recurvit train --resume` reads back.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, List, Optional

import yaml
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .config_names import find_config
from .errors import UserError
from .model_fields import ViTFields, options_field, preset_schema


AMP_MODES = ("auto", "bf16", "off")
WEIGHTINGS = ("uniform", "linear", "last")  # deep-supervision weights over the stages (train/losses.py)
SCHEDULES = ("fixed", "uniform", "poisson_lognormal")  # per-batch depth schedules (train/losses.py)
OPTIMIZERS = ("adamw", "adam_l2")  # train/optim.py
LR_SCHEDULES = ("cosine", "step")
WARMUPS = ("linear", "exponential")
LOSS_MASKS = ("all", "open")  # the dense task's pixels the loss averages over
SOLVED = ("strict", "open")  # the dense task's solved figure that chooses best.pt


def choice(default: str, choices: tuple) -> Any:
    """A string field that takes one of ``choices``: declared once, on the field, and checked for every
    config when it is loaded (:func:`check_choices`), whatever schema it belongs to."""
    return field(default=default, metadata={"choices": tuple(choices)})


def check_choices(cfg: Any, prefix: str = "") -> None:
    """UserError naming the key for a field whose value is not one of its declared choices, or not in its
    declared range (``recurvit.model_fields.bounded``: ``model.init_values=nan`` is refused here, before a run
    trains on it). None, "not set", passes."""
    if not is_dataclass(cfg):
        return
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        allowed = f.metadata.get("choices")
        if allowed is not None and value not in allowed:
            raise UserError(f"bad config: {prefix}{f.name} must be one of {', '.join(allowed)}, got '{value}'")
        bounds = f.metadata.get("range")
        if bounds is not None and value is not None and not bounds.holds(value):
            raise UserError(f"bad config: {prefix}{f.name} must be {bounds}, got {value}")
        check_choices(value, f"{prefix}{f.name}.")


ModelConfig = preset_schema(
    "ModelConfig", ViTFields, "bvit_tiny", module=__name__, extra=[options_field()],
    doc="""The model of a run: a registry preset (``name``) and what differs from it. Every field of
    :class:`recurvit.model_fields.ViTFields` (the fields of ``ViTConfig``), left None to take the
    preset's value (img_size, in_chans and num_classes: the data set's). ``options`` holds the core's
    own options (see the core's Options in recurvit/models/cores/); in YAML and overrides they may also
    be written flat (``model.method: rk4`` is ``model.options.method: rk4``).""")


@dataclass
class DataConfig:
    name: str = "digits"  # digits | fashion_mnist | cifar10 | cifar100 | imagefolder | synthetic | mazes
    root: Optional[str] = None  # data directory; None: the data set's default location
    img_size: Optional[int] = None  # resize to this size; None: native size
    num_workers: int = 0  # DataLoader workers
    crop_padding: Optional[int] = None  # random-crop padding in pixels; None: data-set default, 0: off
    hflip: Optional[bool] = None  # random horizontal flip; None: data-set default (off for digits)
    randaugment: bool = False  # torchvision RandAugment (uint8 images)
    mixup_alpha: float = 0.0  # >0 enables MixUp on batches
    cutmix_alpha: float = 0.0  # >0 enables CutMix on batches
    # imagefolder: False: an unreadable image stops the run with its path; True: images PIL cannot open
    # or verify are left out when the data set is built (the count is reported)
    skip_bad_images: bool = False
    # imagefolder: False: a symlink under data.root that points outside it is refused (with its name);
    # True: such links are followed. A symlink loop is an error either way
    follow_symlinks: bool = False
    holdout: float = 0.0  # fraction of the training split kept out of training (seeded): calibration data
    # synthetic data set (tests and benchmarks)
    synthetic_train: int = 256
    synthetic_test: int = 64
    synthetic_classes: int = 10
    synthetic_size: int = 32
    synthetic_chans: int = 3
    # mazes, generated in-process (data/mazes.py; easy-to-hard format: a size-s maze is a (2s + 6)-pixel RGB image)
    maze_size: int = 9  # training (and validation) size, odd >= 3: 9 = 5 x 5 cells, 24 pixels
    maze_test_sizes: List[int] = field(default_factory=lambda: [9, 13, 17, 21, 25, 29, 33])  # evaluated sizes
    maze_train: int = 50000  # training mazes (DeepThinking trains on 50,000 9x9 mazes)
    maze_val: int = 2000  # validation mazes at the training size, none of them a training maze
    maze_test: int = 1000  # test mazes at each test size
    maze_seed: int = 0  # seed of the generator (independent of the run seed: every run sees the same mazes)


@dataclass
class SupervisionConfig:
    """Stage-wise deep supervision. stages=1 with weights=last is plain training."""

    stages: int = 1  # number of equally spaced readouts over the trained steps
    weights: str = choice("last", WEIGHTINGS)  # uniform | linear | last
    per_stage_heads: bool = False  # a head per stage instead of one shared head


@dataclass
class DepthConfig:
    """Per-batch depth schedule."""

    schedule: str = choice("fixed", SCHEDULES)  # fixed | uniform | poisson_lognormal
    min_steps: int = 1  # uniform: lower bound
    max_steps: Optional[int] = None  # uniform: upper bound (None: 2 x nominal)
    sigma: float = 0.5  # poisson_lognormal: log-normal spread
    truncate: int = 0  # >0: backpropagate only through the last k steps
    # Bansal et al.'s progressive loss weight alpha (dense task; 0: off): loss = (1 - alpha) * the drawn depth's
    # loss + alpha * the loss after n ~ U{0..K-1} steps without gradient and k ~ U{1..K-n} steps with it
    progressive: float = 0.0
    # dense task: the probability that a training batch starts its recurrence from Gaussian noise (scaled to the
    # embedding's RMS) instead of the embedded input, the input entering through re-injection (model.reinject):
    # path independence, Anil et al. 2022 (a model that reaches the same fixed point from any start); 0: off
    random_start: float = 0.0


@dataclass
class OptimConfig:
    """The optimizer and schedule every task trains with (by default AdamW, linear warmup, cosine to
    ``min_lr``; DeepThinking's recipe: ``optimizer=adam_l2 warmup=exponential lr_schedule=step
    lr_throttle=true grad_clip=0``; train/optim.py): one schema, each task's ``train`` section derives
    from it with its own defaults."""

    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3  # peak learning rate
    min_lr: float = 1e-5  # cosine floor
    weight_decay: float = 0.05  # not applied to norms, biases, embeddings
    warmup_epochs: float = 1.0
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0  # max global grad norm; 0 disables
    # adamw: decay decoupled from the gradient (Loshchilov & Hutter); adam_l2: torch.optim.Adam, weight_decay
    # added to the gradient as an L2 term and rescaled by Adam's moments (DeepThinking's "adam")
    optimizer: str = choice("adamw", OPTIMIZERS)
    # linear: lr ramps per iteration over warmup_epochs; exponential: DeepThinking's, set once an epoch:
    # epoch e (from 0) trains at lr * (1 - exp(-(e + 1) / warmup_epochs)), at lr once e + 1 >= warmup_epochs
    warmup: str = choice("linear", WARMUPS)
    # cosine: to min_lr at the last iteration; step: lr * lr_factor ** (milestones passed), a milestone an
    # epoch index of lr_milestones (torch's MultiStepLR stepped once an epoch)
    lr_schedule: str = choice("cosine", LR_SCHEDULES)
    lr_milestones: List[int] = field(default_factory=list)
    lr_factor: float = 0.1
    block_lr_scale: float = 1.0  # lr multiplier of the core's blocks (a recurrent core's ONE shared block)
    # DeepThinking's lr_throttle: the core's blocks train at lr / T (T the trained depth); x block_lr_scale
    lr_throttle: bool = False


@dataclass
class TrainConfig(OptimConfig):
    label_smoothing: float = 0.0
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = choice("auto", AMP_MODES)  # auto (bf16 on CUDA, off on CPU) | bf16 | off
    eval_every: int = 1  # epochs between test evaluations
    compile: bool = False
    activation_checkpointing: bool = False
    progress: bool = True  # tqdm bars on a terminal; in a pipe or log, a progress line every minute
    log_every: int = 0  # > 0: a `Train: epoch [i/N]` log line every N batches (cluster logs); 0: none
    tensorboard: bool = False  # also write TensorBoard event files in RUN/tb (needs the [tb] extra)
    keep_every: int = 0  # > 0: also keep the model of every N-th epoch as epoch_NNNN.pt (a budget curve); 0: none
    supervision: SupervisionConfig = field(default_factory=SupervisionConfig)
    depth: DepthConfig = field(default_factory=DepthConfig)
    # the dense task (mazes): all: the loss averages over every pixel; open: over the pixels whose input's
    # brightest channel is > 0 (DeepThinking's mazes mask: walls and frame left out)
    loss_mask: str = choice("all", LOSS_MASKS)
    # the dense task's solved figure that chooses best.pt: strict, every pixel right; open, DeepThinking's
    # (its predictions on walls zeroed: every open pixel right). Both are reported
    solved: str = choice("strict", SOLVED)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


MAX_CONFIG = 1 << 20  # bytes: a config is a YAML file of a few KB (a 200 MB one parsed for 90 s into MemoryError)


def _fail(exc: Exception, where: str) -> UserError:
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    problem = getattr(exc, "problem", None)  # yaml's own words ("found duplicate key ..."), not its context
    if isinstance(problem, str) and problem:
        mark = getattr(exc, "problem_mark", None)
        msg = problem + (f" (line {mark.line + 1})" if mark is not None else "")
    msg = msg[:240]
    key = getattr(exc, "full_key", None)  # OmegaConf names the offending key
    return UserError(f"bad config ({where}){f' {key}' if key else ''}: {msg}")


def _option_keys(schema: type) -> Optional[set]:
    """Field names of ``schema.model`` when it nests core options under ``options`` (else None)."""
    model = next((f for f in fields(schema) if f.name == "model"), None) if is_dataclass(schema) else None
    model_cls = model.default_factory if model is not None and callable(model.default_factory) else None
    names = {f.name for f in fields(model_cls)} if model_cls is not None and is_dataclass(model_cls) else set()
    return names if "options" in names else None


def nest_options(raw: Any, schema: type = RunConfig) -> Any:
    """A plain config mapping with flat core options under ``model`` moved to ``model.options``
    (None values dropped: they mean "not set"). Other schemas pass through unchanged."""
    known = _option_keys(schema)
    if known is None or not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        return raw
    model = dict(raw["model"])
    opts = dict(model.pop("options", None) or {})
    for key in [k for k in model if k not in known]:
        value = model.pop(key)
        if value is not None:
            opts[key] = value
    return {**raw, "model": {**model, "options": opts}}


def _nest_override(item: str, schema: type) -> str:
    known = _option_keys(schema)
    key, sep, value = item.partition("=")
    if known is None or not sep or not key.startswith("model.") or key.count(".") != 1:
        return item
    name = key.split(".", 1)[1]
    return item if name in known else f"model.options.{name}={value}"


def load_config(path: Optional[str | Path] = None, overrides: Optional[List[str]] = None,
                schema: type = RunConfig) -> Any:
    """Defaults of ``schema`` <- YAML file <- dotted `key=value` overrides; returns a typed ``schema``.
    ``path`` is a file or a packaged config's name (``digits/bvit``; recurvit.config_names)."""
    cfg = OmegaConf.structured(schema)
    if path is not None:
        p = find_config(path)
        if Path(p).is_file() and Path(p).stat().st_size > MAX_CONFIG:
            raise UserError(f"bad config ({p}): {Path(p).stat().st_size:,} bytes; a config is a YAML file of a few KB")
        try:
            raw = OmegaConf.to_container(OmegaConf.load(p))
            cfg = OmegaConf.merge(cfg, nest_options(raw, schema))
        except RecursionError:
            raise UserError(f"bad config ({p}): nested too deeply to be a config") from None
        except Exception as e:  # OmegaConf type/key errors and YAML syntax errors
            raise _fail(e, str(p)) from None
    return _merge_overrides(cfg, overrides, schema)


def apply_overrides(cfg: Any, overrides: Optional[List[str]]) -> Any:
    """A typed config with dotted ``key=value`` overrides applied."""
    return _merge_overrides(OmegaConf.structured(cfg), overrides, type(cfg)) if overrides else cfg


def config_from_dict(d: dict, schema: type = RunConfig) -> Any:
    """A typed ``schema`` from the plain dict stored in a checkpoint (flat core options of older
    checkpoints are nested under ``model.options``)."""
    try:
        return to_object(OmegaConf.merge(OmegaConf.structured(schema), nest_options(d, schema)))
    except OmegaConfBaseException as e:
        raise _fail(e, "checkpoint") from None


BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0")


def _merge_overrides(cfg: Any, overrides: Optional[List[str]], schema: type = RunConfig) -> Any:
    for ov in overrides or []:
        if "=" not in ov:
            raise UserError(f"override '{ov}' is not of the form key=value (e.g. train.epochs=5)")
    overrides = [_nest_override(ov, schema) for ov in overrides or []]
    for ov in overrides:  # OmegaConf reads any integer as a bool (model.class_token=2 -> true): say no instead
        key, _, value = ov.partition("=")
        try:
            current = OmegaConf.select(cfg, key, throw_on_missing=False)
        except OmegaConfBaseException:
            continue
        if isinstance(current, bool) and value.strip().lower() not in BOOL_WORDS:
            raise UserError(f"{key} is true or false, got {value!r}")
    if overrides:
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        except (OmegaConfBaseException, ValueError, TypeError, yaml.YAMLError) as e:  # YAML: a !!python tag
            raise _fail(e, "overrides") from None
    return to_object(cfg)


def to_object(cfg: Any) -> Any:
    try:
        obj = OmegaConf.to_object(cfg)
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise _fail(e, "values") from None
    check_choices(obj)
    return obj


def to_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def as_dict(cfg: Any) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


__all__ = [
    "ModelConfig", "DataConfig", "OptimConfig", "TrainConfig", "choice", "check_choices", "SupervisionConfig", "DepthConfig", "RunConfig",
    "load_config", "apply_overrides", "config_from_dict", "to_yaml", "as_dict", "MISSING",
]
