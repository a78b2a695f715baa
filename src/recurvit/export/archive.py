"""A ``torch.export`` archive (``.pt2``) read with nothing it says executed.

``torch.export.load`` runs what an archive asks it to (torch 2.14: torch/export/pt2_archive/_package.py,
torch/_export/serde/serialize.py, torch/export/_unlift.py): it unpickles a weight or constant whose payload
config marks it ``use_pickle`` (``torch.load(..., weights_only=False)``), an opaque constant (``pickle.loads``),
a custom-object constant and a legacy ``.pt`` weights file; it reads the sample inputs with the safe unpickler
and, when that refuses them, AGAIN with the unsafe one; it loads the compiled libraries of an AOTInductor
folder; it gives every symbolic size's expression to ``sympy.sympify`` (an ``eval`` that sees Python's
builtins); and ``.module()`` ``exec``s the program's input guards (``guards_code``) as source text. Each of
these runs a doctored archive's code on load (tests/export/test_step_program_safety.py builds one of each).

So :func:`load_program` reads an archive only when it is what ``torch.export.save`` writes for a step program
(:mod:`recurvit.export.steps`), and refuses anything else in one line, before torch sees it:

- its members: one root folder holding the archive's version and format, ``models/model.json``, the sample
  inputs, the weights and constants configs and raw tensor files (``weight_N``, ``tensor_N``), each named once
  and stored uncompressed (as torch writes them: the bytes read are the bytes on disk);
- every payload raw (``use_pickle`` false), every constant a raw tensor, the sample inputs what the safe
  (weights-only) unpickler reads;
- in ``models/model.json``: every operator an ATen op (or a listed higher-order op, or symbolic-int
  arithmetic of ``_operator`` / ``math``), every symbolic expression a sympy expression of symbols, integers
  and the listed functions (checked on its Python syntax tree: no attribute, no other name, no string but a
  symbol's name), every guard a comparison of input sizes (``L['inputs'][0].size()[0] == ...``), no custom
  object;

and then loads it with ``torch.load`` forced to ``weights_only`` (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``), so that
no unpickling but the safe one happens whatever the checks above would miss. An archive that a newer torch
writes differently is refused the same way (re-export it with the torch that reads it).
"""
from __future__ import annotations

import ast
import io
import json
import logging
import os
import re
import threading
import zipfile
from typing import Any, Iterator, Tuple

import torch

from ..errors import UserError

MEMBERS = re.compile(r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id|"
                     r"models/model\.json|data/sample_inputs/model\.pt|data/weights/model_weights_config\.json|"
                     r"data/weights/weight_\d+|data/constants/model_constants_config\.json|data/constants/tensor_\d+")
PAYLOADS = {"data/weights/model_weights_config.json": "weight_", "data/constants/model_constants_config.json": "tensor_"}
OPERATOR = re.compile(r"torch\.ops\.aten\.\w+\.\w+|torch\.ops\.higher_order\.(wrap_with_autocast|"
                      r"wrap_with_set_grad_enabled)|_operator\.(add|sub|mul|floordiv|truediv|mod|neg|pos|abs|eq|ne|"
                      r"lt|le|gt|ge|and_|or_|not_|getitem)|math\.(ceil|floor|trunc|sqrt)|torch\.sym_(max|min|float|"
                      r"int|not|sqrt|ite|sum)")
SYMBOL = re.compile(r"[a-z]{1,4}\d+")  # a symbolic size (s21, u0)
SYMPY = {"Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Max", "Min", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
         "And", "Or", "Not", "Abs", "FloorDiv", "ModularIndexing", "CleanDiv", "CeilDiv", "Mod", "PythonMod",
         "Where", "FloorToInt", "CeilToInt", "TruncToInt", "TruncToFloat", "RoundToInt", "IntTrueDiv", "ToFloat",
         "Identity"}
ASSUMPTIONS = {"integer", "positive", "nonnegative", "negative", "nonpositive", "real", "finite", "zero",
               "nonzero", "rational", "extended_real"}
