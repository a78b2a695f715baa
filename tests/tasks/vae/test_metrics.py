"""LoopVAE metrics against the implementations people cite: LPIPS against the lpips package on the
same (random, seeded) backbone and the package's own linear layers, PSNR / SSIM against
scikit-image. Nothing is downloaded: the backbones are random weights saved to local files."""
import math
import sys
import warnings

import numpy as np
import pytest
import torch

from recurvit.errors import UserError
from recurvit.tasks.vae.metrics import LPIPS, lpips_package_weights, psnr, ssim

LPIPS_TOL = 1e-6  # absolute, on distances of about 0.01-0.02 from the random backbones (measured: 0)
SSIM_TOL = PSNR_TOL = 1e-4


# ------------------------------------------------------------------------------------ LPIPS
@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    """net -> (path, state): torchvision-layout ``features.*`` of a seeded random VGG16 / AlexNet."""
    from recurvit.tasks.vae.metrics import _torchvision_features

    made = {}

    def get(net):
        if net not in made:
            torch.manual_seed({"vgg": 1, "alex": 2}[net])
            state = {f"features.{k}": v for k, v in _torchvision_features(net).state_dict().items()}
            path = tmp_path_factory.mktemp("weights") / f"{net}_random.pth"
            torch.save(state, path)
            made[net] = (str(path), state)
        return made[net]

    return get


@pytest.fixture(scope="module")
def lin_file(tmp_path_factory):
    """The lpips wheel's v0.1 VGG16 linear layers, or (package not installed) random ones."""
    wheel = lpips_package_weights("vgg")
    if wheel is not None:
        return str(wheel)
    torch.manual_seed(4)
    path = tmp_path_factory.mktemp("weights") / "lin_random.pth"
    torch.save({f"lin{i}.model.1.weight": torch.rand(1, c, 1, 1) for i, c in enumerate((64, 128, 256, 512, 512))},
               path)
    return str(path)


def _package_lpips(net, state):
    """The lpips package's own network: trunk built random (pnet_rand), our backbone weights copied
    in, linear layers loaded by the package itself from its wheel (pretrained=True, model_path=None)."""
    lpips = pytest.importorskip("lpips")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torchvision: `pretrained` is deprecated
        ref = lpips.LPIPS(net=net, version="0.1", lpips=True, pretrained=True, pnet_rand=True, verbose=False)
    with torch.no_grad():
        for s in ref.net.children():
            for idx, m in s.named_children():
                for name, p in m.named_parameters():
                    p.copy_(state[f"features.{idx}.{name}"])
    return ref.eval()


