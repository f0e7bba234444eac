"""GGML block quantizations as graph expressions over the packed bytes.

A quantized tensor stays exactly as the file stores it: an array of fixed-size blocks. It
enters the graph as up to three *aliases of the same mapped bytes* — ``<name>#u8`` (u8),
``<name>#f16`` (f16) and ``<name>#i8`` (i8), each a contiguous numpy view, so nothing is copied.
Each field of a block (quants, f16 scales, 6-bit sub-scales) is then read through a view whose
index is the field's byte offset (``block * type_size + offset``), and bit fields are integer
arithmetic done exactly in f32: ``(q >> s) & (2^w - 1)`` is ``floor(fmod(q * 2^-s, 2^w))`` with
``floor(y) = y - fmod(y, 1)``. The result is an f32 expression of shape (rows, cols); the
compiler can fuse it into the matmul that consumes it, so no per-format kernel exists.

Layouts follow ggml-quants.c (block_q4_0, block_q4_1, block_q8_0, block_q4_K, block_q6_K).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.symbolic import sint
from ..graph.view import View, idx_vars
from ..tensor import Graph, Tensor


@dataclass(frozen=True)
class Format:
    name: str
    block: int  # values per block
    type_size: int  # bytes per block
    aliases: tuple[str, ...]  # views of the bytes the expression reads ("u8", "f16", "i8")
    # (graph, {alias: tensor whose node buffer holds the blocks}, number of blocks) -> f32
    # (nblocks, block); fields are read by byte offset, so only the node's buffer matters
    build: Callable[[Graph, dict[str, Tensor], sint], Tensor]


def _read(w: Tensor, shape: tuple[sint, ...], index: Callable[..., sint]) -> Tensor:
    """A view of ``w``'s node buffer: element ``[i0, i1, ...]`` reads flat ``index(i0, ...)``."""
    assert w.layout.is_contiguous(), "packed blocks must be read from a contiguous buffer"
    return Tensor(w.node, View(shape, index(*idx_vars(shape))))


def _f(t: Tensor) -> Tensor:
    return t.cast(dt.f32)


def _floor(y: Tensor) -> Tensor:
    return y.add(y.fmod(1.0).mul(-1.0))


def _bits(q: Tensor, shift: int | Tensor, width: int) -> Tensor:
    """``(q >> shift) & (2^width - 1)`` for non-negative integer-valued f32 ``q``; ``shift`` may
    be a tensor of ``2^-shift`` factors (broadcast against ``q``)."""
    if isinstance(shift, Tensor):
        return _floor(q.mul(shift).fmod(float(1 << width)))
    y = q.mul(2.0**-shift) if shift else q
    y = y.fmod(float(1 << width))
    return _floor(y) if shift else y


