"""The thread mappings both GPU renderers share, written once over a backend's names.

A ``Dialect`` names what differs between CUDA and Metal: the thread and group ids, the
barrier, the qualifier of group-shared memory, the kernel frame (parameters, how plan dims
arrive) and the subgroup (warp / simdgroup) reduction. Everything else is here: which
mapping a kernel gets (``choose_schedule``), the index type, and the schedules themselves:

- ``thread``: one thread per output element (two for 4-bit outputs, which share bytes);
  reductions inside run serially in that thread.
- ``row``: one group per row of the output (all dims but the last); reductions that do not
  depend on the last index (a row max, a row sum) run once, spread over the group's threads,
  then the threads stride over the row (softmax, layer norm).
- ``element``: one group per output element; its reduction is spread over the group
  (few outputs, long reductions).
- ``scatter``: threads over a row's elements, source rows in order (duplicate rows: the last
  one wins, as in the reference interpreter).

A group reduction: each thread folds a strided share, the subgroup reduces (every lane then
holds its subgroup's value), lane 0 of each subgroup writes a partial to shared memory, and
after one barrier every thread folds all partials, so no second barrier is needed. Types a
backend's subgroup functions do not take reduce as a tree in shared memory. Shared arrays are
declared at the top of the kernel (Metal allows them only there). Index arithmetic is 32-bit
when every index expression of the kernel provably fits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...compiler import kernel_ir as K
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import Op
from ...graph.symbolic import sint
from ...graph.view import contiguous_strides
from ..cstyle import Emitter, _c_name, cexpr, ctype, reduce_init, reduce_update, store_stmt

SUBGROUP = 32  # threads per warp (NVIDIA) and per simdgroup (Apple)
_I32 = 2**31


class Dialect(ABC):
    """A GPU backend's names. Subclasses set the fields and write the frame."""

    name = ""  # for messages
    group = ""  # this thread's group (block / threadgroup) position, a uint3
    local = ""  # this thread's position in its group
    groups = ""  # groups in the grid
    lane = ""  # this thread's lane in its subgroup
    subgroup = ""  # this thread's subgroup in its group
    barrier = ""  # a group barrier over shared memory, as a statement
    shared = ""  # the qualifier of group-shared arrays
    global_ = ""  # the qualifier of pointers into buffers (with its space)

    @abstractmethod
    def param(self, slot: int, ctype: str, restrict: bool) -> str:
        """Buffer parameter ``b{slot}`` (slot 0 is the output, written; the rest are read)."""
        ...

    @abstractmethod
    def frame(self, name: str, params: Sequence[str], n_dims: int, threads: int) -> str:
        """The kernel's first line, through its opening brace."""
        ...

    @abstractmethod
    def dim(self, i: int) -> str:
        """Plan dim ``i`` as the kernel reads it (an int64_t)."""
        ...

    @abstractmethod
    def subgroup_reduce(self, acc: str, op: Op, t: str, d: dt.DType) -> str | None:
        """A statement reducing ``acc`` (C type ``t``) over the subgroup, every lane getting
        the result; None when this backend's subgroup functions do not take ``t``."""
        ...


@dataclass
class Rendered:
    """A kernel's text and launch geometry (grids count groups, blocks threads)."""

    name: str
    source: str
    args: list[int]  # buffer ids: output first, then the buffers it reads
    grid: tuple[sint, sint, sint]
    block: tuple[int, int, int]
    schedule: str


def kernel_buffers(k: K.Kernel) -> tuple[list[int], dict[int, dt.DType]]:
    """The kernel's buffer ids (output first, then each buffer it reads once) and dtypes."""
    trees = [k.value] + ([k.scatter_row] if k.scatter_row is not None else [])
    dtypes: dict[int, dt.DType] = {}
    for t in trees:
        for v in K.walk(t):
            if isinstance(v, K.Load):
                dtypes[v.buf] = v.dtype
    args = [k.out] + sorted(b for b in dtypes if b != k.out)
    dtypes[k.out] = k.dtype
    return args, dtypes


# ------------------------------------------------------------------------------ analysis


def _exprs(v: K.Value) -> list[sint]:
    out: list[sint] = []
    for x in K.walk(v):
        if isinstance(x, K.Load):
            out += [x.index, x.valid]
        elif isinstance(x, K.IndexVal):
            out.append(x.expr)
        elif isinstance(x, K.Masked):
            out.append(x.valid)
        elif isinstance(x, (K.Reduce, K.SoftmaxSum)):
            out.append(x.extent)
        elif isinstance(x, K.Gather):
            out.append(x.rows)
    return out


