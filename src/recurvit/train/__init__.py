"""Training machinery every task shares: the one loop (fit.py), losses (deep supervision, depth
schedules), optimizer + schedule, run directories and checkpoints (atomic save, safe load,
resume). Device, loaders and data parallelism are :mod:`recurvit.runtime`; the tasks the loop trains are :mod:`recurvit.tasks`."""
from .checkpoint import load_checkpoint, load_model, save_atomic

__all__ = ["load_model", "load_checkpoint", "save_atomic"]