def _nibble16(g: Graph, q: Tensor, hi_shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """``(n, f)`` with ``n * f == (q >> 4h) & 15`` for a u8 view ``q`` whose nibble index h in
    {0, 1} runs over the axis that ``hi_shape`` (a broadcastable (2, 1, ...) shape) marks. In
    integers, so a kernel reads each byte once for both nibbles: lo = q % 16 and 16*hi = q - lo
    are exact, h (an IOTA) picks one (``n``), and ``f`` = 1 - 15h/16 (1 or 1/16) scales it.
    With h a literal (a loop rewrite fixes it per nibble), all of the selection folds to
    constants. A caller multiplying by a block scale s can write ``n * (s * f)``: s * 2^-4 is
    exact (s is a normal f32 from f16 scales) and so is n * 2^-4, so the product is the same
    float, and ``s * f`` depends on the block alone — computed once per block, not per value."""
    h = Tensor(g.add_op(Op.IOTA, [], arg=idx_vars(hi_shape)[0], shape=hi_shape, dtype=dt.i32))
    qi = q.cast(dt.i32)
    lo = qi.fmod(16)
    hi16 = qi.add(lo.mul(-1))
    nib = lo.add(h.mul(hi16.add(lo.mul(-1))))
    return _f(nib), _f(h).mul(-15 / 16).add(1.0)


def _nibble(g: Graph, q: Tensor, hi_shape: tuple[int, ...]) -> Tensor:
    """``(q >> 4h) & 15`` as an exact f32 (see ``_nibble16``)."""
    n, f = _nibble16(g, q, hi_shape)
    return n.mul(f)


_TABLES: weakref.WeakKeyDictionary[Graph, dict[tuple, Tensor]] = weakref.WeakKeyDictionary()


def _table(g: Graph, values: list[float], shape: tuple[int, ...]) -> Tensor:
    """A small constant (shift factors), shared by every quantized weight of the graph."""
    cache = _TABLES.setdefault(g, {})
    key = (tuple(values), shape)
    if key not in cache:
        cache[key] = g.tensor(np.asarray(values, dtype=np.float32).reshape(shape))
    return cache[key]


def _cat_last(a: Tensor, b: Tensor) -> Tensor:
    """Concatenate along the last dim (two zero-padded views added: no copy, exact)."""
    na, nb = a.shape[-1], b.shape[-1]
    return a.pad_dim(-1, 0, nb).add(b.pad_dim(-1, na, 0))


def _b(i: sint, size: int, off: sint = 0) -> sint:
    return sym.add(sym.mul(i, size), off)


# --------------------------------------------------------------------------- formats
def _q4_0(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_q4_0: f16 d; u8 qs[16]. y[h*16 + l] = (((qs[l] >> 4h) & 15) - 8) * d
    shape = (nb, 2, 16)
    q = _read(w["u8"], shape, lambda b, h, e: _b(b, 18, sym.add(2, e)))
    d = _f(_read(w["f16"], shape, lambda b, *_: _b(b, 9)))
    v = _nibble(g, q, (2, 1)).add(-8.0)
    return v.mul(d).reshape(nb, 32)


def _q4_1(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_q4_1: f16 d, f16 m; u8 qs[16]. y[h*16 + l] = ((qs[l] >> 4h) & 15) * d + m
    shape = (nb, 2, 16)
    q = _read(w["u8"], shape, lambda b, h, e: _b(b, 20, sym.add(4, e)))
    d = _f(_read(w["f16"], shape, lambda b, *_: _b(b, 10)))
    m = _f(_read(w["f16"], shape, lambda b, *_: _b(b, 10, 1)))
    n, f = _nibble16(g, q, (2, 1))
    return n.mul(d.mul(f)).add(m).reshape(nb, 32)


def _q8_0(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_q8_0: f16 d; i8 qs[32]. y[l] = qs[l] * d
    shape = (nb, 32)
    q = _f(_read(w["i8"], shape, lambda b, e: _b(b, 34, sym.add(2, e))))
    d = _f(_read(w["f16"], shape, lambda b, *_: _b(b, 17)))
    return q.mul(d)


def _q4_k(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_q4_K: f16 d, f16 dmin; u8 scales[12] (8 six-bit scales + 8 six-bit mins);
    # u8 qs[128]. Sub-block s = 2j + h covers y[64j + 32h + l] = d*sc[s]*((qs[32j+l] >> 4h) & 15)
    # - dmin*mn[s]; sc/mn unpacked as in get_scale_min_k4.
    u8 = w["u8"]

    def sb(off: int) -> Tensor:  # scales[off + k], k < 4, as (nb, 4)
        return _f(_read(u8, (nb, 4), lambda b, k: _b(b, 144, sym.add(4 + off, k))))

    s0, s4, s8 = sb(0), sb(4), sb(8)
    sc = _cat_last(_bits(s0, 0, 6), _bits(s8, 0, 4).add(_bits(s0, 6, 2).mul(16.0)))
    mn = _cat_last(_bits(s4, 0, 6), _bits(s8, 4, 4).add(_bits(s4, 6, 2).mul(16.0)))
    shape = (nb, 4, 2, 32)
    d = _f(_read(w["f16"], (nb, 1), lambda b, _: _b(b, 72)))
    dmin = _f(_read(w["f16"], (nb, 1), lambda b, _: _b(b, 72, 1)))
    scale = sc.mul(d).reshape(nb, 4, 2, 1).expand(shape)
    offset = mn.mul(dmin).reshape(nb, 4, 2, 1).expand(shape)
    q = _read(u8, shape, lambda b, j, h, e: _b(b, 144, sym.add(16, sym.add(sym.mul(j, 32), e))))
    n, f = _nibble16(g, q, (2, 1))
    return n.mul(scale.mul(f)).add(offset.mul(-1.0)).reshape(nb, 256)


def _q6_k(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_q6_K: u8 ql[128], u8 qh[64], i8 scales[16], f16 d. With k = 2kh + kl and
    # l = 16lh + ll, y[128n + 32k + l] = d * scales[8n + 2k + lh] * (q - 32), where
    # q = ((ql[64n + 32kl + l] >> 4kh) & 15) | (((qh[32n + l] >> 2k) & 3) << 4).
    shape = (nb, 2, 2, 2, 2, 16)  # n, kh, kl, lh, ll

    def l_(lh: sint, ll: sint) -> sint:
        return sym.add(sym.mul(lh, 16), ll)

    ql = _f(
        _read(
            w["u8"],
            shape,
            lambda b, n, kh, kl, lh, ll: _b(
                b, 210, sym.add(sym.add(sym.mul(n, 64), sym.mul(kl, 32)), l_(lh, ll))
            ),
        )
    )
    qh = _f(
        _read(
            w["u8"],
            shape,
            lambda b, n, kh, kl, lh, ll: _b(
                b, 210, sym.add(128 + 0, sym.add(sym.mul(n, 32), l_(lh, ll)))
            ),
        )
    )
    sc = _f(
        _read(
            w["i8"],
            shape,
            lambda b, n, kh, kl, lh, ll: _b(
                b,
                210,
                sym.add(
                    192,
                    sym.add(sym.add(sym.mul(n, 8), sym.mul(kh, 4)), sym.add(sym.mul(kl, 2), lh)),
                ),
            ),
        )
    )
    d = _f(_read(w["f16"], shape, lambda b, *_: _b(b, 105, 104)))
    lo = _bits(ql, _table(g, [1.0, 1 / 16], (2, 1, 1, 1)), 4)
    hi = _bits(qh, _table(g, [1.0, 1 / 4, 1 / 16, 1 / 64], (2, 2, 1, 1)), 2)
    q = lo.add(hi.mul(16.0)).add(-32.0)
    return q.mul(sc.mul(d)).reshape(nb, 256)


FORMATS: dict[str, Format] = {
    "Q4_0": Format("Q4_0", 32, 18, ("u8", "f16"), _q4_0),
    "Q4_1": Format("Q4_1", 32, 20, ("u8", "f16"), _q4_1),
    "Q8_0": Format("Q8_0", 32, 34, ("i8", "f16"), _q8_0),
    "Q4_K": Format("Q4_K", 256, 144, ("u8", "f16"), _q4_k),
    "Q6_K": Format("Q6_K", 256, 210, ("u8", "i8", "f16"), _q6_k),
}

_ALIASES = {"u8": np.uint8, "f16": np.float16, "i8": np.int8}


def _aliases(
    g: Graph, name: str, f: Format, raw: np.ndarray, rows: int, cols: int
) -> dict[str, Tensor]:
    """Register (once per graph) the byte views of a quantized tensor as weights, each of shape
    (rows, bytes per row / element width)."""
    if cols % f.block:
        raise ValueError(
            f"tensor {name!r}: row length {cols} is not a multiple of the {f.name} block "
            f"({f.block})"
        )
    row_bytes = cols // f.block * f.type_size
    flat = raw.reshape(-1).view(np.uint8)
    if flat.size != rows * row_bytes:
        raise ValueError(
            f"tensor {name!r}: {flat.size} bytes for ({rows}, {cols}) in {f.name} "
            f"(needs {rows * row_bytes})"
        )
    ws = {}
    for key in f.aliases:
        wname = f"{name}#{key}"
        if wname in g.inputs:
            ws[key] = Tensor(g.inputs[wname])
            continue
        npd = _ALIASES[key]
        ws[key] = g.weight(
            wname, data=flat.view(npd).reshape(rows, row_bytes // np.dtype(npd).itemsize)
        )
    return ws


def _format(name: str, fmt: str) -> Format:
    f = FORMATS.get(fmt)
    if f is None:
        raise NotImplementedError(
            f"tensor {name!r}: quantization {fmt} is not supported "
            f"(supported: {', '.join(FORMATS)}, F32, F16, BF16)"
        )
    return f


def quantized_weight(
    g: Graph, name: str, fmt: str, raw: np.ndarray, shape: tuple[int, int]
) -> Tensor:
    """The f32 (rows, cols) expression of a block-quantized tensor whose bytes are ``raw``
    (a contiguous view of the file). Registers the byte aliases as weights of ``g``."""
    f = _format(name, fmt)
    rows, cols = shape
    ws = _aliases(g, name, f, raw, rows, cols)
    return f.build(g, ws, rows * cols // f.block).reshape(rows, cols)


def quantized_rows(
    g: Graph, name: str, fmt: str, raw: np.ndarray, shape: tuple[int, int], idx: Tensor
) -> Tensor:
    """``weight[idx]`` (an embedding lookup) as (len(idx), cols) f32: GATHER the packed rows,
    then dequantize only those."""
    f = _format(name, fmt)
    rows, cols = shape
    ws = _aliases(g, name, f, raw, rows, cols)
    picked = {k: Tensor(g.add_op(Op.GATHER, [w.edge, idx.edge])) for k, w in ws.items()}
    n = idx.numel()
    return f.build(g, picked, sym.mul(n, cols // f.block)).reshape(n, cols)


def dequantize(fmt: str, raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Run the graph expression of one tensor with the reference interpreter (tests, tools)."""
    g = Graph(f"dequant_{fmt}")
    g.output("y", quantized_weight(g, "w", fmt, raw, shape))
    return g.run()["y"]
