"""Training: loop (train_one_epoch / evaluate), losses (deep supervision, depth schedules),
optimizer + schedule, checkpoints (atomic save, safe load, resume)."""
from .checkpoint import load_checkpoint, load_model, save_atomic
from .loop import evaluate, train, train_one_epoch

__all__ = ["train", "train_one_epoch", "evaluate", "load_model", "load_checkpoint", "save_atomic"]
