"""GGML block quantizations as graph expressions over the packed bytes.

A quantized tensor stays exactly as the file stores it: an array of fixed-size blocks. It
enters the graph as up to three *aliases of the same mapped bytes* — ``<name>#u8`` (u8),
``<name>#f16`` (f16) and ``<name>#i8`` (i8), each a contiguous numpy view, so nothing is copied.
Each field of a block (quants, f16 scales, 6-bit sub-scales) is then read through a view whose
index is the field's byte offset (``block * type_size + offset``), and bit fields are integer
arithmetic done exactly in f32: ``(q >> s) & (2^w - 1)`` is ``floor(fmod(q * 2^-s, 2^w))`` with
``floor(y) = y - fmod(y, 1)``. The result is an f32 expression of shape (rows, cols); the
compiler can fuse it into the matmul that consumes it, so no per-format kernel exists.

Layouts follow ggml-quants.c / ggml-common.h (block_q4_0 ... block_q6_K, block_iq4_nl,
block_iq4_xs, block_mxfp4, block_nvfp4). Non-linear codes (IQ4 levels, e2m1, e8m0, ue4m3) are
a GATHER from a small constant table indexed by the integer code: exact by construction.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.graph import Graph as AnyGraph
from ..graph.graph import Node
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
    arr = np.asarray(values, dtype=np.float32).reshape(shape)
    key = (arr.tobytes(), shape)  # bytes: NaN entries compare equal
    if key not in cache:
        cache[key] = g.tensor(arr)
    return cache[key]


def _cat_last(a: Tensor, b: Tensor) -> Tensor:
    """Concatenate along the last dim (two zero-padded views added: no copy, exact)."""
    na, nb = a.shape[-1], b.shape[-1]
    return a.pad_dim(-1, 0, nb).add(b.pad_dim(-1, na, 0))


def _b(i: sint, size: int, off: sint = 0) -> sint:
    return sym.add(sym.mul(i, size), off)


def _lin(*terms: sint) -> sint:
    out: sint = 0
    for t in terms:
        out = sym.add(out, t)
    return out


def _at(w: Tensor, shape: tuple[sint, ...], size: int, off: Callable[..., sint]) -> Tensor:
    """Field bytes of block ``b``: element ``[b, i...]`` reads ``b * size + off(i...)``."""
    return _read(w, shape, lambda b, *ix: _b(b, size, off(*ix)))


def _lookup(g: Graph, values: list[float], code: Tensor) -> Tensor:
    """``values[code]`` for an integer-valued ``code``: one GATHER from a shared table."""
    table = _table(g, values, (len(values),))
    return Tensor(g.add_op(Op.GATHER, [table.edge, code.cast(dt.i32).edge]))


def _pow2s(lo: int, n: int) -> list[float]:
    return [2.0 ** -(lo + k) for k in range(n)]


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
    sc, mn = _k_scale_min(u8, nb, 144)
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


def _q5(g: Graph, w: dict[str, Tensor], nb: sint, with_min: bool) -> Tensor:
    # block_q5_0: f16 d; u8 qh[4]; u8 qs[16]. block_q5_1: f16 d, f16 m; qh; qs. With
    # j = 16h + 8lh + lb: q = ((qs[8lh + lb] >> 4h) & 15) | (((qh[2h + lh] >> lb) & 1) << 4);
    # Q5_0: y = (q - 16) * d; Q5_1: y = q * d + m
    size, hoff = (24, 4) if with_min else (22, 2)
    shape = (nb, 2, 2, 8)
    qs = _at(w["u8"], shape, size, lambda h, lh, lb: _lin(hoff + 4, sym.mul(lh, 8), lb))
    qh = _f(_at(w["u8"], shape, size, lambda h, lh, lb: _lin(hoff, sym.mul(h, 2), lh)))
    hi = _bits(qh, _table(g, _pow2s(0, 8), (8,)), 1)
    q = _nibble(g, qs, (2, 1, 1)).add(hi.mul(16.0))
    d = _f(_read(w["f16"], shape, lambda b, *_: _b(b, size // 2)))
    if with_min:
        m = _f(_read(w["f16"], shape, lambda b, *_: _b(b, size // 2, 1)))
        return q.mul(d).add(m).reshape(nb, 32)
    return q.add(-16.0).mul(d).reshape(nb, 32)


def _q5_0(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    return _q5(g, w, nb, with_min=False)


def _q5_1(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    return _q5(g, w, nb, with_min=True)


def _q2_k(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_q2_K: u8 scales[16] (low 4 bits scale, high 4 bits min); u8 qs[64]; f16 d, dmin.
    # y[128n + 32s + 16lh + ll] = d*sc[j]*((qs[32n + 16lh + ll] >> 2s) & 3) - dmin*mn[j] with
    # sub-block j = 8n + 2s + lh
    shape = (nb, 2, 4, 2, 16)  # n, s, lh, ll
    u8 = w["u8"]
    sb = _f(_at(u8, shape, 84, lambda n, s, lh, ll: _lin(sym.mul(n, 8), sym.mul(s, 2), lh)))
    qs = _f(_at(u8, shape, 84, lambda n, s, lh, ll: _lin(16, sym.mul(n, 32), sym.mul(lh, 16), ll)))
    d = _f(_read(w["f16"], shape, lambda b, *_: _b(b, 42, 40)))
    dmin = _f(_read(w["f16"], shape, lambda b, *_: _b(b, 42, 41)))
    q = _bits(qs, _table(g, [1.0, 1 / 4, 1 / 16, 1 / 64], (4, 1, 1)), 2)
    sc, mn = _bits(sb, 0, 4), _bits(sb, 4, 4)
    return d.mul(sc).mul(q).add(dmin.mul(mn).mul(-1.0)).reshape(nb, 256)


def _q3_k(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_q3_K: u8 hmask[32]; u8 qs[64]; u8 scales[12] (16 six-bit scales, biased by 32);
    # f16 d. For y[128n + 32s + 16lh + ll] with l = 16lh + ll and sub-block j = 8n + 2s + lh:
    # q = ((qs[32n + l] >> 2s) & 3) - 4 * (1 - ((hmask[l] >> (4n + s)) & 1)),
    # scale = ((scales[j % 8] >> 4(j / 8)) & 15 | ((scales[8 + j % 4] >> 2(j / 4)) & 3) << 4) - 32
    shape = (nb, 2, 4, 2, 16)  # n, s, lh, ll
    u8 = w["u8"]

    def l_(lh: sint, ll: sint) -> sint:
        return sym.add(sym.mul(lh, 16), ll)

    ql = _f(_at(u8, shape, 110, lambda n, s, lh, ll: _lin(32, sym.mul(n, 32), l_(lh, ll))))
    hm = _f(_at(u8, shape, 110, lambda n, s, lh, ll: l_(lh, ll)))
    lo_b = _f(_at(u8, shape, 110, lambda n, s, lh, ll: _lin(96, sym.mul(s, 2), lh)))
    hi_b = _f(_at(u8, shape, 110, lambda n, s, lh, ll: _lin(104, sym.mul(sym.mod(s, 2), 2), lh)))
    q2 = _bits(ql, _table(g, [1.0, 1 / 4, 1 / 16, 1 / 64], (4, 1, 1)), 2)
    hbit = _bits(hm, _table(g, _pow2s(0, 8), (2, 4, 1, 1)), 1)
    q = q2.add(hbit.mul(4.0)).add(-4.0)
    sc_lo = _bits(lo_b, _table(g, [1.0, 1 / 16], (2, 1, 1, 1)), 4)
    sc_hi = _bits(hi_b, _table(g, [2.0 ** -(2 * (2 * n + s // 2)) for n in range(2)
                                   for s in range(4)], (2, 4, 1, 1)), 2)  # fmt: skip
    sc = sc_lo.add(sc_hi.mul(16.0)).add(-32.0)
    d = _f(_read(w["f16"], shape, lambda b, *_: _b(b, 55, 54)))
    return d.mul(sc).mul(q).reshape(nb, 256)


def _k_scale_min(u8: Tensor, nb: sint, size: int) -> tuple[Tensor, Tensor]:
    """The eight 6-bit scales and mins of a Q4_K/Q5_K block (get_scale_min_k4), as (nb, 8);
    the 12 scale bytes start at byte 4."""

    def sb(off: int) -> Tensor:  # scales[off + k], k < 4, as (nb, 4)
        return _f(_read(u8, (nb, 4), lambda b, k: _b(b, size, sym.add(4 + off, k))))

    s0, s4, s8 = sb(0), sb(4), sb(8)
    sc = _cat_last(_bits(s0, 0, 6), _bits(s8, 0, 4).add(_bits(s0, 6, 2).mul(16.0)))
    mn = _cat_last(_bits(s4, 0, 6), _bits(s8, 4, 4).add(_bits(s4, 6, 2).mul(16.0)))
    return sc, mn


def _q5_k(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_q5_K: f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]. Sub-block s = 2j + h:
    # y[64j + 32h + l] = d*sc[s]*(((qs[32j + l] >> 4h) & 15) | ((qh[l] >> s) & 1) << 4)
    # - dmin*mn[s]
    u8 = w["u8"]
    sc, mn = _k_scale_min(u8, nb, 176)
    shape = (nb, 4, 2, 32)
    d = _f(_read(w["f16"], (nb, 1), lambda b, _: _b(b, 88)))
    dmin = _f(_read(w["f16"], (nb, 1), lambda b, _: _b(b, 88, 1)))
    scale = sc.mul(d).reshape(nb, 4, 2, 1).expand(shape)
    offset = mn.mul(dmin).reshape(nb, 4, 2, 1).expand(shape)
    qs = _at(u8, shape, 176, lambda j, h, e: _lin(48, sym.mul(j, 32), e))
    qh = _f(_at(u8, shape, 176, lambda j, h, e: sym.add(16, e)))
    hi = _bits(qh, _table(g, _pow2s(0, 8), (4, 2, 1)), 1)
    q = _nibble(g, qs, (2, 1)).add(hi.mul(16.0))
    return scale.mul(q).add(offset.mul(-1.0)).reshape(nb, 256)


IQ4_LEVELS = [-127.0, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
# e2m1 codes (sign, 2 exponent bits, 1 mantissa bit) doubled, as ggml's kvalues_mxfp4
E2M1_X2 = [0.0, 1, 2, 3, 4, 6, 8, 12, -0.0, -1, -2, -3, -4, -6, -8, -12]


def _iq4_nl(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_iq4_nl: f16 d; u8 qs[16]. y[16h + l] = d * levels[(qs[l] >> 4h) & 15]
    shape = (nb, 2, 16)
    q = _at(w["u8"], shape, 18, lambda h, e: sym.add(2, e))
    d = _f(_read(w["f16"], shape, lambda b, *_: _b(b, 9)))
    return d.mul(_lookup(g, IQ4_LEVELS, _nibble(g, q, (2, 1)))).reshape(nb, 32)


def _iq4_xs(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_iq4_xs: f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]. Sub-block j of 32:
    # scale = ((scales_l[j/2] >> 4(j%2)) & 15 | ((scales_h >> 2j) & 3) << 4) - 32;
    # y[32j + 16h + l] = d * scale * levels[(qs[16j + l] >> 4h) & 15]
    u8 = w["u8"]
    lo = _f(_read(u8, (nb, 4, 2), lambda b, k, h: _b(b, 136, sym.add(4, k))))
    lo = _bits(lo, _table(g, [1.0, 1 / 16], (2,)), 4)
    hi = _f(_read(u8, (nb, 2, 4), lambda b, k, h: _b(b, 136, sym.add(2, k))))
    hi = _bits(hi, _table(g, [1.0, 1 / 4, 1 / 16, 1 / 64], (4,)), 2)
    sc = lo.reshape(nb, 8).add(hi.reshape(nb, 8).mul(16.0)).add(-32.0)
    d = _f(_read(w["f16"], (nb, 1), lambda b, _: _b(b, 68)))
    shape = (nb, 8, 2, 16)
    scale = d.mul(sc).reshape(nb, 8, 1, 1).expand(shape)
    q = _at(u8, shape, 136, lambda j, h, e: _lin(8, sym.mul(j, 16), e))
    return scale.mul(_lookup(g, IQ4_LEVELS, _nibble(g, q, (2, 1)))).reshape(nb, 256)


# 2^(e - 128): ggml_e8m0_to_fp32_half (an e8m0 scale with the e2m1 table's factor 2 taken out;
# 255 is 2^127 here, where OCP MX makes it NaN)
E8M0_HALF = [float(np.ldexp(np.float32(1.0), e - 128)) for e in range(256)]


def _ue4m3(c: int) -> float:
    """ggml_ue4m3_to_fp32 * 0.5: an unsigned e4m3 scale (the sign bit ignored, 0x7f is 0)
    with the e2m1 table's factor 2 taken out."""
    e, m = (c >> 3) & 15, c & 7
    v = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return 0.0 if c in (0, 0x7F) else v * 0.5