def _fits_i32(exprs: Sequence[sint]) -> bool:
    """Every subexpression provably in [-2^31, 2^31)."""
    seen: set[int] = set()
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if isinstance(e, int):
            if not -_I32 <= e < _I32:
                return False
            continue
        if not isinstance(e, sym.Expr) or id(e) in seen:
            continue
        seen.add(id(e))
        if e.lo < -_I32 or e.hi >= _I32:
            return False
        if e.kind == "var":
            continue
        for a in e.args:
            if isinstance(a, tuple):  # ADD: ((term, coef), ...)
                for t in a:
                    stack.extend(t if isinstance(t, tuple) else (t,))
            else:
                stack.append(a)
    return True


def index_type(k: K.Kernel) -> str:
    """``int32_t`` when every index expression of ``k`` provably fits, else ``int64_t``."""
    exprs: list[sint] = [*k.shape, numel(k.shape), flat_store_index(k.shape), *_exprs(k.value)]
    if k.scatter_row is not None:
        exprs += _exprs(k.scatter_row) + [k.scatter_rows]
    return "int32_t" if _fits_i32(exprs) else "int64_t"


def numel(shape: Sequence[sint]) -> sint:
    n: sint = 1
    for s in shape:
        n = sym.mul(n, s)
    return n


def _has_reduce(v: K.Value) -> bool:
    return any(isinstance(x, K.Reduce) for x in K.walk(v))


def _row_reduces(k: K.Kernel) -> bool:
    """Some reduction is the same for a whole output row (it can be shared by a group)."""
    if not k.shape:
        return False
    last = frozenset({f"_i{len(k.shape) - 1}"})
    parts = K.invariant_parts(k.value, last, {})
    return any(_has_reduce(p) for p in parts)


def choose_schedule(k: K.Kernel) -> str:
    if k.scatter_row is not None:
        return "scatter"
    if k.dtype.packed or not _has_reduce(k.value):
        return "thread"
    n = len(k.shape)
    if n >= 1 and sym.upper_bound(k.shape[-1]) >= 32 and _row_reduces(k):
        return "row"
    reduces = [x for x in K.walk(k.value) if isinstance(x, K.Reduce)]
    if max(sym.upper_bound(r.extent) for r in reduces) < 64:
        return "thread"
    if sym.upper_bound(numel(k.shape)) <= 65536:
        return "element"  # too few outputs to fill the GPU with one thread each
    # many outputs: a group per output when its reduction reads memory contiguously and
    # neighbouring outputs do not (a matrix-vector product); else a thread per output. Only
    # the reductions' loads decide: a value read once per output (a residual added to the
    # product) is contiguous along the outputs but is not what the loop streams
    loads = [x for r in reduces for x in K.walk(r.body) if isinstance(x, K.Load)]
    along_r = any(_unit_stride(ld.index, r.var) for ld in loads for r in reduces)
    last = sym.index_var(n - 1, k.shape[-1]) if n else 0
    along_out = isinstance(last, sym.Expr) and any(_unit_stride(ld.index, last) for ld in loads)
    return "element" if along_r and not along_out else "thread"


def _unit_stride(index: sint, v: sym.Expr) -> bool:
    """``index`` advances by exactly 1 when ``v`` does."""
    if not isinstance(index, sym.Expr) or v not in index.vars():
        return False
    return sym.add(sym.substitute(index, {v.name: sym.add(v, 1)}), sym.mul(index, -1)) == 1


# ------------------------------------------------------------------------------ rendering