def _images(seed, shape):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g) * 2 - 1
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, shape[-2]), torch.linspace(-1, 1, shape[-1]), indexing="ij")
    smooth = torch.stack([torch.sin(3 * xx + c) * torch.cos(2 * yy - c) for c in range(shape[1])])
    x[: shape[0] // 2] = smooth  # half structured, half noise
    y = (x + 0.2 * torch.randn(shape, generator=g)).clamp(-1, 1)
    return x, y


@pytest.mark.slow
@pytest.mark.parametrize("net", ["vgg", "alex"])
def test_lpips_agrees_with_the_lpips_package(net, backbone):
    pytest.importorskip("lpips")
    path, state = backbone(net)
    ref = _package_lpips(net, state)
    ours = LPIPS(path, net=net, impl="recurvit")  # hand-written; linear layers from the wheel's file
    wrapped = LPIPS(path, net=net)  # auto: the package is installed, so it runs lpips.LPIPS
    assert (ours.impl, wrapped.impl) == ("recurvit", "lpips")
    for i, lin in enumerate(ours.lins):
        assert torch.equal(lin.weight, ref.lins[i].model[-1].weight)

    x, y = _images(0, (4, 3, 32, 32))
    with torch.no_grad():
        d_ref = ref(x, y).flatten()
        d_ours, d_wrapped = ours(x, y), wrapped(x, y)
        assert d_ours.shape == (4,) and (d_ref > 0).all()
        assert (d_ours - d_ref).abs().max() < LPIPS_TOL
        assert (d_wrapped - d_ref).abs().max() < LPIPS_TOL
        # input range: ours take [-1, 1]; the package's normalize=True takes [0, 1]
        a, b = (x + 1) / 2, (y + 1) / 2
        assert (ours(2 * a - 1, 2 * b - 1) - ref(a, b, normalize=True).flatten()).abs().max() < LPIPS_TOL
        # grayscale is repeated to RGB
        assert (ours(x[:, :1], y[:, :1]) - ref(x[:, :1].expand(-1, 3, -1, -1),
                                                y[:, :1].expand(-1, 3, -1, -1)).flatten()).abs().max() < LPIPS_TOL
        assert torch.equal(ours(x, x), torch.zeros(4)) and torch.equal(wrapped(x, x), torch.zeros(4))


@pytest.mark.slow
def test_lpips_is_a_fixed_metric_that_passes_input_gradients(backbone, lin_file):
    path, _ = backbone("vgg")
    for impl in ("recurvit", "lpips") if lpips_package_weights() else ("recurvit",):
        m = LPIPS(path, lin_file, impl=impl)
        m.train()
        assert not m.training and not any(mod.training for mod in m.modules())
        assert not any(p.requires_grad for p in m.parameters())
        x, y = _images(1, (2, 3, 16, 16))
        x.requires_grad_(True)
        m(x, y).sum().backward()
        assert x.grad is not None and x.grad.abs().sum() > 0
        with pytest.raises(UserError, match="at least 16 x 16"):
            m(x[..., :8, :8], y[..., :8, :8])


def test_lpips_without_the_package_falls_back_and_needs_the_linear_file(backbone, lin_file, monkeypatch):
    path, _ = backbone("vgg")
    monkeypatch.setitem(sys.modules, "lpips", None)  # `import lpips` now fails
    with pytest.raises(UserError, match="--lpips-weights"):
        LPIPS(path, None)
    with pytest.raises(UserError, match="lpips package"):
        LPIPS(path, None, impl="lpips")
    with pytest.raises(UserError, match="--vgg-weights"):
        LPIPS(None, None)
    m = LPIPS(path, lin_file)
    assert m.impl == "recurvit"
    x, y = _images(5, (2, 3, 16, 16))
    assert m(x, y).shape == (2,) and torch.equal(m(x, x), torch.zeros(2))


@pytest.mark.slow
def test_lpips_rejects_wrong_files(backbone, tmp_path):
    pytest.importorskip("lpips")
    path, _ = backbone("vgg")
    with pytest.raises(UserError, match="VGG16"):
        LPIPS(backbone("alex")[0])  # an AlexNet file where VGG16 is expected
    with pytest.raises(UserError, match="lpips v0.1 VGG16 file"):
        LPIPS(path, str(lpips_package_weights("alex")))
    bad = tmp_path / "x.pth"
    bad.write_text("not torch")
    with pytest.raises(UserError, match="cannot read"):
        LPIPS(path, str(bad))


# ----------------------------------------------------------------------------- PSNR / SSIM
def _pairs():
    """(name, a, b) image batches in [0, 1], float64: noise and structured images with distortions."""
    g = torch.Generator().manual_seed(3)
    out = []
    for shape in [(3, 3, 32, 32), (2, 1, 24, 20), (2, 3, 8, 8)]:  # 8 x 8: the digits size, 7 x 7 window
        a = torch.rand(shape, generator=g, dtype=torch.float64)
        out.append((f"noise{shape}", a, (a + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)).clamp(0, 1)))
        H, W = shape[-2:]
        yy, xx = torch.meshgrid(torch.linspace(0, 1, H, dtype=torch.float64),
                                torch.linspace(0, 1, W, dtype=torch.float64), indexing="ij")
        scene = torch.stack([0.5 + 0.4 * torch.sin(6 * xx + 2 * c) * torch.cos(4 * yy)
                             + 0.1 * ((xx * 4).floor() % 2) for c in range(shape[1])])
        s = scene.expand(shape).clone()
        s[1] = (s[1] > 0.5).double()  # a hard-edged image
        blur = torch.nn.functional.avg_pool2d(s, 3, 1, 1, count_include_pad=False)
        out.append((f"blur{shape}", s, blur))
        out.append((f"shift{shape}", s, torch.roll(s, 1, dims=-1)))
        out.append((f"contrast{shape}", s, 0.5 + 0.6 * (s - 0.5)))
        out.append((f"quantised{shape}", s, (s * 10.3).round() / 10.3))
    return out


