"""Matrix products as broadcast-multiply + SUM_REDUCE.

Every product here lays its operands out as (..., M, N, K) with the contracted axis K last and
sums over it: one MUL and one SUM_REDUCE, the shape the search recognizes as a GEMM. Batch
dims broadcast exactly as in ``torch.matmul``; 1-D operands get a unit dim that is removed
again.
"""

from __future__ import annotations

import string

from ..graph import dtypes as dt
from ..graph.symbolic import sint
from ..tensor import Tensor, broadcast_shapes
from ._base import same, shape_str

__all__ = [
    "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "dot", "einsum", "linear", "matmul", "mm",
    "mv", "outer",
]  # fmt: skip


def _promote(a: Tensor, b: Tensor, name: str) -> tuple[Tensor, Tensor]:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"{name}: expected Tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.dtype is dt.bool_ and b.dtype is dt.bool_:
        raise TypeError(f"{name}: not defined for bool tensors")
    d = dt.promote(a.dtype, b.dtype)
    return a.cast(d), b.cast(d)


def _mk_nk(a: Tensor, bt: Tensor, name: str, sa: tuple, sb: tuple) -> Tensor:
    """a (..., M, K) and bt (..., N, K) -> (..., M, N): the contracted axis is last."""
    (m, k), (n, k2) = a.shape[-2:], bt.shape[-2:]
    if not same(k, k2):
        raise ValueError(
            f"{name}: shapes {shape_str(sa)} and {shape_str(sb)} are incompatible "
            f"(inner dims {k} and {k2} differ)"
        )
    batch = broadcast_shapes(a.shape[:-2], bt.shape[:-2], name)
    full = tuple(batch) + (m, n, k)
    return a.unsqueeze(-2).expand(full).mul(bt.unsqueeze(-3).expand(full)).sum_reduce(-1)


def _t(x: Tensor) -> Tensor:
    order = list(range(x.ndim))
    order[-2], order[-1] = order[-1], order[-2]
    return x.permute(order)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``torch.matmul``: 1-D x 1-D is a dot product, 1-D operands are promoted to matrices
    (and the unit dim dropped), batch dims broadcast."""
    a, b = _promote(a, b, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"matmul: both arguments need at least 1 dim, got shapes "
            f"{shape_str(a.shape)} and {shape_str(b.shape)}"
        )
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    bt = b.unsqueeze(0) if b.ndim == 1 else _t(b)
    out = _mk_nk(a2, bt, "matmul", a.shape, b.shape)
    if b.ndim == 1:
        out = out.squeeze(-1)
    if a.ndim == 1:
        out = out.squeeze(-2 if b.ndim > 1 else -1)
    return out


def _need(name: str, *pairs: tuple[Tensor, int]) -> None:
    for t, nd in pairs:
        if t.ndim != nd:
            shapes = " and ".join(shape_str(x.shape) for x, _ in pairs)
            raise ValueError(
                f"{name}: expected {'/'.join(str(n) for _, n in pairs)}-D inputs, "
                f"got shapes {shapes}"
            )


def mm(a: Tensor, b: Tensor) -> Tensor:
    _need("mm", (a, 2), (b, 2))
    return matmul(a, b)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    _need("bmm", (a, 3), (b, 3))
    if not same(a.shape[0], b.shape[0]):
        raise ValueError(f"bmm: batch sizes differ: {shape_str(a.shape)} and {shape_str(b.shape)}")
    return matmul(a, b)


def mv(a: Tensor, v: Tensor) -> Tensor:
    _need("mv", (a, 2), (v, 1))
    return matmul(a, v)


def dot(a: Tensor, b: Tensor) -> Tensor:
    _need("dot", (a, 1), (b, 1))
    return matmul(a, b)


def outer(a: Tensor, b: Tensor) -> Tensor:
    _need("outer", (a, 1), (b, 1))
    a, b = _promote(a, b, "outer")
    return a.unsqueeze(1).mul(b.unsqueeze(0))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear``: x (..., in), weight (out, in) or (in,), bias (out,) -> (..., out)."""
    x, weight = _promote(x, weight, "linear")
    if weight.ndim not in (1, 2) or x.ndim == 0 or not same(x.shape[-1], weight.shape[-1]):
        raise ValueError(
            f"linear: input {shape_str(x.shape)} and weight {shape_str(weight.shape)} are "
            "incompatible (want input (..., in) and weight (out, in))"
        )
    if weight.ndim == 1:
        out = x.mul(weight.expand(x.shape)).sum_reduce(-1)
    else:
        full = tuple(x.shape[:-1]) + tuple(weight.shape)
        out = x.unsqueeze(-2).expand(full).mul(weight.expand(full)).sum_reduce(-1)
    if bias is not None:
        out = out.add(bias)
    return out


