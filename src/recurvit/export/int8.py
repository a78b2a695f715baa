"""int8 step programs: onnxruntime's dynamic quantization of an ONNX step-program export, and how far the
quantized programs drift from fp32 step by step.

    from recurvit.export.int8 import quantize_model, quantize_steps, quantization_error, weight_bytes
    quantize_steps("exported/bvit-steps", "exported/bvit-steps-int8")
    quantize_model("exported/bvit.onnx", "exported/bvit-int8.onnx")   # the whole-model export, the same way
    report = quantization_error("exported/bvit-steps", "exported/bvit-steps-int8", x_test, y_test)

Dynamic quantization (``onnxruntime.quantization.quantize_dynamic``): the weights of every MatMul whose
second input is a stored weight (the linear layers: qkv, proj, the MLP, the head) are stored as int8 with
one scale per tensor (``per_channel`` for one per output column), activations are quantized on the fly per
batch; the patch embedding's convolution, LayerNorms, biases and the position embedding stay fp32 (ONNX
Runtime's ConvInteger has no int8-weight CPU kernel, and the rest is small).

A shared block applies its quantization error at every step, and a step's input is the previous step's
quantized output: :func:`quantization_error` runs the fp32 and the int8 programs each along its OWN
trajectory (what a deployment sees) and reports, after every step, the readout's max |logit difference|,
the fraction of images whose argmax differs and the relative error of the state; for a stack the step is a
block, so the same rows are the per-layer error of a ViT.

:func:`quantize_pt2e` is the same question in torch: PT2E static quantization (torchao's ``prepare_pt2e`` /
``convert_pt2e`` with the x86 inductor quantizer, ``torch.ao.quantization.quantize_pt2e`` having moved there
from torch 2.14): the model captured by ``torch.export`` (a recurrent core unrolled over its steps, every
application of the shared block observed on its own), calibrated on images the caller gives (never the test
split), int8 weights and activations in the reference representation, which runs in eager PyTorch (and fuses to
int8 kernels under ``torch.compile``).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import torch

from ..errors import UserError
from .deploy import StepProgram, batches_of
from .manifest import program_names, read_manifest, read_programs, seal

OP_TYPES = ("MatMul", "Gemm")


def weight_bytes(path: Union[str, Path]) -> Dict[str, int]:
    """Bytes of the stored weights (initializers) of an ONNX file or of a step-program folder, by element
    type ("float32", "int8", ...) and in all ("total"). A folder counts its embed, step and readout programs,
    what a runtime runs: fused programs, where the export has them, hold the step's and the readout's
    weights once more (a deployment ships the fused programs or the step and readout ones)."""
    import onnx
    from onnx import helper, numpy_helper

    path = Path(path)
    if path.is_dir():
        p = read_manifest(path)["programs"]  # its file names checked: each inside the folder
        files = [path / n for n in [p["embed"], *p["step"], *p["readout"]]]
    else:
        files = [path]
    out: Dict[str, int] = {}
    for f in files:
        for init in onnx.load(str(f)).graph.initializer:
            kind = helper.tensor_dtype_to_np_dtype(init.data_type).name
            out[kind] = out.get(kind, 0) + int(numpy_helper.to_array(init).nbytes)
    out["total"] = sum(out.values())
    return out


def quantize_steps(folder: Union[str, Path], out: Union[str, Path], per_channel: bool = False) -> Path:
    """Quantize every ONNX program of the step-program export ``folder`` into the new folder ``out`` (int8
    weights of the MatMuls, see the module docstring); its manifest records how. Written beside ``out`` and
    renamed, so ``out`` appears whole or not at all."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder, out = Path(folder), Path(out)
    manifest = read_manifest(folder)  # its file names checked: each inside the folder
    if manifest.get("backend") != "onnx":
        raise UserError(f"{folder} holds {manifest.get('backend')} programs; int8 quantization reads the ONNX "
                        "export (--format onnx --steps-program)")
    if manifest.get("quantization"):
        raise UserError(f"{folder} is already quantized ({manifest['quantization']['weight_type']})")
    if out.exists():
        raise UserError(f"{out} exists; choose another OUT")
    read_programs(folder, manifest)  # the set one export wrote: a program of another run is not quantized
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    logging.disable(logging.WARNING)  # its advice to run onnxruntime's pre-processing first, once per program
    try:
        for name in program_names(manifest):
            quantize_dynamic(str(folder / name), str(tmp / name), weight_type=QuantType.QInt8,
                             op_types_to_quantize=list(OP_TYPES), per_channel=per_channel)
        manifest["quantization"] = {"method": "onnxruntime.quantization.quantize_dynamic", "weight_type": "QInt8",
                                    "op_types": list(OP_TYPES), "per_channel": per_channel}
        seal(tmp, manifest, manifest["integrity"]["weights"])  # the int8 files' own sha256, the run's weights
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        logging.disable(logging.NOTSET)
    return out


