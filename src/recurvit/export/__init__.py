"""A trained run's life after training: predictions for your own images (``predict``; ``predict_run``: what
``recurvit predict`` writes), the Hugging Face / timm folder and safetensors (``hf``), programs (``program``:
torch.export, ONNX), and the one export in the format asked that ``recurvit export`` makes (``export_run``).
What a run needs to preprocess an image is the checkpoint's record, :mod:`recurvit.run.preprocessing`."""
from .predict import Prediction, predict, read_images

__all__ = ["predict", "read_images", "Prediction"]
