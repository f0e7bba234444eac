"""A jammed kernel's tasks (``K.Schedule.jam``; ``compiler/schedule.py::jammed``): a task is a
block of ``jam`` indices of the jammed dim at one chunk of the innermost dim. For each element
of the chunk, every reduction along the jammed dim runs one loop for the whole block, one
accumulator per index, and what the copies of its body share (a weight's loads and
dequantization) is emitted once per iteration: the emitter's memo finds the equal subtrees.

The last block of a dim whose extent is not a multiple of ``jam`` runs its indices in
smaller blocks, one per binary digit of their count (7 of a jam of 8: 4, 2, 1), so a decode
step's one row runs the plain kernel's code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...compiler import kernel_ir as K
from ...compiler.schedule import jammed
from ...graph import symbolic as sym
from ...graph.ops import Op
from ...graph.symbolic import sint
from ...graph.view import contiguous_strides
from .vector import blocked_sum

if TYPE_CHECKING:
    from ..cstyle import Emitter


def jam_reduce(em: Emitter, rs: list[K.Reduce], ind: str) -> list[str]:
    """The copies ``rs`` of one reduction (alike but for the jammed index) in one loop; the C
    name of each result."""
    from ..cstyle import _blocked_sum, _c_name, cexpr, ctype, reduce_init, reduce_update

    r0 = rs[0]
    if em.simd_reductions and _blocked_sum(r0) and len(rs) > 1:
        got = blocked_sum(em, rs, ind)
        return got if got is not None else _blocked_scalar(em, rs, ind)
    if len(rs) == 1 or isinstance(r0.extent, int) and r0.extent <= 4:  # one, or written out
        return [em.emit(r, ind) for r in rs]
    for r in rs:
        em.hoist(r.body, frozenset({r.var.name}), ind)
    t = ctype(r0.dtype)
    accs = [em.tmp() for _ in rs]
    em.lines.append(f"{ind}{t} {', '.join(f'{a} = {reduce_init(r0.op, r0.dtype)}' for a in accs)};")
    rv = _c_name(r0.var)
    head = len(em.lines)
    em.lines.append(f"{ind}for ({em.index_type} {rv} = 0; {rv} < {cexpr(r0.extent)}; ++{rv}) {{")

    def body() -> None:
        xs = [em.emit(r.body, ind + "  ") for r in rs]
        for a, x in zip(accs, xs, strict=True):
            em.lines.append(f"{ind}  {a} = {reduce_update(r0.op, r0.dtype, a, x)};")

    em.block(body)
    em.lines.append(f"{ind}}}")
    if em.simd_reductions and r0.op is Op.SUM_REDUCE and r0.dtype.is_float:
        if not any("{" in ln or "}" in ln for ln in em.lines[head + 1 : -1]):
            # straight-line body: let the compiler reassociate these sums
            em.lines.insert(head, f"{ind}#pragma omp simd reduction(+:{','.join(accs)})")
    return accs


def _blocked_scalar(em: Emitter, rs: list[K.Reduce], ind: str) -> list[str]:
    """Split float sums (a short inner sum per block) the vector form does not cover: one
    array of partial sums per copy across the outer loop, as ``Emitter._blocked_sum``."""
    from ..cstyle import _c_name, cexpr, ctype

    r0 = rs[0]
    inner0 = r0.body
    assert isinstance(inner0, K.Reduce)
    inners = [r.body for r in rs]
    t, g = ctype(r0.dtype), inner0.extent
    ro, ri = _c_name(r0.var), _c_name(inner0.var)
    for x in inners:
        assert isinstance(x, K.Reduce)
        em.hoist(x.body, frozenset({r0.var.name, inner0.var.name}), ind)
    accvs = [em.tmp() for _ in rs]
    for a in accvs:
        em.lines.append(f"{ind}{t} {a}[{g}] = {{0}};")
    em.lines.append(f"{ind}for ({em.index_type} {ro} = 0; {ro} < {cexpr(r0.extent)}; ++{ro}) {{")

    def outer() -> None:
        for x in inners:
            assert isinstance(x, K.Reduce)
            em.hoist(x.body, frozenset({inner0.var.name}), ind + "  ")
        em.lines.append(f"{ind}  #pragma omp simd")
        em.lines.append(f"{ind}  for ({em.index_type} {ri} = 0; {ri} < {g}; ++{ri}) {{")

        def body() -> None:
            xs = [em.emit(x.body, ind + "    ") for x in inners]  # type: ignore[union-attr]
            for a, x in zip(accvs, xs, strict=True):
                em.lines.append(f"{ind}    {a}[{ri}] += {x};")

        em.block(body)
        em.lines.append(f"{ind}  }}")

    em.block(outer)
    em.lines.append(f"{ind}}}")
    out = []
    for a in accvs:
        acc = em.tmp()
        em.lines.append(f"{ind}{t} {acc} = 0;")
        em.lines.append(f"{ind}for (int j = 0; j < {g}; ++j) {acc} += {a}[j];")
        out.append(acc)
    return out


def _flat(shape: tuple[sint, ...], dim: int, var: sym.Expr) -> sint:
    """The output's flat index with ``var`` as dim ``dim``'s index."""
    out: sint = 0
    for j, (s, st) in enumerate(zip(shape, contiguous_strides(shape), strict=True)):
        out = sym.add(out, sym.mul(var if j == dim else sym.index_var(j, s), st))
    return out


def jam_task(
    em: Emitter,
    k: K.Kernel,
    lo: str,
    hi: str,
    store: Callable[[sint, str, str], str],
    ind: str = "    ",
) -> list[str]:
    """The lines of one task of jammed kernel ``k``: block ``i<d>`` of the jammed dim ``d``,
    elements ``lo .. hi`` of the innermost dim. ``store(flat index, C value, indent)`` writes
    one element."""
    from ..cstyle import _c_name, cexpr

    assert k.schedule is not None
    size, d = k.schedule.jam, k.schedule.jam_dim
    n = len(k.shape)
    inner_var = f"_i{n - 1}"
    iv = f"i{n - 1}"
    full = jammed(k)
    em.made += full.values
    flats = [_flat(k.shape, d, v) for v in full.vars]
    lines = [
        f"{ind}const int64_t lm_j0 = i{d} * {size}, "
        f"lm_jn = lm_min({size}, {cexpr(k.shape[d])} - lm_j0);"
    ]

    def block(m: int, base: str, bi: str) -> None:
        """Indices ``base .. base + m - 1`` of the jammed dim."""
        for j in range(m):
            lines.append(f"{bi}const int64_t {_c_name(full.vars[j])} = {base} + {j};")
        em.lines = []
        for j in range(m):
            em.hoist(full.values[j], frozenset({inner_var}), bi)
        lines.extend(em.lines)
        lines.append(f"{bi}for (int64_t {iv} = {lo}; {iv} < {hi}; ++{iv}) {{")

        def element() -> None:
            em.lines = []
            for grp in full.groups:
                for r, name in zip(grp[:m], jam_reduce(em, grp[:m], bi + "  "), strict=True):
                    em.scopes[-1][r] = name
            xs = [em.emit(full.values[j], bi + "  ") for j in range(m)]
            lines.extend(em.lines)
            lines.extend(store(flats[j], xs[j], bi + "  ") for j in range(m))

        em.block(element)
        lines.append(f"{bi}}}")

    lines.append(f"{ind}if (lm_jn == {size}) {{")
    em.block(lambda: block(size, "lm_j0", ind + "  "))
    lines.append(f"{ind}}} else {{")
    lines.append(f"{ind}  int64_t lm_jo = lm_j0;")
    p = 1
    while p * 2 < size:
        p *= 2
    while p >= 1:
        lines.append(f"{ind}  if (lm_jn & {p}) {{")
        em.block(lambda: block(p, "lm_jo", ind + "    "))  # noqa: B023 (called at once)
        lines.append(f"{ind}    lm_jo += {p};")
        lines.append(f"{ind}  }}")
        p //= 2
    lines.append(f"{ind}}}")
    return lines