class GpuEmitter(Emitter):
    """The C emitter; a reduction met outside any loop or branch is shared by the group
    when ``group_reduce`` is set."""

    simd_reductions = False  # the CPU's vector idioms; GPU reductions spread over threads
    fast_exp2 = False  # exp2 is a hardware instruction on the GPU
    fast_log2 = False  # and log2

    def __init__(
        self,
        ptr_of: Callable[[int], str],
        dialect: Dialect,
        index_type: str,
        threads: int,
        group_reduce: bool,
    ) -> None:
        super().__init__(ptr_of)
        self.d = dialect
        self.index_type = index_type
        self.threads = threads
        self.group_reduce = group_reduce
        self.shared: list[str] = []  # shared arrays, declared at the top of the kernel

    def share(self, t: str, name: str, n: int) -> None:
        self.shared.append(f"  {self.d.shared} {t} {name}[{n}];")

    def _emit(self, v: K.Value, ind: str) -> str:
        if isinstance(v, K.Reduce) and self.group_reduce and len(self.scopes) == 1:
            return self._group_reduce(v, ind)
        return super()._emit(v, ind)

    def _group_reduce(self, v: K.Reduce, ind: str) -> str:
        t, init = ctype(v.dtype), reduce_init(v.op, v.dtype)
        self.hoist(v.body, frozenset({v.var.name}), ind)
        acc, sh = self.tmp(), self.tmp()
        rv, ix, n, d = _c_name(v.var), self.index_type, self.threads, self.d
        L = self.lines.append
        L(f"{ind}{t} {acc} = {init};")
        L(f"{ind}for ({ix} {rv} = ({ix}){d.local}.x; {rv} < {cexpr(v.extent)}; {rv} += {n}) {{")

        def body() -> None:
            x = self.emit(v.body, ind + "  ")
            L(f"{ind}  {acc} = {reduce_update(v.op, v.dtype, acc, x)};")

        self.block(body)
        L(f"{ind}}}")
        bar = f"{ind}{d.barrier};"
        sub = d.subgroup_reduce(acc, v.op, t, v.dtype)
        if sub is None:  # a tree in shared memory (n is a power of two)
            self.share(t, sh, n)
            L(f"{ind}{sh}[{d.local}.x] = {acc};")
            L(bar)
            upd = reduce_update(v.op, v.dtype, f"{sh}[{d.local}.x]", f"{sh}[{d.local}.x + s]")
            L(f"{ind}for (uint32_t s = {n // 2}; s > 0; s >>= 1) {{ if ({d.local}.x < s) "
              f"{sh}[{d.local}.x] = {upd}; {d.barrier}; }}")  # fmt: skip
            L(f"{ind}{acc} = {sh}[0];")
            return acc
        # every lane runs the subgroup reduction: never inside a conditional
        L(f"{ind}{sub}")
        if n > SUBGROUP:
            groups = n // SUBGROUP
            self.share(t, sh, groups)
            L(f"{ind}if ({d.lane} == 0) {sh}[{d.subgroup}] = {acc};")
            L(bar)
            L(f"{ind}{acc} = {init};")
            fold = reduce_update(v.op, v.dtype, acc, f"{sh}[j]")
            L(f"{ind}for (int j = 0; j < {groups}; ++j) {acc} = {fold};")
        return acc


def unflatten_lines(
    flat: str, shape: Sequence[sint], first: int, ix: str, ind: str, tag: str
) -> list[str]:
    """Declare index vars i{first}.. of ``shape`` from the flat index ``flat``."""
    lines: list[str] = []
    n = len(shape)
    if n == 0:
        return lines
    rem = flat
    for j in range(n - 1, -1, -1):
        v = f"i{first + j}"
        if j == 0:
            lines.append(f"{ind}const {ix} {v} = {rem}; (void){v};")
        else:
            e = cexpr(shape[j])
            lines.append(f"{ind}const {ix} {v} = {rem} % {e}; (void){v};")
            lines.append(f"{ind}const {ix} q{tag}{first + j} = {rem} / {e};")
            rem = f"q{tag}{first + j}"
    return lines


def flat_store_index(shape: Sequence[sint], first: int = 0) -> sint:
    flat: sint = 0
    for j, (s, st) in enumerate(zip(shape, contiguous_strides(shape), strict=True)):
        flat = sym.add(flat, sym.mul(sym.index_var(first + j, s), st))
    return flat


