"""Data sets and transforms.

    train_set, test_set, info = build_datasets(cfg.data)      # items: (float CxHxW normalised, int label)
    mix = build_batch_transform(cfg.data, info.num_classes)  # None or (images, labels) -> (images, soft targets)
"""
from .datasets import DATASETS, DatasetInfo, TensorImageDataset, build_datasets
from .transforms import build_batch_transform

__all__ = ["DATASETS", "DatasetInfo", "TensorImageDataset", "build_datasets", "build_batch_transform"]
