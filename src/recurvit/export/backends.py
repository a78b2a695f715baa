"""The two backends a step-program export runs on (:mod:`recurvit.export.deploy`): one program file loaded once
and called with the backend's own arrays (numpy for onnxruntime, tensors for torch.export). Each is made from
the bytes :func:`recurvit.export.manifest.read_programs` read and checked, never from a path."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..errors import UserError
from .archive import load_program


def to_numpy(a) -> np.ndarray:
    return a.detach().numpy() if isinstance(a, torch.Tensor) else a


def take(a, idx: np.ndarray):
    return a[torch.from_numpy(idx)] if isinstance(a, torch.Tensor) else a[idx]


class OnnxProgram:
    """An ONNX program (the bytes of its file, read and checked by :mod:`recurvit.export.manifest`; ``where``
    names it) in an onnxruntime session on the CPU (``threads``: intra- and inter-op threads). Made from the
    bytes, not the path, the session reads nothing beside them (no external data file)."""

    def __init__(self, data: bytes, where: str, inputs: Sequence[str], threads: Optional[int]):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = opts.inter_op_num_threads = int(threads)
        try:
            self.session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001  (onnxruntime's errors are several lines, of many kinds)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"{where} cannot be loaded as an ONNX program ({first[:160]}); re-export the run "
                            "(recurvit export RUN --format onnx --steps-program)") from None
        self.inputs = list(inputs)

    @staticmethod
    def native(x: torch.Tensor) -> np.ndarray:
        return np.ascontiguousarray(to_numpy(x), dtype=np.float32)

    @staticmethod
    def index(k: int) -> np.ndarray:
        return np.array(k, dtype=np.int64)

    def __call__(self, *args) -> tuple:
        return tuple(self.session.run(None, dict(zip(self.inputs, args))))


class TorchProgram:
    """A ``torch.export.save``'d program (the bytes of its file; ``where`` names it) as a module, loaded with
    nothing in the archive executed (:func:`recurvit.export.archive.load_program`)."""

    def __init__(self, data: bytes, where: str):
        self.module = load_program(data, where)

    @staticmethod
    def native(x) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32).contiguous()

    @staticmethod
    def index(k: int) -> torch.Tensor:
        return torch.tensor(k, dtype=torch.long)

    def __call__(self, *args) -> tuple:
        out = self.module(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


__all__ = ["OnnxProgram", "TorchProgram", "take", "to_numpy"]
