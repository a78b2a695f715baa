"""``import recurvit`` registers recurvit's presets in timm's registry, without importing timm.

timm finds a model only in its own registry (no plugin entry points), and importing timm (or torch)
costs seconds that ``import recurvit`` and the command line must not pay. So :func:`install`,
called by ``recurvit/__init__.py``, registers ``recurvit.models.timm_presets``

- now, when timm is already imported (torch is then loaded too), or
- right after timm's own ``__init__`` has run, via a one-shot import hook (a finder first on
  ``sys.meta_path`` that answers only for ``timm``, lets the other finders find it, and wraps the
  exec_module of that one loader); it removes itself on its first use.

So ``import recurvit; import timm; timm.create_model("bvit_small_patch16_224")`` works in either
import order. A failure to register warns and never breaks ``import timm``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

PRESETS_MODULE = "recurvit.models.timm_presets"


def register() -> None:
    """Import the module that registers the presets (timm must be importable)."""
    try:
        importlib.import_module(PRESETS_MODULE)
    except Exception as e:  # noqa: BLE001  (a broken registration must not break `import timm`)
        warnings.warn(f"recurvit could not register its models in timm: {type(e).__name__}: {e}",
                      RuntimeWarning, stacklevel=2)


class _RegisterAfterTimm(importlib.abc.MetaPathFinder):
    _busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "timm" or self._busy:
            return None
        self._busy = True  # the lookup below must not come back here
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy = False
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None or isinstance(loader, type):  # no per-module loader object to wrap
            return spec

        def exec_then_register(module):  # a probe (find_spec without import) leaves the hook in place
            uninstall()
            exec_module(module)
            register()

        try:
            loader.exec_module = exec_then_register  # this spec's own loader object only
        except AttributeError:
            pass
        return spec


def install() -> None:
    """Register now if timm is imported, else once it is (idempotent)."""
    if "timm" in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterAfterTimm) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterTimm())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegisterAfterTimm)]
