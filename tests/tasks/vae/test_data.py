"""The LoopVAE's photo data (recurvit.tasks.vae.data): training crops and a held-out test region."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is as fast and immune to oversubscription on shared CPUs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_photo_crops_hold_out_a_fixed_test_region():
    from recurvit.tasks.vae.config import VAEDataConfig
    from recurvit.tasks.vae.data import build_vae_datasets

    train, test, info = build_vae_datasets(VAEDataConfig(img_size=16, train_crops=200), seed=3)
    assert (info.img_size, info.in_chans, info.n_train) == (16, 3, 200)
    for p, y, x, _ in train._items:  # training crops stay left of each photo's held-out columns
        assert x + 16 <= train.x_ends[p]
    assert all(x >= train.x_ends[p] for p, _, x in test._items)
    first = [train[i] for i in range(3)]
    train.set_epoch(1)
    assert not torch.equal(first[0], train[0])
    train.set_epoch(0)
    assert all(torch.equal(f, train[i]) for i, f in enumerate(first))  # a function of (seed, epoch)
    x = torch.stack([test[i] for i in range(len(test))])
    assert x.shape[1:] == (3, 16, 16) and x.min() >= -1 and x.max() <= 1
