"""Requantize a GGUF model, or quantize a transformers folder, to another weight format.

A folder (``config.json``, ``*.safetensors``, ``tokenizer.json``; the model types of
``hf.ARCHS``) is first written as a GGUF file in its own float type, with llama.cpp's tensor
names and layout, metadata and tokenizer (``hf.py``), beside the output; that file is then
quantized as any GGUF input and removed.

Three kinds of target type:

- **GGUF types the ``gguf`` package writes** (``q8_0``, ``q4_0``, ``q4_1``, ``q5_0``,
  ``q5_1``, ``bf16``, ``f16``, ``f32``) and ``mxfp4`` (GGUF MXFP4 blocks from luminal's OCP MX
  quantizer): a plain GGUF file that llama.cpp runs too.
- **llama.cpp's own quantizer** (``q2_k``, ``q3_k_m``, ``q4_k_m``, ``q4_k_s``, ``q5_k_m``,
  ``q5_k_s``, ``q6_k``, ``iq4_nl``, ``iq4_xs``): the file llama.cpp's
  ``llama-quantize`` writes (needs ``llama-cpp-python``).
- **luminal's formats** without a GGUF type (``fp8_e4m3``, ``fp8_e5m2``, their ``_tensor``
  variants, ``int8``, ``mxfp8``, ``nvfp4``): a GGUF file whose metadata and tokenizer are the
  source's and whose quantized weights are stored as parts (see ``loaders/gguf.py``); luminal
  reads it, llama.cpp refuses it by name.

Matrices (2-D tensors) are quantized; vectors (norms, biases) stay f32, and so does a matrix
whose row length is not a multiple of the format's block (listed in the result). ``scales``
says how luminal's quantizers (``mxfp4`` and luminal's formats) choose their scales: ``"mse"``
(the least squared error among candidates around the amax rule's, per row or block) or
``"amax"`` (the format's own rule); the gguf package's and llama.cpp's types have their own.

``calibration`` (a text, or a file of one) makes luminal's quantizers minimise each matrix's
output error over that text's activations instead of its weight error (GPTQ, activation-aware
input scales folded into the norms, or both: ``calibrate``). With it, ``keep_sensitive`` keeps
the matrices whose rounding costs the most at the output, measured on that text
(``sensitivity``), at a higher-precision ``keep_type``.

``rotate`` first rotates the residual stream of a llama-family model by an orthogonal matrix
(the norm weights folded into the linears, ``rotate``): the same function in f32, with the
outlier channels spread over all channels (measured on SmolLM2 it helps mxfp4, and fp8's KL,
not nvfp4 or int8: docs/quantization.md). Calibration and the sensitivity mix then see the
rotated model as an ordinary one.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..loaders import lowp
from ..loaders.gguf import LUMINAL_QUANT_KEY, GGUFFile, GGUFWeights
from . import calibrate, hf, rotate, sensitivity

# type -> GGUF tensor type, for the types the gguf package quantizes
_GGUF_PY = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1"}
# type -> (GGUF tensor type, luminal format): plain GGUF tensors from luminal's quantizers
_GGUF_LOWP = {"mxfp4": ("MXFP4", "mxfp4"), "bf16": ("BF16", "bf16"), "f16": ("F16", "f16")}
# type -> llama_ftype suffix (LLAMA_FTYPE_MOSTLY_<suffix>) for llama.cpp's quantizer
_LLAMA_CPP = {"q2_k": "Q2_K", "q3_k_m": "Q3_K_M", "q4_k_m": "Q4_K_M", "q4_k_s": "Q4_K_S",
              "q5_k_m": "Q5_K_M", "q5_k_s": "Q5_K_S", "q6_k": "Q6_K", "iq4_nl": "IQ4_NL",
              "iq4_xs": "IQ4_XS"}  # fmt: skip
# general.file_type (llama_ftype) of the plain GGUF outputs
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9,
              "bf16": 32, "mxfp4": 38}  # fmt: skip
_LUMINAL = [n for n in lowp.FORMATS if n not in _GGUF_LOWP]

TYPES: tuple[str, ...] = (*_GGUF_PY, *_GGUF_LOWP, "f32", *_LUMINAL, *_LLAMA_CPP)


def llama_cpp_reads(qtype: str, embed_type: str | None = None) -> bool:
    """Whether llama.cpp runs a file of these types (luminal's own formats it does not)."""
    return qtype not in _LUMINAL and (embed_type or qtype) not in _LUMINAL


@dataclass
class QuantizeResult:
    path: str
    qtype: str
    size: int  # bytes of the file
    seconds: float
    embed_type: str = ""
    stored: dict[str, str] = field(default_factory=dict)  # tensor -> type it was written as
    kept_f32: list[str] = field(default_factory=list)  # matrices the format cannot hold
    # relative RMS error of the matrices quantized here, sqrt(sum (q - w)^2 / sum w^2)
    error: float | None = None
    calibration: dict[str, Any] | None = None  # what the file's calibrate.CALIB_KEY records
    # with keep_sensitive: each measured matrix's KL with only it rounded (``sensitivity``)
    sensitivity: dict[str, float] = field(default_factory=dict)
    rotation: dict[str, Any] | None = None  # what the file's rotate.ROTATION_KEY records


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], qtype: str,
             embed_type: str | None = None, quiet: bool = True, scales: str = "mse",
             calibration: str | os.PathLike[str] | None = None,
             calib_tokens: int = calibrate.CALIB_TOKENS,
             calib_damp: float = calibrate.DAMP, calib_method: str = calibrate.METHOD,
             calib_act_order: bool = False, calib_importance: bool = True,
             keep_sensitive: float = 0.0, keep_type: str = "q8_0",
             rotate: bool | str = False,
             rotate_loud: float = rotate.LOUD) -> QuantizeResult:  # fmt: skip
    """Write ``src`` (a GGUF file luminal reads, or a transformers folder of a model type in
    ``hf.ARCHS``, converted first as llama.cpp's converter would) requantized to ``qtype``
    at ``dst``.
    ``embed_type``: another type for the token embedding and output head (``EMBEDDINGS``),
    as llama.cpp keeps them at higher precision in its 4-bit mixes. ``scales``: how luminal's
    quantizers choose scales (``lowp.SCALES``, see above). ``calibration``: a text (a str
    with whitespace) or a text file; its first ``calib_tokens`` tokens calibrate the
    matrices of a llama-family model (``calibrate``) for the types luminal quantizes with
    scales (an ``embed_type`` that is not one is rounded as without calibration);
    ``calib_damp``: added to X^T X's diagonal relative to its mean (more: closer to round to
    nearest, less fitted to the text); ``calib_method``: ``calibrate.METHODS``: GPTQ error
    feedback, activation-aware input scales folded into the inputs' producers (then round to
    nearest), or both; ``calib_act_order``: GPTQ takes each matrix's columns loudest input
    first, its group scales fixed beforehand; ``calib_importance``: the ``mse`` scale choices
    weigh each column's error by its inputs (``calibrate.Options``); ``keep_sensitive``: with
    ``calibration``, this fraction of the matrices' weights is stored as ``keep_type``,
    the matrices whose rounding alone costs the most KL per weight on the calibration text
    (``sensitivity``; the embedding and head are candidates unless ``embed_type`` is given);
    ``rotate``: True or a kind of ``rotate.KINDS`` (True: ``rotate.KIND``): rotate the residual
    stream of a llama-family model first (``rotate``), the norm weights folded into the linears
    (a tied head whose final norm weight is not a constant is untied); ``rotate_loud``: residual
    channels whose mean square over the calibration text (the shipped one without
    ``calibration``) is above this times the median channel's are left out of the rotation
    (``rotate.loud_channels``; 0: every channel is rotated)."""
    src, dst = os.fspath(src), os.fspath(dst)
    if qtype not in TYPES:
        raise ValueError(f"unknown quantization type {qtype!r} (known: {', '.join(TYPES)})")
    if scales not in lowp.SCALES:
        raise ValueError(f"scales must be one of {', '.join(lowp.SCALES)}, got {scales!r}")
    if embed_type is not None and qtype in _LLAMA_CPP:
        raise ValueError(f"{qtype} is llama.cpp's own mix: embed_type does not apply to it")
    own = [t for t in TYPES if t not in _LLAMA_CPP]
    if embed_type is not None and embed_type not in own:
        raise ValueError(f"embed_type {embed_type!r} must be one of {', '.join(own)}")
    embed_type = embed_type or qtype
    folder = os.path.isdir(src)
    if folder:
        hf.model_type(src)  # an architecture not converted fails before any work
    elif not os.path.exists(src):
        raise FileNotFoundError(f"{src}: no such file")
    if os.path.abspath(src) == os.path.abspath(dst):
        raise ValueError(f"{dst}: the output would overwrite the input")
    text = None
    if keep_sensitive:
        if calibration is None:
            raise ValueError("keep_sensitive measures on a calibration text: give calibration")
        if not 0 < keep_sensitive <= 1:
            raise ValueError(f"keep_sensitive must be in (0, 1], got {keep_sensitive}")
        if keep_type not in own:
            raise ValueError(f"keep_type {keep_type!r} must be one of {', '.join(own)}")
    keep = (keep_sensitive, keep_type)
    kind = _rotation_kind(rotate)
    if not rotate_loud >= 0:
        raise ValueError(f"rotate_loud must be 0 (rotate every channel) or more, got {rotate_loud}")
    if calibration is not None:
        if _grid_format(qtype) is None:
            able = [t for t in TYPES if _grid_format(t) is not None]
            raise ValueError(
                f"calibration applies to luminal's quantizers ({', '.join(able)}), not {qtype}"
            )
        text = calibrate.read_text(calibration)
        if not calib_damp > 0:
            raise ValueError(f"calib_damp must be positive, got {calib_damp}")
        if calib_method not in calibrate.METHODS:
            raise ValueError(
                f"calib_method must be one of {', '.join(calibrate.METHODS)}, got {calib_method!r}"
            )
    rot = None
    if kind is not None:  # the loud channels are measured on the calibration text
        rot = _Rotation(kind, rotate_loud, text or calibrate.read_text(calibrate.TEXT))
    t0 = time.perf_counter()
    if not folder:
        res = _quantize(src, dst, qtype, embed_type, quiet, scales, text, calib_tokens,
                        calib_method, calib_damp, calib_act_order, calib_importance,
                        keep, rot)  # fmt: skip
        res.seconds = time.perf_counter() - t0
        return res
    # the folder becomes a GGUF file of its own float type beside the output (the layout
    # llama.cpp's converter writes), which is then quantized as any GGUF input
    fd, tmp = tempfile.mkstemp(".gguf", ".luminal-", os.path.dirname(os.path.abspath(dst)))
    os.close(fd)
    try:
        if not quiet:
            print(f"quantize: converting {src}", file=sys.stderr)
        hf.write_gguf(src, tmp)
        res = _quantize(tmp, dst, qtype, embed_type, quiet, scales, text, calib_tokens,
                        calib_method, calib_damp, calib_act_order, calib_importance, keep,
                        rot, transient=True)  # fmt: skip
    finally:
        os.unlink(tmp)
    res.seconds = time.perf_counter() - t0
    return res