def schedule_body(
    k: K.Kernel, em: GpuEmitter, schedule: str, threads: int
) -> tuple[list[str], sint]:
    """The kernel body of a shared ``schedule`` and its grid (groups along x)."""
    d, ix, shape, n = em.d, em.index_type, k.shape, len(k.shape)
    ind = "  "
    body: list[str] = []
    n_el = numel(shape)

    def store(val: str, ind: str) -> str:
        return ind + store_stmt("b0", cexpr(flat_store_index(shape)), val, k.dtype)

    grid: sint
    if schedule == "thread":
        per = 2 if k.dtype.packed else 1
        grid = sym.ceildiv(n_el, threads * per)
        body.append(f"  const {ix} t0 = ({ix}){d.group}.x * {threads} + ({ix}){d.local}.x;")
        body.append(
            f"  for ({ix} t = t0 * {per}; t < t0 * {per} + {per} && t < {cexpr(n_el)}; ++t) {{"
        )
        body += unflatten_lines("t", shape, 0, ix, "    ", "")
        em.lines = []
        em.block(lambda: em.lines.append(store(em.emit(k.value, "    "), "    ")))
        body += em.lines + ["  }"]
    elif schedule == "row":
        grid = numel(shape[:-1])
        body.append(f"  const {ix} t = ({ix}){d.group}.x;")
        body += unflatten_lines("t", shape[:-1], 0, ix, ind, "")
        em.lines = []
        em.hoist(k.value, frozenset({f"_i{n - 1}"}), ind)
        last = f"i{n - 1}"
        em.lines.append(f"  for ({ix} {last} = ({ix}){d.local}.x; {last} < {cexpr(shape[-1])}; "
                        f"{last} += {threads}) {{")  # fmt: skip
        em.block(lambda: em.lines.append(store(em.emit(k.value, "    "), "    ")))
        body += em.lines + ["  }"]
    elif schedule == "element":
        grid = n_el
        body.append(f"  const {ix} t = ({ix}){d.group}.x;")
        body += unflatten_lines("t", shape, 0, ix, ind, "")
        em.lines = []
        val = em.emit(k.value, ind)
        body += em.lines
        body.append(f"  if ({d.local}.x == 0) {store(val, '')}")
    elif schedule == "scatter":
        assert k.scatter_row is not None
        rows_shape, inner_shape = shape[: k.row_dims], shape[k.row_dims :]
        inner_n, rows_n = numel(inner_shape), numel(rows_shape)
        grid = 1 if threads == 1 else sym.ceildiv(inner_n, threads)
        row_size = cexpr(inner_n)
        inner_flat = cexpr(flat_store_index(inner_shape, k.row_dims))
        body.append(f"  for ({ix} u = ({ix}){d.group}.x * {threads} + ({ix}){d.local}.x; "
                    f"u < {row_size}; u += ({ix}){d.groups}.x * {threads}) {{")  # fmt: skip
        body += unflatten_lines("u", inner_shape, k.row_dims, ix, "    ", "u")
        body.append(f"    for ({ix} r = 0; r < {cexpr(rows_n)}; ++r) {{")
        body += unflatten_lines("r", rows_shape, 0, ix, "      ", "r")

        def sbody() -> None:
            val = em.emit(k.value, "      ")
            assert k.scatter_row is not None
            row = em.emit(k.scatter_row, "      ")
            em.lines.append(f"      {{ const int64_t row = (int64_t)({row});")
            em.lines.append(f"        if (row >= 0 && row < {cexpr(k.scatter_rows)}) "
                            + store_stmt("b0", f"row * {row_size} + {inner_flat}", val, k.dtype)
                            + " }")  # fmt: skip

        em.lines = []
        em.block(sbody)
        body += em.lines + ["    }", "  }"]
    else:
        raise ValueError(f"unknown {d.name} schedule {schedule!r}")
    return body, grid


def params(k: K.Kernel, d: Dialect, args: list[int], dtypes: dict[int, dt.DType]) -> list[str]:
    """The buffer parameters; the output is not ``restrict`` when the kernel reads it too."""
    reads_out = any(isinstance(v, K.Load) and v.buf == k.out for v in K.walk(k.value))
    return [d.param(i, dtypes[b].c_type, not (reads_out and b == k.out))
            for i, b in enumerate(args)]  # fmt: skip


def assemble(
    d: Dialect,
    k: K.Kernel,
    prelude: str,
    args: list[int],
    dtypes: dict[int, dt.DType],
    em: GpuEmitter,
    body: list[str],
    dim_names: Sequence[str],
) -> str:
    """The kernel's source: prelude, frame, shared arrays, the dims, the body."""
    head = d.frame(k.name, params(k, d, args, dtypes), len(dim_names), em.threads)
    dims = dim_lines(d, dim_names, em.index_type)
    return prelude + "\n".join([head, *em.shared, *dims, *body, "}"]) + "\n"


def dim_lines(d: Dialect, dim_names: Sequence[str], ix: str) -> list[str]:
    """Every plan dim as ``d_<name>`` of type ``ix``."""
    return [f"  const {ix} d_{name} = ({ix}){d.dim(i)}; (void)d_{name};"
            for i, name in enumerate(dim_names)]  # fmt: skip


def render(
    d: Dialect,
    k: K.Kernel,
    dim_names: Sequence[str],
    prelude: str,
    schedule: str,
    threads: int,
) -> Rendered:
    """One kernel (already folded) under a shared ``schedule`` with ``threads`` per group."""
    args, dtypes = kernel_buffers(k)
    slot = {b: i for i, b in enumerate(args)}
    em = GpuEmitter(lambda b: f"b{slot[b]}", d, index_type(k), threads,
                    schedule in ("row", "element"))  # fmt: skip
    body, grid = schedule_body(k, em, schedule, threads)
    source = assemble(d, k, prelude, args, dtypes, em, body, dim_names)
    return Rendered(k.name, source, args, (grid, 1, 1), (threads, 1, 1), schedule)
