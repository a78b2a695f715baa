"""Classification's home: the task ``recurvit train`` trains (task), the evaluators a study names in its
``eval:`` (evaluators), what a study asks of its runs (study), and fine-tuning, which is classification
after a model-preparation step (finetune: new heads, frozen weights or LoRA / step-LoRA adapters;
finetune_study: a study that fine-tunes another study's runs)."""
from .task import ClassifyTask, evaluate, train, train_one_epoch

__all__ = ["ClassifyTask", "evaluate", "train", "train_one_epoch"]