def _quantize(src: str, dst: str, qtype: str, embed_type: str, quiet: bool, scales: str,
              text: str | None, calib_tokens: int, calib_method: str, calib_damp: float,
              calib_act_order: bool, calib_importance: bool, keep: tuple[float, str],
              rot: _Rotation | None = None, transient: bool = False) -> QuantizeResult:  # fmt: skip
    """``quantize`` of the GGUF file ``src``, its arguments checked; ``transient``: ``src`` is
    deleted after (its parsed header is not cached)."""
    if qtype in _LLAMA_CPP:
        record = None
        if rot is None:
            _llama_cpp_quantize(src, dst, _LLAMA_CPP[qtype])
        else:  # llama.cpp quantizes the rotated f32 model (its metadata carries the record)
            fd, tmp = tempfile.mkstemp(".gguf", ".luminal-", os.path.dirname(os.path.abspath(dst)))
            os.close(fd)
            try:
                record = _write(src, tmp, "f32", "f32", quiet, scales, rot=rot,
                                transient=transient).rotation  # fmt: skip
                _llama_cpp_quantize(tmp, dst, _LLAMA_CPP[qtype])
            finally:
                os.unlink(tmp)
        f = GGUFFile(dst)
        stored = {n: t.type_name for n, t in f.tensors.items()}
        return QuantizeResult(dst, qtype, os.path.getsize(dst), 0.0, stored=stored,
                              rotation=record)  # fmt: skip
    opts = calibrate.Options(calib_method, calib_damp, calib_act_order, calib_importance)
    return _write(src, dst, qtype, embed_type, quiet, scales, text, calib_tokens, opts,
                  transient, keep, rot)  # fmt: skip


