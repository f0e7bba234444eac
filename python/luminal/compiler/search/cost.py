"""The search's cost model: a run-time estimate of a cut-out program from the bytes it moves,
the arithmetic it does and the steps it launches. It only ranks candidates (which few are
measured); measurement decides. The constants are the target's (``target.CostModel``): round
numbers; what matters is the order they give (a target's ``reduce_speedup`` is set by
products it measured, and says which).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ...graph import symbolic as sym
from .. import kernel_ir as K
from ..lower import Lowered
from ..schedule import JAM_ROW_BYTES, apply, jam_row_bytes
from ..target import CostModel

DEFAULT = CostModel()

# kernels with their schedule applied, by kernel object (held with the entry, so its id is not
# reused while the entry lives): the search estimates each candidate at two sizes and groups
# it by its resolved schedule, and applying a schedule rewrites the whole value tree
APPLIED_KEPT = 1024
_APPLIED: OrderedDict[int, tuple[K.Kernel, K.Kernel]] = OrderedDict()


def applied(k: K.Kernel) -> K.Kernel:
    """``schedule.apply(k)``, kept."""
    hit = _APPLIED.get(id(k))
    if hit is not None and hit[0] is k:
        _APPLIED.move_to_end(id(k))
        return hit[1]
    out = apply(k)
    assert isinstance(out, K.Kernel)
    _APPLIED[id(k)] = (k, out)
    if len(_APPLIED) > APPLIED_KEPT:
        _APPLIED.popitem(last=False)
    return out


def _num(e: sym.sint, dims: dict[str, int]) -> float:
    return float(sym.evaluate(e, dims))


def _divmods(e: sym.sint) -> int:
    if not isinstance(e, sym.Expr):
        return 0
    n = 1 if e.kind in (sym.DIV, sym.MOD) else 0
    if e.kind == sym.ADD:
        return n + sum(_divmods(t) for t, _ in e.args[0])
    if e.kind == sym.VAR:
        return n
    return n + sum(_divmods(a) for a in e.args)


@dataclass
class _Share:
    """A jam (``K.Schedule.jam``, ``jam2``): what does not depend on a jammed dim's variable
    is computed that dim's ``factors[var]`` times per element (once per block of it)."""

    factors: dict[str, float]
    fv: dict[int, frozenset[str]] = field(default_factory=dict)
    plain: dict[int, float] = field(default_factory=dict)  # _ops memo without the jam

    def of(self, v: K.Value) -> float:
        """Times ``v`` is computed per element: the product of the factors of the jammed dims
        it does not depend on (1 when it depends on them all)."""
        fv = K.free_vars(v, self.fv)
        out = 1.0
        for var, f in self.factors.items():
            if var not in fv:
                out *= f
        return out


def _ops(
    v: K.Value,
    dims: dict[str, int],
    memo: dict[int, float],
    m: CostModel,
    share: _Share | None = None,
) -> float:
    """Simple operations to compute ``v`` once (shared subtrees counted where they occur)."""
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    out: float
    if share is not None and (f := share.of(v)) != 1.0:
        out = _ops(v, dims, share.plain, m) * f
        memo[id(v)] = out
        return out
    rec = lambda x: _ops(x, dims, memo, m, share)  # noqa: E731
    if isinstance(v, K.Load):
        out = 1 + m.divmod * (_divmods(v.index) + _divmods(v.valid))
    elif isinstance(v, (K.Const, K.IndexVal)):
        out = 0.0
    elif isinstance(v, K.Alu):
        out = 1 + sum(rec(s) for s in v.srcs)
    elif isinstance(v, K.Cast):
        out = 1 + rec(v.src)
    elif isinstance(v, K.Masked):
        out = 1 + rec(v.value)
    elif isinstance(v, K.Reduce):
        n = _num(v.extent, dims)
        body = rec(v.body)
        # an outer loop over split blocks pays a little per pass; the inner loop is the work
        out = n * (body + (m.block if isinstance(v.body, K.Reduce) else 1))
    elif isinstance(v, K.Gather):
        out = 2 + rec(v.row) + rec(v.body)
    else:
        n = _num(v.extent, dims)
        out = n * (4 + rec(v.score) + rec(v.weight))
    memo[id(v)] = out
    return out


