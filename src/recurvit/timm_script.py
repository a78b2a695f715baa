"""Run one of timm's own scripts with recurvit's models in timm's registry:

    python -m recurvit.timm_script PATH/TO/validate.py --model local-dir:OUT --pretrained DATA ...

timm finds a model only in its own registry. ``import recurvit`` puts recurvit's presets there
(``bvit_*``, ``srvit_*``, and the shape name of any ``recurvit export --format hf`` folder, such as
``bvit_tiny_patch4_8``) as soon as timm is imported (recurvit/_timm_hook.py), but timm's scripts
(train.py, validate.py, inference.py, onnx_export.py, ...) never import recurvit, so on their own they
stop at ``Unknown model``. This imports recurvit, then runs the script as ``python SCRIPT ARGS...``
would: as ``__main__``, with ``sys.argv = [SCRIPT, *ARGS]`` and the script's folder first on
``sys.path``. (An export of ``--format timm`` needs none of this: it is timm's own ViT.)
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import List, Optional

USAGE = "usage: python -m recurvit.timm_script SCRIPT [ARGS...]   (SCRIPT: one of timm's scripts, e.g. validate.py)"


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    script = Path(argv[0])
    if not script.is_file():
        print(f"error: {script} is not a file; give the path of one of timm's scripts (train.py, validate.py, "
              "inference.py, onnx_export.py, ...)", file=sys.stderr)
        return 2
    import recurvit  # noqa: F401  (installs the hook that registers recurvit's models when timm is imported)

    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