@dataclass(frozen=True)
class _Rotation:
    kind: str
    loud: float  # rotate.loud_channels' ratio (0: every channel rotated)
    text: str  # what the loud channels are measured on


def _rotation_kind(rotate_: bool | str) -> str | None:
    """The kind of rotation ``quantize``'s ``rotate`` asks for (None: none)."""
    if rotate_ is False or rotate_ is None:
        return None
    if rotate_ is True:
        return rotate.KIND
    if rotate_ not in rotate.KINDS:
        raise ValueError(
            f"rotate must be True, False or one of {', '.join(rotate.KINDS)}, got {rotate_!r}"
        )
    return str(rotate_)


def _llama_cpp_quantize(src: str, dst: str, ftype: str) -> None:
    try:
        import llama_cpp
    except ImportError:
        raise RuntimeError(
            f"quantizing to {ftype} uses llama.cpp's quantizer: pip install llama-cpp-python"
        ) from None
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    p.allow_requantize, p.nthread = True, min(os.cpu_count() or 1, 8)
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {ftype} (error {rc})")


EMBEDDINGS = ("token_embd.weight", "output.weight")


def _grid_format(qtype: str) -> lowp.LowpFormat | None:
    """The luminal format of ``qtype`` when it has scales to calibrate."""
    name = _GGUF_LOWP[qtype][1] if qtype in _GGUF_LOWP else qtype
    f = lowp.FORMATS.get(name)
    return f if f is not None and f.grid is not None else None


