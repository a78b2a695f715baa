"""Per-item and per-batch transforms (recurvit.data.transforms): MixUp / CutMix soft targets, and the in-memory
training pipeline against torchvision's, bit for bit (with its benchmark)."""
from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from recurvit.config import DataConfig
from recurvit.data import build_batch_transform
from recurvit.errors import UserError
from tests.conftest import load_script


# ---------------------------------------------------------------------------------------- MixUp / CutMix


@pytest.mark.parametrize(
    "mixup,cutmix,kind", [(0.8, 0.0, v2.MixUp), (0.0, 1.0, v2.CutMix), (0.8, 1.0, v2.RandomChoice)]
)
def test_batch_transform_soft_targets(mixup, cutmix, kind):
    mix = build_batch_transform(DataConfig(mixup_alpha=mixup, cutmix_alpha=cutmix), num_classes=7)
    assert isinstance(mix, kind)
    torch.manual_seed(0)
    images, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 7, (8,))
    for _ in range(5):
        out, targets = mix(images, labels)
        assert out.shape == images.shape and targets.shape == (8, 7)
        assert torch.allclose(targets.sum(1), torch.ones(8)) and (targets >= 0).all()


def test_batch_transform_off_and_invalid():
    assert build_batch_transform(DataConfig(), num_classes=10) is None
    with pytest.raises(UserError, match="mixup_alpha"):
        build_batch_transform(DataConfig(mixup_alpha=-0.1), num_classes=10)


@pytest.mark.parametrize("chans,size,padding,hflip", [(1, 28, 2, True), (3, 32, 4, True), (1, 8, 1, False),
                                                      (3, 16, 0, True), (1, 8, 0, False)])
def test_fast_training_pipeline_is_torchvisions_bit_for_bit(chans, size, padding, hflip):
    """The in-memory training transform gives torchvision v2's output and leaves the RNG where it does."""
    from recurvit.data.transforms import PadCropFlipNormalize, tensor_test_transform, tensor_train_transform

    mean, std = [0.29, 0.41, 0.52][:chans], [0.21, 0.26, 0.33][:chans]
    reference = v2.Compose(([v2.RandomCrop(size, padding=padding)] if padding else [])
                           + ([v2.RandomHorizontalFlip()] if hflip else [])
                           + [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    fast = tensor_train_transform(size, size, mean, std, padding, hflip, randaugment=False)
    assert isinstance(fast, PadCropFlipNormalize)
    images = torch.randint(0, 256, (300, chans, size, size), dtype=torch.uint8)
    images[:, :, 0] = 0  # a black row, where padding and image meet
    torch.manual_seed(5)
    expected = torch.stack([reference(x) for x in images]), torch.rand(3)
    torch.manual_seed(5)
    got = torch.stack([fast(x) for x in images]), torch.rand(3)
    assert torch.equal(got[0], expected[0]) and got[0].dtype == torch.float32
    assert torch.equal(got[1], expected[1])  # the same draws, in the same order
    plain = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])(images)
    if padding:  # the augmentation happened: not every image is its plain normalised self
        assert not torch.equal(got[0], plain)
    test = tensor_test_transform(size, size, mean, std)  # the evaluation pipeline: the same lookup, no draws
    assert torch.equal(torch.stack([test(x) for x in images]), plain)
    with pytest.raises(ValueError, match="expected uint8"):
        fast(images[0].float())


def test_data_pipeline_benchmark_writes_its_table(tmp_path):
    bench = load_script("benchmarks/data_pipeline.py")
    out = tmp_path / "t.md"
    assert bench.main(["--data", "digits", "--batches", "2", "--rounds", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| torchvision |" in text and "| ours |" in text and "faster per batch" in text