UE4M3_HALF = [_ue4m3(c) for c in range(256)]


def _mxfp4(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_mxfp4: u8 e (e8m0); u8 qs[16]. y[16h + l] = 2^(e-128) * e2m1x2[(qs[l] >> 4h) & 15]
    shape = (nb, 2, 16)
    q = _at(w["u8"], shape, 17, lambda h, e: sym.add(1, e))
    e = _f(_read(w["u8"], (nb, 1, 1), lambda b, *_: _b(b, 17)))
    v = _lookup(g, E2M1_X2, _nibble(g, q, (2, 1)))
    return v.mul(_lookup(g, E8M0_HALF, e)).reshape(nb, 32)


def _nvfp4(g: Graph, w: dict[str, Tensor], nb: sint) -> Tensor:
    # block_nvfp4 (64 values): u8 d[4] (ue4m3 per 16); u8 qs[32]. Sub-block k:
    # y[16k + 8h + l] = ue4m3(d[k]) / 2 * e2m1x2[(qs[8k + l] >> 4h) & 15]
    shape = (nb, 4, 2, 8)
    q = _at(w["u8"], shape, 36, lambda k, h, e: _lin(4, sym.mul(k, 8), e))
    d = _f(_read(w["u8"], (nb, 4, 1, 1), lambda b, k, *_: _b(b, 36, k)))
    v = _lookup(g, E2M1_X2, _nibble(g, q, (2, 1)))
    return v.mul(_lookup(g, UE4M3_HALF, d)).reshape(nb, 64)


FORMATS: dict[str, Format] = {
    "Q4_0": Format("Q4_0", 32, 18, ("u8", "f16"), _q4_0),
    "Q4_1": Format("Q4_1", 32, 20, ("u8", "f16"), _q4_1),
    "Q8_0": Format("Q8_0", 32, 34, ("i8", "f16"), _q8_0),
    "Q4_K": Format("Q4_K", 256, 144, ("u8", "f16"), _q4_k),
    "Q6_K": Format("Q6_K", 256, 210, ("u8", "i8", "f16"), _q6_k),
    "Q5_0": Format("Q5_0", 32, 22, ("u8", "f16"), _q5_0),
    "Q5_1": Format("Q5_1", 32, 24, ("u8", "f16"), _q5_1),
    "Q2_K": Format("Q2_K", 256, 84, ("u8", "f16"), _q2_k),
    "Q3_K": Format("Q3_K", 256, 110, ("u8", "f16"), _q3_k),
    "Q5_K": Format("Q5_K", 256, 176, ("u8", "f16"), _q5_k),
    "IQ4_NL": Format("IQ4_NL", 32, 18, ("u8", "f16"), _iq4_nl),
    "IQ4_XS": Format("IQ4_XS", 256, 136, ("u8", "f16"), _iq4_xs),
    "MXFP4": Format("MXFP4", 32, 17, ("u8",), _mxfp4),
    "NVFP4": Format("NVFP4", 64, 36, ("u8",), _nvfp4),
}


@dataclass(frozen=True)
class BlockTag:
    """A node holding a weight's dequantized blocks, as (blocks, ``block``) values."""

    fmt: str
    block: int


# node id -> tag, per graph: lets a pass find the products of quantized weights
# (compiler/actquant.py) without matching each format's expression
_TAGS: weakref.WeakKeyDictionary[AnyGraph, dict[int, BlockTag]] = weakref.WeakKeyDictionary()


def block_tag(g: AnyGraph, node: Node) -> BlockTag | None:
    """The format of the weight whose dequantized blocks ``node`` (of ``g``) holds, if any."""
    return _TAGS.get(g, {}).get(node.id)


def tagged_graph(g: AnyGraph) -> bool:
    return bool(_TAGS.get(g))


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
    blocks = f.build(g, ws, rows * cols // f.block)
    # the products it feeds may take int8 activations (compiler/actquant.py)
    _TAGS.setdefault(g, {})[blocks.node.id] = BlockTag(f.name, f.block)
    return blocks.reshape(rows, cols)


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