SIZES = {"size", "stride", "storage_offset", "dim", "numel"}  # what a guard may ask of an input
ARITH = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr)
COMPARE = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
EXPR_CHARS = re.compile(r"[\w'(), .=+\-*/%<>!&|~]{1,4000}")  # no newline, comment, quote but ', backslash
GUARD_CHARS = re.compile(r"[\w\[\]'() .=+\-*/%<>!]{1,4000}")
_LOCK = threading.Lock()  # the weights-only switch is an environment variable: one load at a time


def _refuse(where: str, what: str) -> UserError:
    return UserError(f"{where} is not a step program as recurvit writes it ({what[:160]}); nothing in it was run: "
                     "re-export the run (recurvit export RUN --format torch-export --steps-program)")


def _sympy_ok(node: ast.AST) -> bool:
    """Whether a parsed symbolic expression holds only symbols, numbers, the listed sympy functions (their
    assumptions as keywords) and arithmetic or comparison."""
    if isinstance(node, ast.Expression):
        return _sympy_ok(node.body)
    if isinstance(node, ast.Constant):
        v = node.value
        return type(v) in (int, float, bool) or (isinstance(v, str) and SYMBOL.fullmatch(v) is not None)
    if isinstance(node, ast.Name):
        return node.id in SYMPY or SYMBOL.fullmatch(node.id) is not None
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Name) and node.func.id in SYMPY and all(map(_sympy_ok, node.args))
                and all(k.arg in ASSUMPTIONS and isinstance(k.value, ast.Constant) and type(k.value.value) is bool
                        for k in node.keywords))
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, ARITH) and _sympy_ok(node.left) and _sympy_ok(node.right)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd, ast.Not, ast.Invert)) and _sympy_ok(node.operand)
    if isinstance(node, ast.Compare):
        return all(isinstance(o, COMPARE) for o in node.ops) and all(map(_sympy_ok, [node.left, *node.comparators]))
    if isinstance(node, ast.BoolOp):
        return all(map(_sympy_ok, node.values))
    return False


def _guard_ok(node: ast.AST) -> bool:
    """Whether a parsed guard only compares sizes of the inputs ``L[...]`` (and integers)."""
    if isinstance(node, ast.Expression):
        return _guard_ok(node.body)
    if isinstance(node, ast.Constant):
        return type(node.value) in (int, bool) or (isinstance(node.value, str) and node.value.isidentifier())
    if isinstance(node, ast.Name):
        return node.id == "L"
    if isinstance(node, ast.Subscript):
        return _guard_ok(node.value) and isinstance(node.slice, ast.Constant) and _guard_ok(node.slice)
    if isinstance(node, ast.Call):
        f = node.func
        return (isinstance(f, ast.Attribute) and f.attr in SIZES and _guard_ok(f.value) and not node.keywords
                and all(isinstance(a, ast.Constant) and type(a.value) is int for a in node.args))
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, ARITH[:-2]) and _guard_ok(node.left) and _guard_ok(node.right)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.Not)) and _guard_ok(node.operand)
    if isinstance(node, ast.Compare):
        return all(isinstance(o, COMPARE) for o in node.ops) and all(map(_guard_ok, [node.left, *node.comparators]))
    if isinstance(node, ast.BoolOp):
        return all(map(_guard_ok, node.values))
    return False


def _parses(text: Any, chars: re.Pattern, ok) -> bool:
    if not isinstance(text, str) or chars.fullmatch(text) is None:
        return False
    try:
        return ok(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError, RecursionError):
        return False