def quantize_model(path: Union[str, Path], out: Union[str, Path], per_channel: bool = False) -> Path:
    """The whole-model ONNX file ``path`` (``recurvit export --format onnx``) with int8 MatMul weights, as
    :func:`quantize_steps` quantizes each program, written to the new file ``out``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path, out = Path(path), Path(out)
    if out.exists():
        raise UserError(f"{out} exists; choose another OUT")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", suffix=".onnx", dir=out.parent)
    os.close(fd)
    logging.disable(logging.WARNING)
    try:
        quantize_dynamic(str(path), tmp, weight_type=QuantType.QInt8, op_types_to_quantize=list(OP_TYPES),
                         per_channel=per_channel)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        logging.disable(logging.NOTSET)
    return out


@torch.no_grad()
def quantization_error(fp32, int8, images: torch.Tensor, labels: Optional[torch.Tensor] = None,
                       steps: Optional[int] = None, batch_size: int = 256, threads: Optional[int] = None) -> dict:
    """fp32 against int8 programs (folders or :class:`~recurvit.export.deploy.StepProgram` s) on ``images``,
    each along its own trajectory for K = ``steps`` (default: the trained depth) steps. Returns
    ``accuracy`` {fp32, int8} at K (with ``labels``), ``agreement`` (same argmax at K), ``weights`` (stored
    bytes of each, :func:`weight_bytes`) and ``per_step``: for k = 1..K the max and mean |logit difference|,
    ``disagreement`` (fraction of images whose argmax differs after step k) and ``state_rel_error`` (mean over
    images of ||z_int8 - z_fp32|| / ||z_fp32||)."""
    a = fp32 if isinstance(fp32, StepProgram) else StepProgram(fp32, threads=threads)
    b = int8 if isinstance(int8, StepProgram) else StepProgram(int8, threads=threads)
    K = a.check_steps(steps)
    n = len(images)
    max_abs = [0.0] * K
    sum_abs, differ, rel = [0.0] * K, [0] * K, [0.0] * K
    right = {"fp32": 0, "int8": 0}
    for i, x in enumerate(batches_of(images, batch_size)):
        sa, sb = a.embed(x), b.embed(x)
        for k in range(1, K + 1):
            sa, sb = a.step(sa, k), b.step(sb, k)
            la, lb = torch.as_tensor(a.readout(sa, k)).float(), torch.as_tensor(b.readout(sb, k)).float()
            d = (la - lb).abs()
            max_abs[k - 1] = max(max_abs[k - 1], float(d.max()))
            sum_abs[k - 1] += float(d.flatten(1).mean(1).sum())
            differ[k - 1] += int((la.argmax(-1) != lb.argmax(-1)).sum())
            za, zb = torch.as_tensor(sa["z"]).float().flatten(1), torch.as_tensor(sb["z"]).float().flatten(1)
            rel[k - 1] += float(((zb - za).norm(dim=1) / za.norm(dim=1).clamp_min(1e-12)).sum())
        if labels is not None:
            y = torch.as_tensor(labels[i * batch_size:(i + 1) * batch_size])
            right["fp32"] += int((la.argmax(-1) == y).sum())
            right["int8"] += int((lb.argmax(-1) == y).sum())
    per_step: List[dict] = [{"step": k + 1, "max_abs_logit_diff": max_abs[k], "mean_abs_logit_diff": sum_abs[k] / n,
                             "disagreement": differ[k] / n, "state_rel_error": rel[k] / n} for k in range(K)]
    out = {"steps": K, "images": n, "core": a.manifest["core"], "agreement": 1 - differ[-1] / n,
           "weights": {"fp32": weight_bytes(a.folder) if a.backend == "onnx" else None,
                       "int8": weight_bytes(b.folder)},
           "per_step": per_step}
    if labels is not None:
        out["accuracy"] = {k: v / n for k, v in right.items()}
    return out


def quantize_pt2e(model: torch.nn.Module, calibration: torch.Tensor, batch_size: int = 256) -> torch.nn.Module:
    """``model`` (eval mode, on CPU) quantized by PT2E static int8 quantization, calibrated on the images
    ``calibration`` (see the module docstring); the returned module takes the same input. Needs torchao
    (``pip install torchao``, or the ``quant`` extra): a UserError says so where it is absent."""
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    except ImportError as e:
        raise UserError(f"PT2E quantization needs torchao ({e}); pip install torchao") from None
    if len(calibration) < 2:
        raise UserError(f"PT2E calibration needs at least 2 images (one batch of 2 or more fixes a dynamic batch "
                        f"dimension), got {len(calibration)}")
    model = model.eval()
    batches = batches_of(calibration, batch_size)
    if len(batches[-1]) < 2:  # a last batch of one image would specialise the batch dimension
        batches = batches[:-2] + [torch.cat(batches[-2:])]
    dim = torch.export.Dim("batch")  # any batch size at inference
    graph = torch.export.export(model, (batches[0],), dynamic_shapes=({0: dim},)).module()
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for x in batches:  # calibration: the observers see these images only
            prepared(x)
    return convert_pt2e(prepared)


def error_table(report: dict, every: Sequence[int] = ()) -> str:
    """The per-step rows of :func:`quantization_error` as a markdown table (all steps, or those in ``every``)."""
    lines = ["| step | max abs logit diff | mean abs logit diff | argmax disagreement | state rel. error |",
             "|---|---|---|---|---|"]
    for r in report["per_step"]:
        if not every or r["step"] in every:
            lines.append(f"| {r['step']} | {r['max_abs_logit_diff']:.4f} | {r['mean_abs_logit_diff']:.4f} | "
                         f"{100 * r['disagreement']:.2f}% | {r['state_rel_error']:.4f} |")
    return "\n".join(lines)
