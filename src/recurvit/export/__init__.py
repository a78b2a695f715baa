"""A trained run's life after training: what it needs to preprocess an image (``preprocessing``), and
predictions for your own images (``predict``)."""
from .predict import Prediction, predict, read_images
from .preprocessing import data_record, pretrained_cfg, preprocessing_of

__all__ = ["predict", "read_images", "Prediction", "data_record", "pretrained_cfg", "preprocessing_of"]
