"""The dense task's home (a prediction per pixel: mazes): the task (task), the maze sweep a study names in
its ``eval:`` (evaluators), its plots (plots) and what a study asks of its runs (study)."""
from .task import DenseTask, train_dense

__all__ = ["DenseTask", "train_dense"]