def _scaled_add(name: str, inp: Tensor, prod: Tensor, beta: float, alpha: float) -> Tensor:
    if alpha != 1:
        prod = prod.mul(alpha)
    if beta == 0:  # torch ignores ``input`` entirely (NaNs in it do not propagate)
        return prod
    try:
        broadcast_shapes(inp.shape, prod.shape, name)
    except ValueError:
        raise ValueError(
            f"{name}: input {shape_str(inp.shape)} does not broadcast to the product "
            f"{shape_str(prod.shape)}"
        ) from None
    return prod.add(inp if beta == 1 else inp.mul(beta))


def addmm(inp: Tensor, mat1: Tensor, mat2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    return _scaled_add("addmm", inp, mm(mat1, mat2), beta, alpha)


def baddbmm(inp: Tensor, b1: Tensor, b2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    return _scaled_add("baddbmm", inp, bmm(b1, b2), beta, alpha)


def addbmm(inp: Tensor, b1: Tensor, b2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """beta * inp + alpha * the sum over the batch of b1[i] @ b2[i]."""
    return _scaled_add("addbmm", inp, bmm(b1, b2).sum_reduce(0), beta, alpha)


def addmv(inp: Tensor, mat: Tensor, vec: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    return _scaled_add("addmv", inp, mv(mat, vec), beta, alpha)


def addr(inp: Tensor, vec1: Tensor, vec2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    return _scaled_add("addr", inp, outer(vec1, vec2), beta, alpha)


# ----------------------------------------------------------------------------- einsum

_Label = str | tuple[str, int]  # a letter, or ("...", k) for the k-th ellipsis dim from the right


def _parse_term(term: str, ndim: int | None, eq: str) -> list[_Label]:
    if term.count("...") > 1 or "." in term.replace("...", ""):
        raise ValueError(f"einsum: bad term {term!r} in {eq!r}")
    head, _, tail = term.partition("...")
    for c in head + tail:
        if c not in string.ascii_letters:
            raise ValueError(f"einsum: bad label {c!r} in {eq!r} (letters only)")
    if "..." not in term:
        return list(head)
    n = (ndim if ndim is not None else 0) - len(head) - len(tail)
    if n < 0:
        raise ValueError(f"einsum: term {term!r} has more labels than its operand has dims")
    return [*head, *[("...", n - 1 - j) for j in range(n)], *tail]


def einsum(equation: str, *operands: Tensor) -> Tensor:
    """A subset of ``torch.einsum``: letters and ``...``, implicit or explicit output,
    broadcasting of size-1 dims; no repeated label within one operand (diagonals)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {eq!r} names {len(terms)} operands, got {len(operands)}")
    labels = [_parse_term(t, op.ndim, eq) for t, op in zip(terms, operands, strict=True)]
    sizes: dict[_Label, sint] = {}
    for t, lab, op in zip(terms, labels, operands, strict=True):
        if len(lab) != op.ndim:
            raise ValueError(
                f"einsum: term {t!r} has {len(lab)} labels for an operand of shape "
                f"{shape_str(op.shape)}"
            )
        if len(set(lab)) != len(lab):
            raise ValueError(f"einsum: repeated label in {t!r} (diagonals) is not supported")
        for label, s in zip(lab, op.shape, strict=True):
            prev = sizes.get(label, 1)
            if not (same(prev, s) or same(s, 1) or same(prev, 1)):
                raise ValueError(f"einsum: label {label!r} has sizes {prev} and {s} in {eq!r}")
            sizes[label] = s if same(prev, 1) else prev
    ell = sorted({lb for lab in labels for lb in lab if isinstance(lb, tuple)}, key=lambda x: -x[1])
    if arrow:
        out = _parse_term(rhs, len(ell) + len(rhs.replace("...", "")), eq)
        if len(set(out)) != len(out) or any(lb not in sizes for lb in out):
            raise ValueError(
                f"einsum: output {rhs!r} repeats a label or names one not in the inputs"
            )
    else:
        counts = [lb for lab in labels for lb in lab if isinstance(lb, str)]
        out = [*ell, *sorted(c for c in set(counts) if counts.count(c) == 1)]
    order = out + [lb for lb in sizes if lb not in out]
    full = tuple(sizes[lb] for lb in order)
    d = operands[0].dtype
    for op in operands[1:]:
        d = dt.promote(d, op.dtype)
    prod: Tensor | None = None
    for lab, op in zip(labels, operands, strict=True):
        present = [lb for lb in order if lb in lab]
        x = op.cast(d).permute([lab.index(lb) for lb in present]) if op.ndim else op.cast(d)
        for k, lb in enumerate(order):
            if lb not in lab:
                x = x.unsqueeze(k)
        x = x.expand(full)
        prod = x if prod is None else prod.mul(x)
    assert prod is not None
    n_out = len(out)
    return prod.sum_reduce(list(range(n_out, len(order)))) if len(order) > n_out else prod
