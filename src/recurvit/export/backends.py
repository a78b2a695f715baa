"""The two backends a step-program export runs on (:mod:`recurvit.export.deploy`): one program file loaded once
and called with the backend's own arrays (numpy for onnxruntime, tensors for torch.export)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch


def to_numpy(a) -> np.ndarray:
    return a.detach().numpy() if isinstance(a, torch.Tensor) else a


def take(a, idx: np.ndarray):
    return a[torch.from_numpy(idx)] if isinstance(a, torch.Tensor) else a[idx]


class OnnxProgram:
    """An ONNX program in an onnxruntime session on the CPU (``threads``: intra- and inter-op threads)."""

    def __init__(self, path: Path, inputs: Sequence[str], threads: Optional[int]):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = opts.inter_op_num_threads = int(threads)
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
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
    """A ``torch.export.save``'d program as a module."""

    def __init__(self, path: Path):
        import logging

        logging.disable(logging.WARNING)  # torch's deserializer warns about unused symbols of the step index
        try:
            self.module = torch.export.load(str(path)).module()
        finally:
            logging.disable(logging.NOTSET)

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