def _write(src: str, dst: str, qtype: str, embed_type: str, quiet: bool, scales: str,
           text: str | None = None, calib_tokens: int = 0,
           opts: calibrate.Options | None = None, transient: bool = False,
           keep: tuple[float, str] = (0.0, "q8_0"),
           rot: _Rotation | None = None) -> QuantizeResult:  # fmt: skip
    import gguf

    opts = opts or calibrate.Options()
    f = GGUFFile(src, cache_header=not transient)
    gw = GGUFWeights(f, dequant="load")
    res = QuantizeResult(dst, qtype, 0, 0.0, embed_type)
    owned = {f"{n}.{p.name}" for n, (fmt, _) in gw.lowp.items() for p in lowp.get(fmt).parts}
    names = [*gw.lowp, *(n for n in f.tensors if n not in owned)]
    source: GGUFWeights | rotate.Overlay = gw
    if rot is not None:  # first: calibration and the sensitivity mix see an ordinary model
        source, res.rotation = _rotate(f, gw, names, rot)
        names += [n for n in source.new if n not in names]
    types = {}
    for name in names:
        t = embed_type if name in EMBEDDINGS else qtype
        if len(source.shape(name)) != 2:
            t = "f32"
        elif t != "f32" and source.shape(name)[1] % _block(t):
            res.kept_f32.append(name)
            t = "f32"
        types[name] = t
    done: dict[str, dict[str, np.ndarray]] = {}
    new: dict[str, np.ndarray] = {}  # tensors the input scales changed
    if text is not None:
        tokens = calibrate.text_tokens(f, text, calib_tokens)
        cal = calibrate.Calibration.from_gguf(f, source, tokens)
        kept = []
        if keep[0]:
            kept = _keep_sensitive(cal, source, types, scales, keep, embed_type != qtype, res,
                                   quiet)  # fmt: skip
        done, new = _calibrate(cal, source, types, scales, quiet, opts)
        res.calibration = {**calibrate.describe(text, tokens, opts),
                           "matrices": len(done)}  # fmt: skip
        if keep[0]:
            res.calibration["keep"] = {"fraction": keep[0], "type": keep[1], "matrices": kept}
    w = gguf.GGUFWriter(dst, f.architecture)
    for key, val in f.metadata.items():
        if key in ("general.architecture", "general.alignment", "general.file_type"):
            continue
        if key == calibrate.CALIB_KEY:  # describes the source's quantization, not this one
            continue
        # (a rotation's record stays: the weights stay rotated whatever their type)
        if key.startswith(LUMINAL_QUANT_KEY) or val is None:
            continue
        vt, et = f.metadata_types[key]
        v = val.tolist() if isinstance(val, np.ndarray) else val
        w.add_key_value(key, v, gguf.GGUFValueType(vt),
                        sub_type=None if et is None else gguf.GGUFValueType(et))  # fmt: skip
    if qtype in _FILE_TYPE:
        w.add_uint32("general.file_type", _FILE_TYPE[qtype])
    if any(t in _LUMINAL for t in (qtype, embed_type, *types.values())):
        w.add_uint32(LUMINAL_QUANT_KEY + "version", 1)
    if res.calibration is not None:
        w.add_string(calibrate.CALIB_KEY, json.dumps(res.calibration))
    if res.rotation is not None:
        w.add_string(rotate.ROTATION_KEY, json.dumps(res.rotation))
    err2 = norm2 = 0.0
    for k, name in enumerate(names):
        x = np.ascontiguousarray(new.get(name, source.values(name)), dtype=np.float32)
        res.stored[name], q = _put(w, name, x, types[name], scales, done.get(name))
        if q is not None:
            err2 += float(np.square(q.astype(np.float64) - x).sum())
            norm2 += float(np.square(x.astype(np.float64)).sum())
        if not quiet and (k % 16 == 0 or k == len(names) - 1):
            print(f"\rquantize: {k + 1}/{len(names)} tensors", end="", file=sys.stderr)
    if not quiet:
        print(file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    res.size = os.path.getsize(dst)
    res.error = (err2 / norm2) ** 0.5 if norm2 > 0 else None
    return res


def _rotate(f: GGUFFile, source: GGUFWeights, names: list[str],
            rot: _Rotation) -> tuple[rotate.Overlay, dict[str, Any]]:  # fmt: skip
    """``source`` with its residual stream rotated (``rotate.rotate``), and the record."""
    from ..models.llama import config_from_gguf

    if rotate.ROTATION_KEY in f.metadata:
        raise ValueError(f"{f.path} is already rotated ({f.get(rotate.ROTATION_KEY)})")
    try:
        config = config_from_gguf(f)
    except NotImplementedError as e:
        raise ValueError(f"rotate applies to llama-family models: {e}") from None
    keep: list[int] = []
    if rot.loud:
        tokens = calibrate.text_tokens(f, rot.text, rotate.LOUD_TOKENS)
        keep = rotate.loud_channels(config, source, tokens, rot.loud)
    new, record = rotate.rotate(config, source, names, rot.kind, keep=keep)
    record["loud"] = rot.loud
    return rotate.Overlay(source, new), record


def _block(qtype: str) -> int:
    import gguf

    if qtype in _GGUF_PY:
        return int(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[_GGUF_PY[qtype]]][0])
    return lowp.get(_GGUF_LOWP[qtype][1] if qtype in _GGUF_LOWP else qtype).block


