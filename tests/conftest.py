import os

import pytest
import torch

os.environ.setdefault("TQDM_DISABLE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# a tiny shape shared by the model tests: 16x16 RGB, 4x4 patches, width 48
TINY = dict(img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=48, num_heads=3)
