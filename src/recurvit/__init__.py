"""recurvit: recurrent-depth vision transformers.

Public API: ``create_model``, ``list_models``, ``model_config``, ``load`` / ``load_model`` (a run, an export,
or the name of a model shipped with the package: ``list_pretrained``) and the run config dataclasses.
Attributes are imported on first use (PEP 562), so ``import recurvit`` and the
command line's ``--help`` do not pay for importing torch.
"""
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("recurvit")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

_LAZY = {
    "create_model": "recurvit.models", "list_models": "recurvit.models", "model_config": "recurvit.models",
    "load_config": "recurvit.config", "ModelConfig": "recurvit.config", "DataConfig": "recurvit.config",
    "TrainConfig": "recurvit.config", "RunConfig": "recurvit.config", "predict": "recurvit.export",
    "list_pretrained": "recurvit.pretrained",
}
__all__ = ["create_model", "list_models", "load", "load_model", "model_config", "load_config", "predict",
           "list_pretrained", "ModelConfig", "DataConfig", "TrainConfig", "RunConfig", "__version__"]


def load(path, map_location="cpu", **overrides):
    """What a run directory, a checkpoint file, a folder written by ``recurvit export --format hf`` or a
    ``.safetensors`` file written by ``--format safetensors`` holds (or the model shipped as ``path``:
    ``list_pretrained()``): a :class:`recurvit.run.load.Loaded`
    (``.model`` in eval mode with its trained weights, ``.config`` its run config). ``overrides`` are core
    options to run it with (e.g. ``core="ode"``, ``method="rk4"``, ``steps=24``)."""
    from .run.load import load as _load

    return _load(path, map_location, **overrides)


def load_model(path, map_location="cpu", **overrides):
    """The classifier at ``path`` (anything :func:`load` reads), its model alone."""
    return load(path, map_location, **overrides).classifier(path).model


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'recurvit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


# timm finds models only in its own registry: register the bvit_* / srvit_* presets there once timm
# is imported (now if it is, else by a one-shot import hook), without importing timm or torch here
from . import _timm_hook  # noqa: E402

_timm_hook.install()