def _keep_sensitive(cal: calibrate.Calibration, source: GGUFWeights | rotate.Overlay,
                    types: dict[str, str],
                    scales: str, keep: tuple[float, str], embed_fixed: bool,
                    res: QuantizeResult, quiet: bool) -> list[str]:  # fmt: skip
    """Measure the model's matrices' sensitivity to their types (round to nearest) and set
    the most sensitive per weight to ``keep``'s type, up to its fraction of their weights."""
    fraction, ktype = keep
    names = [n for n, t in types.items() if t not in ("f32", ktype)
             and (cal.key(n) is not None or n in EMBEDDINGS)
             and not (embed_fixed and n in EMBEDDINGS)
             and (ktype == "f32" or source.shape(n)[1] % _block(ktype) == 0)]  # fmt: skip
    res.sensitivity = sensitivity.measure(
        cal, names, lambda n, x: _rounded(x, types[n], scales), quiet=quiet
    )
    sizes = {n: int(np.prod(source.shape(n))) for n in names}
    kept = sensitivity.choose(res.sensitivity, sizes, fraction)
    for n in kept:
        types[n] = ktype
    return kept


def _calibrate(cal: calibrate.Calibration, source: GGUFWeights | rotate.Overlay,
               types: dict[str, str],
               scales: str, quiet: bool, opts: calibrate.Options,
               ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:  # fmt: skip
    """The parts of every matrix ``cal`` has statistics for and whose type has a grid (GPTQ's,
    or rounded to nearest with ``awq``), and the f32 values of the tensors the input scales
    change (written in place of the source's)."""
    todo: dict[str, list[str]] = {}
    for name, t in types.items():
        key = cal.key(name)
        if key is not None and _grid_format(t) is not None:
            todo.setdefault(key, []).append(name)
    out: dict[str, dict[str, np.ndarray]] = {}
    new: dict[str, np.ndarray] = {}

    def get(name: str) -> np.ndarray:
        return new[name] if name in new else np.ascontiguousarray(source.values(name), np.float32)

    def rounder(name: str) -> calibrate.Rounder:
        return lambda x, imp: _rounded(x, types[name], scales, imp if opts.importance else None)

    for hs in cal.layers(quiet):
        if "awq" in opts.method:
            new.update(cal.fold_scales(hs, get, rounder))
        for key, h in hs.items():
            if key not in todo:
                continue
            imp = np.diag(h) if opts.importance else None
            order = calibrate.act_order(h) if opts.act_order and "gptq" in opts.method else None
            u = None
            if "gptq" in opts.method:
                u = calibrate.inverse_factor(h if order is None else h[order][:, order], opts.damp)
                if imp is not None:
                    imp = calibrate.gptq_importance(u, order)
            for name in todo[key]:
                x = get(name)
                fmt = _grid_format(types[name])
                assert fmt is not None and fmt.grid is not None
                if u is None:
                    out[name] = fmt.quantize(x, scales, imp)
                else:
                    out[name], _ = calibrate.gptq(x, u, fmt.grid(x, scales), order, imp)
    return out, new


def _rounded(x: np.ndarray, qtype: str, scales: str, imp: np.ndarray | None = None) -> np.ndarray:
    """The values ``x`` (f32 matrix) decode to once stored as ``qtype`` (no file written);
    ``imp``: the columns' input mean squares, for luminal's formats' scale choice."""
    import gguf

    if qtype == "f32":
        return x
    if qtype in _GGUF_PY:
        q = gguf.GGMLQuantizationType[_GGUF_PY[qtype]]
        return np.asarray(gguf.quants.dequantize(gguf.quants.quantize(x, q), q), np.float32)
    f = lowp.get(_GGUF_LOWP[qtype][1] if qtype in _GGUF_LOWP else qtype)
    return f.dequantize(f.quantize(x, scales, imp if f.grid is not None else None))


def _put(w: Any, name: str, x: np.ndarray, qtype: str, scales: str,
         parts: dict[str, np.ndarray] | None = None) -> tuple[str, np.ndarray | None]:  # fmt: skip
    """Add tensor ``name`` (f32 values) as ``qtype`` (from ``parts`` when given: calibrated);
    the type it was stored as and, unless f32, the values it decodes to."""
    import gguf

    if qtype == "f32":
        w.add_tensor(name, x)
        return "F32", None
    if qtype in _GGUF_PY:
        q = gguf.GGMLQuantizationType[_GGUF_PY[qtype]]
        data = gguf.quants.quantize(x, q)
        w.add_tensor(name, data, raw_dtype=q)
        return q.name, gguf.quants.dequantize(data, q)
    if qtype in _GGUF_LOWP:
        gtype, fmt = _GGUF_LOWP[qtype]
        parts = parts or lowp.get(fmt).quantize(x, scales)
        data = next(iter(parts.values()))
        w.add_tensor(name, data.view(np.uint8), raw_dtype=gguf.GGMLQuantizationType[gtype])
        return gtype, lowp.get(fmt).dequantize(parts)
    f = lowp.get(qtype)
    parts = parts or f.quantize(x, scales)
    for p in f.parts:
        a = parts[p.name]
        w.add_tensor(f"{name}.{p.name}", a.view(np.int8) if a.dtype == np.uint8 else a)
    info = {"format": qtype, "shape": [int(x.shape[0]), int(x.shape[1])]}
    w.add_string(LUMINAL_QUANT_KEY + name, json.dumps(info))
    return qtype, f.dequantize(parts)


def describe(res: QuantizeResult) -> dict[str, Any]:
    """A JSON-able summary: the type, file size, tensor counts by stored type, weight error."""
    counts: dict[str, int] = {}
    for t in res.stored.values():
        counts[t] = counts.get(t, 0) + 1
    return {"path": res.path, "type": res.qtype, "embed_type": res.embed_type or res.qtype,
            "bytes": res.size, "tensors": counts,
            "seconds": round(res.seconds, 2), "kept_f32": res.kept_f32,
            "rel_error": None if res.error is None else round(res.error, 6),
            "calibration": res.calibration, "rotation": res.rotation}  # fmt: skip