def _sk_ssim(a, b, data_range=1.0):
    from skimage.metrics import structural_similarity

    win = min(11, *a.shape[-2:])
    win -= 1 - win % 2
    kw = dict(gaussian_weights=True, sigma=1.5 * win / 11, use_sample_covariance=False, data_range=data_range)
    if a.shape[0] == 1:
        return structural_similarity(a[0], b[0], **kw)
    return structural_similarity(a, b, channel_axis=0, **kw)


def test_ssim_and_psnr_agree_with_scikit_image():
    pytest.importorskip("skimage")
    from skimage.metrics import peak_signal_noise_ratio

    worst_ssim = worst_psnr = 0.0
    for name, a, b in _pairs():
        for data_range in (1.0, 255.0):
            A, B = a * data_range, b * data_range
            batched_s, batched_p = ssim(A, B, data_range=data_range), psnr(A, B, data_range=data_range)
            for i in range(len(a)):
                ref_s = _sk_ssim(A[i].numpy(), B[i].numpy(), data_range)
                ref_p = peak_signal_noise_ratio(A[i].numpy(), B[i].numpy(), data_range=data_range)
                one_s = ssim(A[i:i + 1], B[i:i + 1], data_range=data_range)[0]
                one_p = psnr(A[i:i + 1], B[i:i + 1], data_range=data_range)[0]
                for ours, ref in ((batched_s[i], ref_s), (one_s, ref_s)):
                    worst_ssim = max(worst_ssim, abs(ours.item() - ref))
                    assert abs(ours.item() - ref) < SSIM_TOL, (name, data_range, i)
                for ours, ref in ((batched_p[i], ref_p), (one_p, ref_p)):
                    worst_psnr = max(worst_psnr, abs(ours.item() - ref))
                    assert abs(ours.item() - ref) < PSNR_TOL, (name, data_range, i)
            # float32 images (as in evaluation) give the same figures
            assert torch.allclose(ssim(A.float(), B.float(), data_range=data_range).double(), batched_s.double(),
                                  atol=SSIM_TOL)
    print(f"max |ssim - skimage| {worst_ssim:.2e}, max |psnr - skimage| {worst_psnr:.2e} dB")


def test_identities():
    for _, a, _ in _pairs():
        assert torch.equal(ssim(a, a), torch.ones(len(a)))
        assert torch.allclose(psnr(a, a), torch.full((len(a),), 120.0))  # the documented cap, not inf
        assert torch.allclose(psnr(a * 255, a * 255, data_range=255.0),
                              torch.full((len(a),), 120.0 + 20 * math.log10(255)))
    flat = torch.full((2, 3, 16, 16), 0.3)
    assert torch.equal(ssim(flat, flat), torch.ones(2))
    assert np.isfinite(psnr(flat, flat).numpy()).all()


# ------------------------------------------------- PSNR / SSIM against the formulas written out (Wang et al.)
def test_psnr_and_ssim_against_references():
    from scipy.signal import convolve2d

    from recurvit.tasks.vae.metrics import psnr, ssim

    g = torch.Generator().manual_seed(1)
    a = torch.rand(2, 3, 24, 24, generator=g, dtype=torch.float64)
    b = (a + 0.1 * torch.randn(2, 3, 24, 24, generator=g, dtype=torch.float64)).clamp(0, 1)
    mse = ((a - b) ** 2).flatten(1).mean(1)
    assert torch.allclose(psnr(a, b).double(), 10 * torch.log10(1 / mse), atol=1e-4)
    assert torch.allclose(ssim(a, a), torch.ones(2))

    r = np.arange(11) - 5.0  # Wang et al.: 11x11 Gaussian window, sigma 1.5, 'valid' positions
    w = np.exp(-r ** 2 / 4.5)
    w = np.outer(w, w) / np.outer(w, w).sum()

    def ref(x, y):
        f = lambda t: convolve2d(t, w, mode="valid")  # noqa: E731
        mx, my = f(x), f(y)
        sxx, syy, sxy = f(x * x) - mx ** 2, f(y * y) - my ** 2, f(x * y) - mx * my
        c1, c2 = 0.01 ** 2, 0.03 ** 2
        return (((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (sxx + syy + c2))).mean()

    expected = [np.mean([ref(a[i, c].numpy(), b[i, c].numpy()) for c in range(3)]) for i in range(2)]
    assert np.allclose(ssim(a, b).numpy(), expected, atol=1e-5)