def _items(obj: Any) -> Iterator[Tuple[str, Any]]:
    """Every (key, value) of a JSON document, at any depth."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            for k, v in o.items():
                yield k, v
                stack.append(v)
        elif isinstance(o, list):
            stack.extend(o)


def _check_program(model: Any, where: str) -> None:
    """``models/model.json``: operators, symbolic expressions and guards as the module docstring says."""
    if not isinstance(model, dict) or not isinstance(model.get("graph_module"), dict):
        raise _refuse(where, "models/model.json is not an exported program")
    for key, value in _items(model):
        if key in ("target", "as_operator") and isinstance(value, str) and not OPERATOR.fullmatch(value):
            raise _refuse(where, f"it calls {value!r}, not an ATen operator")
        if key == "expr_str" and not _parses(value, EXPR_CHARS, _sympy_ok):
            raise _refuse(where, f"a symbolic size {str(value)[:60]!r} is not an expression of sizes")
        if key in ("as_custom_obj", "custom_obj") or (key == "custom_obj_values" and value):
            raise _refuse(where, "it holds a custom object")
    guards = model.get("guards_code") or []
    if not isinstance(guards, list):
        raise _refuse(where, "its guards are not a list")
    for g in guards:
        if not _parses(g, GUARD_CHARS, _guard_ok):
            raise _refuse(where, f"an input guard {str(g)[:60]!r} is not a comparison of input sizes")


def check_archive(data: bytes, where: str) -> None:
    """UserError, one line, unless ``data`` is a .pt2 archive that asks for nothing to be run (see the module
    docstring); ``where`` names it in the message."""
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
        infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise _refuse(where, f"not a zip archive: {e}") from None
    names = [i.filename for i in infos]
    root = names[0].split("/")[0] if names else ""
    if not root or len(set(names)) != len(names):
        raise _refuse(where, "an empty archive or one that names a member twice")
    for info in infos:
        head, _, rest = info.filename.partition("/")
        if head != root or not MEMBERS.fullmatch(rest):
            raise _refuse(where, f"an unexpected member {info.filename[:80]!r}")
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            raise _refuse(where, f"a compressed or encrypted member {info.filename[:80]!r}")
    try:
        for config, prefix in PAYLOADS.items():
            if f"{root}/{config}" not in names:
                raise _refuse(where, f"no {config}")
            entries = json.loads(z.read(f"{root}/{config}"))["config"]
            for fqn, meta in entries.items():
                if meta.get("use_pickle") is not False or not re.fullmatch(re.escape(prefix) + r"\d+",
                                                                            str(meta.get("path_name"))):
                    raise _refuse(where, f"{fqn[:60]!r} is stored as a pickle, not a raw tensor")
        _check_program(json.loads(z.read(f"{root}/models/model.json")), where)
        if f"{root}/data/sample_inputs/model.pt" in names:  # torch reads them unsafely when this refuses them
            try:
                torch.load(io.BytesIO(z.read(f"{root}/data/sample_inputs/model.pt")), weights_only=True)
            except Exception:  # noqa: BLE001  (the safe unpickler refuses in several ways)
                raise _refuse(where, "its sample inputs are a pickle of more than tensors") from None
    except UserError:
        raise
    except KeyError as e:
        raise _refuse(where, f"no {e}") from None
    except (ValueError, TypeError, AttributeError, RecursionError, zipfile.BadZipFile) as e:
        raise _refuse(where, f"an unreadable config: {type(e).__name__}") from None


def load_program(data: bytes, where: str) -> torch.nn.Module:
    """The program of the .pt2 archive ``data`` as a module, after :func:`check_archive`, loaded with every
    ``torch.load`` weights-only. UserError, one line, for an archive torch cannot read."""
    check_archive(data, where)
    with _LOCK:
        saved = {k: os.environ.get(k) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
        os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
        os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
        logging.disable(logging.WARNING)  # the deserializer warns about unused symbols of the step index
        try:
            return torch.export.load(io.BytesIO(data)).module()
        except Exception as e:  # noqa: BLE001  (the deserializer fails in many ways; each is one line here)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"{where} cannot be loaded as a torch.export program ({first[:160]}); re-export the "
                            "run (recurvit export RUN --format torch-export --steps-program)") from None
        finally:
            logging.disable(logging.NOTSET)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


__all__ = ["check_archive", "load_program"]