def estimate(sub: Lowered, dims: dict[str, int], m: CostModel = DEFAULT) -> float:
    """Estimated seconds for one run of ``sub`` at ``dims`` (kernels with their schedule)."""
    nbytes = sum(_num(b.nbytes(), dims) for b in sub.buffers)
    total = nbytes / m.bandwidth
    for step in sub.kernels:
        total += m.launch
        if isinstance(step, K.LibCall):
            f = step.fields
            flops = 2.0
            for name in ("m", "n", "k", "batch"):
                flops *= _num(f.get(name, 1), dims)  # type: ignore[arg-type]
            total += flops / (m.ops * m.library_speedup)
            continue
        k = applied(step)
        points = 1.0
        for s in k.shape:
            points *= _num(s, dims)
        share = _jam_share(k, dims)
        # a reducing kernel's loops, its operations and its re-reads alike (so its schedules
        # rank among themselves as without the speedup)
        work = points * _ops(k.value, dims, {}, m, share) / m.ops
        work += _reread_bytes(k, sub, dims, m, share) / m.cache_bandwidth
        reduces = any(isinstance(x, K.Reduce) for x in K.walk(k.value))
        total += work / m.reduce_speedup if reduces else work
    return total


def _blocks(n: int, size: int) -> int:
    """Blocks ``n`` indices run in: ``size`` at a time, the rest in its binary digits."""
    return n // size + bin(n % size).count("1")


def _jam_share(k: K.Kernel, dims: dict[str, int]) -> _Share | None:
    """The jams of ``k``'s schedule as cost factors: blocks run per index of each jammed dim
    (the outer one in blocks of ``jam``; the innermost in blocks of ``jam2`` within each task's
    chunk of it)."""
    sched = k.schedule
    if sched is None:
        return None
    factors: dict[str, float] = {}
    if sched.jam > 1:
        ext = int(_num(k.shape[sched.jam_dim], dims))
        # a block's rows past the L1 (schedule.JAM_ROW_BYTES) are read again from a further
        # cache for every column, which costs it what the larger block saves: it shares as
        # half as many rows would (so jams of 8 and 4 tie there, and both are measured)
        jam = sched.jam
        if jam > 2 and jam * jam_row_bytes(k, sched.jam_dim) > JAM_ROW_BYTES:
            jam //= 2
        if ext >= 1:
            factors[f"_i{sched.jam_dim}"] = _blocks(ext, jam) / ext
    if sched.jam2 > 1:
        ext = int(_num(k.shape[-1], dims))
        chunk = -(-(sched.chunk or 16) // sched.jam2) * sched.jam2  # as code generation does
        if ext >= 1:
            whole = ext // chunk * _blocks(chunk, sched.jam2)
            factors[f"_i{len(k.shape) - 1}"] = (whole + _blocks(ext % chunk, sched.jam2)) / ext
    return _Share(factors) if factors else None


def _reread_bytes(
    k: K.Kernel, sub: Lowered, dims: dict[str, int], m: CostModel, share: _Share | None = None
) -> float:
    """Bytes a kernel whose elements each run a reduction reads again because of its task
    order (``K.Schedule.order``): in the default order a thread sweeps every column for each
    outer index, re-reading an operand that only the columns index (a weight) once per outer
    index; in order 1 it sweeps every outer index for each chunk of columns, re-reading an
    operand only the outer indices index (the activations) once per chunk. Operands that fit
    a core's cache are re-read for free. A jam reads the weight once per block of rows."""
    n = len(k.shape)
    if n < 2 or not any(isinstance(x, K.Reduce) for x in K.walk(k.value)):
        return 0.0
    inner = f"_i{n - 1}"
    outer_vars = {f"_i{j}" for j in range(n - 1)}
    outer = 1.0
    for s in k.shape[:-1]:
        outer *= _num(s, dims)
    sched = k.schedule or K.Schedule()
    chunk = sched.chunk or 16
    chunks = -(-_num(k.shape[-1], dims) // chunk)
    uses: dict[int, set[str]] = {}
    for x in K.walk(k.value):
        if isinstance(x, K.Load):
            uses.setdefault(x.buf, set()).update(sym.var_names(x.index))
    rows = 1.0  # a block of rows reads the weight once
    for var, f in (share.factors if share else {}).items():
        rows *= f if var in outer_vars else 1.0
    total = 0.0
    for buf, names in uses.items():
        size = _num(sub.buffers[buf].nbytes(), dims)
        if size <= m.cache_bytes:
            continue
        if sched.order == 0 and inner in names and not names & outer_vars:
            total += (outer * rows - 1) * size
        elif sched.order == 1 and inner not in names and names & outer_vars:
            total += (chunks - 1) * size
    return total
