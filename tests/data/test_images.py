"""16-bit images are read as what they are (issue 57, item 4): scaled to 0..255, not clipped at 255 as PIL's
convert() does, in predict and in image-folder training and evaluation; a range no image has is one line."""
import numpy as np
import pytest
from PIL import Image

from recurvit.data.images import load_image, to_8bit
from recurvit.errors import UserError


def _digit_levels():
    return (np.arange(64).reshape(8, 8) * 4).astype(np.uint8)  # 0..252


def test_a_16_bit_png_and_tiff_read_as_their_8_bit_twin(tmp_path):
    a8 = _digit_levels()
    a16 = a8.astype(np.uint16) * 257  # the same image at 16 bits: 0..64764
    for ext in ("png", "tif"):
        Image.fromarray(a16).save(tmp_path / f"x.{ext}")
        im = Image.open(tmp_path / f"x.{ext}")
        assert im.mode.startswith("I")
        assert np.array_equal(np.asarray(to_8bit(im)), a8), ext
        assert np.array_equal(np.asarray(load_image(str(tmp_path / f"x.{ext}")))[..., 0], a8), ext
    assert np.asarray(Image.open(tmp_path / "x.png").convert("L")).max() == 255  # what PIL alone does: clipped


def test_float_images_in_the_unit_range_are_scaled_and_others_refused_in_one_line():
    f = Image.fromarray(_digit_levels().astype(np.float32) / 255.0, mode="F")
    assert np.array_equal(np.asarray(to_8bit(f)), _digit_levels())
    assert np.array_equal(np.asarray(to_8bit(Image.fromarray(_digit_levels().astype(np.float32), mode="F"))),
                          _digit_levels())  # in [0, 255]: as it is
    with pytest.raises(UserError, match=r"PIL mode F\) with values in \[0, 504\]"):
        to_8bit(Image.fromarray(_digit_levels().astype(np.float32) * 2, mode="F"))
    with pytest.raises(UserError, match=r"PIL mode I\) with values in \[-5, -5\]"):
        to_8bit(Image.fromarray(np.full((2, 2), -5, dtype=np.int32), mode="I"))
    rgb = Image.new("RGB", (2, 2), (1, 2, 3))
    assert to_8bit(rgb) is rgb


def test_predict_gives_a_16_bit_digit_the_8_bit_digits_answer(tmp_path):
    import recurvit
    from recurvit.export.predict import predict

    model = recurvit.create_model("bvit_tiny", img_size=8, patch_size=4, in_chans=1, num_classes=10, embed_dim=24,
                                  num_heads=2, steps=2)
    model.pretrained_cfg = {"recurvit_data": {"name": "digits", "pipeline": "tensor", "img_size": 8, "in_chans": 1,
                                              "mean": [0.5], "std": [0.25], "crop_pct": 1.0}}
    a8 = _digit_levels()
    Image.fromarray(a8).save(tmp_path / "eight.png")
    Image.fromarray(a8.astype(np.uint16) * 257).save(tmp_path / "sixteen.png")
    out = predict(model, [tmp_path / "eight.png", tmp_path / "sixteen.png"], topk=10)
    probs = [[prob for _, prob in p.top] for p in out]
    assert probs[0] == pytest.approx(probs[1], abs=1e-6)
