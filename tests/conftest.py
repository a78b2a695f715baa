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


class gloo_group:
    """``with gloo_group(rank, world, port):`` the body runs as rank ``rank`` of a CPU process group
    (what torchrun's environment would give it), one thread; the group is destroyed after."""

    def __init__(self, rank, world, port):
        self.rank, self.world, self.port = rank, world, port

    def __enter__(self):
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world), LOCAL_RANK=str(self.rank))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world)
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        dist.destroy_process_group()
        return False
