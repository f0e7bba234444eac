"""Recognize a sum of products as a GEMM library call, an alternative to the generated kernel.

The matmul of luminal.functional is a broadcast multiply and a SUM_REDUCE, so after lowering a
kernel holds ``Reduce_k(A[idx_a] * B[idx_b])`` at each output point (..., m, n). The rule's
premises pin everything a library GEMM needs: operands read without padding, both f32 or both
one half type widened to f32 (bf16 or f16: their products are exact in f32, so the call sums
the same products as the kernel), the sum in f32, index
expressions affine in (batch, m, n, k) with unit stride along one axis of each operand,
leading dimensions provably large enough, batch dims that flatten to one stride, and an
output written contiguously. When they hold, the kernel splits into a ``gemm`` library call
and, if the kernel did more than the product (a fused bias or activation), an epilogue kernel
that reads the product back. Which one runs is decided by measurement (select.py).

When an operand fails only the layout premises (it is read through a view with no unit-stride
axis, e.g. the head-major attention output read as (seq, heads * head_dim)), or is not a
load at all but an elementwise expression lowering fused into the product (silu(gate) * up
read from two slices of one merged gate/up product), and uses only the product's own loop
variables, ``match_gemm_copy`` puts a small generated kernel first: it writes the operand's
values contiguously into a scratch buffer, which the gemm call then reads. The copy computes
exactly what the kernel computes per operand element, so the rewrite is exact; the measured
search keeps it only if it is faster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...graph import dtypes as dt
from ...graph import symbolic as sym
from ...graph.ops import Op
from ...graph.symbolic import sint
from ...graph.view import contiguous_strides, split_axis
from .. import kernel_ir as K


@dataclass
class GemmAlternative:
    call: K.LibCall
    epilogue: K.Kernel | None  # reads the product from call's output buffer
    scratch_shape: tuple[sint, ...] | None  # shape of a new buffer for the product, if any
    m: sint
    n: sint
    k: sint
    batch: sint
    # run before the call: each writes an operand contiguously into scratch buffer ``out`` of
    # its ``shape`` (ids from ``new_buffer_id`` on; the product buffer, if any, comes after)
    copies: tuple[K.Kernel, ...] = ()


def _affine(e: sint, names: list[str]) -> tuple[sint, dict[str, sint]] | None:
    """``e == offset + sum(coef[v] * v)`` over the named variables, or None if not affine."""
    zero = {v: 0 for v in names}
    off = sym.substitute(e, zero)
    coef: dict[str, sint] = {}
    rebuilt: sint = off
    for v in names:
        c = sym.add(sym.substitute(e, {**zero, v: 1}), sym.mul(off, -1))
        coef[v] = c
    vars_in_e = {x.name: x for x in (e.vars() if isinstance(e, sym.Expr) else set())}
    for v in names:
        if coef[v] != 0:
            if v not in vars_in_e:
                return None
            rebuilt = sym.add(rebuilt, sym.mul(coef[v], vars_in_e[v]))
    if sym.add(rebuilt, sym.mul(e, -1)) != 0:
        return None
    loop_vars = {vars_in_e[v] for v in names if v in vars_in_e}
    if any(isinstance(c, sym.Expr) and c.vars() & loop_vars for c in coef.values()):
        return None
    # the offset and coefficients may hold dims only: an index variable of an enclosing loop
    # (an outer reduction around this sum) has no value when the gemm call runs
    for x in (off, *coef.values()):
        if isinstance(x, sym.Expr) and any(u.name.startswith("_") for u in x.vars()):
            return None
    return off, coef


def _find_reduces(v: K.Value) -> list[K.Reduce]:
    """SUM reductions of a product anywhere in the tree (the caller checks they are evaluated
    at the output point: their loads must be affine in the output and reduce variables),
    except under a mask on the output indices: a product only where such a mask holds (the
    first 64 of 96 channels, a concatenation's part) is no GEMM over the whole output, whose
    rows past the mask read past the operand."""
    masked: set[int] = set()
    for m in K.walk(v):  # parents first: a mask inside a masked subtree is walked no more
        if isinstance(m, K.Masked) and id(m) not in masked \
                and any(n.startswith("_i") for n in K._expr_vars(m.valid)):  # fmt: skip
            masked.update(id(x) for x in K.walk(m.value))
    return [
        x for x in K.walk(v)
        if isinstance(x, K.Reduce) and x.op is Op.SUM_REDUCE and isinstance(x.body, K.Alu)
        and x.body.op is Op.MUL and id(x) not in masked
    ]  # fmt: skip


def _replace(
    v: K.Value, target: K.Value, new: K.Value, memo: dict[int, K.Value] | None = None
) -> K.Value:
    """``v`` with every occurrence of ``target`` replaced by ``new``: equal copies too (a
    product read through two paths of one kernel is two equal trees), or the epilogue would
    compute the product again."""
    memo = {} if memo is None else memo
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    rec = lambda x: _replace(x, target, new, memo)  # noqa: E731
    out = v
    if v is target or (hash(v) == hash(target) and v == target):
        out = new
    elif isinstance(v, K.Alu):
        out = K.Alu(v.op, tuple(rec(s) for s in v.srcs), v.dtype)
    elif isinstance(v, K.Cast):
        out = K.Cast(rec(v.src), v.dtype)
    elif isinstance(v, K.Masked):
        out = K.Masked(v.valid, rec(v.value), v.dtype)
    elif isinstance(v, K.Reduce):
        out = K.Reduce(v.op, v.var, v.extent, rec(v.body), v.dtype)
    elif isinstance(v, K.Gather):
        out = K.Gather(v.var, rec(v.row), v.rows, rec(v.body), v.dtype)
    memo[id(v)] = out
    return out


# storage types whose products a gemm call takes as they are, widened to f32 in the sum
HALF = (dt.bf16, dt.f16)


def _operand(v: K.Value) -> tuple[K.Load, dt.DType] | None:
    """(the load, the type it reads) of an operand read as is: an f32 load, or a half-type
    load widened to f32; None for anything else."""
    if isinstance(v, K.Cast) and v.dtype is dt.f32 and isinstance(v.src, K.Load):
        if v.src.dtype in HALF and v.src.valid == 1:
            return v.src, v.src.dtype
        return None
    if isinstance(v, K.Load) and v.valid == 1 and v.dtype is dt.f32:
        return v, dt.f32
    return None


def _half_of(v: K.Value) -> dt.DType | None:
    """The half type of an operand that is a half-type value widened to f32, else None."""
    if isinstance(v, K.Cast) and v.dtype is dt.f32 and v.src.dtype in HALF:
        return v.src.dtype
    return None


def _ge(a: sint, b: sint) -> bool:
    if sym.prove_nonneg(sym.add(a, sym.mul(b, -1))):
        return True
    # a multiple of b (a leading dimension spanning a symbolic batch: h*h*n against h*h),
    # which range bounds alone do not order: a = q*b >= b for b >= 0 and q >= 1
    q = sym.floordiv(a, b)
    return sym.mul(q, b) == a and sym.prove_nonneg(b) and sym.prove_nonneg(sym.add(q, -1))


def match_gemm(kern: K.Kernel, new_buffer_id: int) -> GemmAlternative | None:
    """A gemm alternative for ``kern``, or None when the premises do not hold.
    ``new_buffer_id`` is the id a scratch product buffer would get."""
    if kern.scatter_row is not None or not kern.shape:
        return None
    for r in _find_reduces(kern.value):
        alt = _match(kern, r, new_buffer_id)
        if alt is not None:
            return alt
    return None


def _match(kern: K.Kernel, r: K.Reduce, new_buffer_id: int) -> GemmAlternative | None:
    if r.dtype is not dt.f32 or not isinstance(r.body, K.Alu):
        return None
    op0, op1 = (_operand(x) for x in r.body.srcs)
    if op0 is None or op1 is None or op0[1] is not op1[1]:
        return None
    loads = [op0[0], op1[0]]
    shape = kern.shape
    rank = len(shape)
    n_var = f"_i{rank - 1}"
    m_var = f"_i{rank - 2}" if rank >= 2 else None
    batch_vars = [f"_i{j}" for j in range(rank - 2)]
    n_size, m_size = shape[-1], (shape[-2] if rank >= 2 else 1)
    k_size = r.extent
    names = batch_vars + ([m_var] if m_var else []) + [n_var, r.var.name]
    aff = [_affine(x.index, names) for x in loads]
    if aff[0] is None or aff[1] is None:
        return None
    # A does not move with n, B does not move with m
    order = [0, 1] if aff[0][1][n_var] == 0 else [1, 0]
    (a_off, ca), (b_off, cb) = aff[order[0]], aff[order[1]]  # type: ignore[misc]
    a_load, b_load = loads[order[0]], loads[order[1]]
    if ca[n_var] != 0 or (m_var and cb[m_var] != 0):
        return None
    kv = r.var.name
    cam = ca[m_var] if m_var else 0
    fields: dict[str, sint | float] = {"m": m_size, "n": n_size, "k": k_size}
    # A: (m, k) row-major with lda = stride of m, or transposed
    if ca[kv] == 1 and (m_size == 1 or _ge(cam, k_size)):
        fields["trans_a"], fields["lda"] = 0, (k_size if m_size == 1 else cam)
    elif cam == 1 and m_size != 1 and _ge(ca[kv], m_size):
        fields["trans_a"], fields["lda"] = 1, ca[kv]
    else:
        return None
    cbn, cbk = cb[n_var], cb[kv]
    if cbn == 1 and (k_size == 1 or _ge(cbk, n_size)):
        fields["trans_b"], fields["ldb"] = 0, (n_size if k_size == 1 else cbk)
    elif cbk == 1 and _ge(cbn, k_size):
        fields["trans_b"], fields["ldb"] = 1, cbn
    else:
        return None
    # batch dims must flatten to one stride per operand
    batch: sint = 1
    for v in batch_vars:
        batch = sym.mul(batch, shape[int(v[2:])])
    for c in (ca, cb):
        for j in range(len(batch_vars) - 1):
            outer, inner = batch_vars[j], batch_vars[j + 1]
            if sym.add(c[outer], sym.mul(sym.mul(c[inner], shape[j + 1]), -1)) != 0:
                return None
    fields["batch"] = batch
    fields["stride_a"] = ca[batch_vars[-1]] if batch_vars else 0
    fields["stride_b"] = cb[batch_vars[-1]] if batch_vars else 0
    fields["stride_c"] = sym.mul(m_size, n_size)
    fields["a_offset"], fields["b_offset"] = a_off, b_off
    fields["ldc"] = n_size
    if not (sym.prove_nonneg(a_off) and sym.prove_nonneg(b_off)):
        return None
    direct = kern.value is r and kern.dtype is dt.f32
    out = kern.out if direct else new_buffer_id
    call = K.LibCall(f"{kern.name}_gemm", "gemm", fields, [a_load.buf, b_load.buf, out], out)
    epilogue = None if direct else _epilogue(kern, r, out, shape)
    return GemmAlternative(call, epilogue, None if direct else shape, m_size, n_size, k_size, batch)


def _epilogue(kern: K.Kernel, r: K.Reduce, out: int, shape: tuple[sint, ...]) -> K.Kernel:
    """The rest of ``kern`` after a library call wrote its sum ``r`` to buffer ``out``
    (contiguous, of ``shape``): the kernel's value reading the product instead of summing."""
    flat: sint = 0
    for j, st in enumerate(contiguous_strides(shape)):
        flat = sym.add(flat, sym.mul(sym.index_var(j, shape[j]), st))
    value = _replace(kern.value, r, K.Load(out, flat, 1, dt.f32))
    return K.Kernel(f"{kern.name}_epi", shape, kern.out, value, kern.dtype)


def regrouped(kern: K.Kernel, t: int, s: int) -> K.Kernel | None:
    """``kern`` over the output axes grouped as (``axes[:t]`` kept as batch axes, axes
    ``[t:s]`` merged into one m axis, axes ``[s:]`` into one n axis), size-1 axes dropped: the
    same values stored at the same places (the output is contiguous in axis order). A
    convolution's (batch, channel, height, width) output becomes (batch, channel, pixels): a
    GEMM of the weights by the input's windows. None when a group is empty."""
    shape = kern.shape
    if kern.scatter_row is not None or not 0 <= t < s < len(shape) + 1:
        return None
    if any(sym.upper_bound(e) <= 0 for e in shape):
        return None  # an empty axis: nothing to regroup (and no divisor for the others)
    groups = [[j for j in range(t) if shape[j] != 1], list(range(t, s)), list(range(s, len(shape)))]
    if not groups[1] or not groups[2]:
        return None
    new_shape: list[sint] = [shape[j] for j in groups[0]]
    mapping: dict[str, sint] = {}
    for j in range(t):
        if shape[j] == 1:
            mapping[f"_i{j}"] = 0
    for k, j in enumerate(groups[0]):
        mapping[f"_i{j}"] = sym.index_var(k, shape[j])
    for g in groups[1:]:
        size: sint = 1
        for j in g:
            size = sym.mul(size, shape[j])
        v = sym.index_var(len(new_shape), size)
        new_shape.append(size)
        below: sint = 1
        for j in reversed(g):
            # the group's outermost axis needs no mod (v < size): without it the simplifier
            # folds a*(v // a) + v % a back into v, so a contiguous read stays affine
            q = sym.floordiv(v, below)
            mapping[f"_i{j}"] = q if j == g[0] else sym.mod(q, shape[j])
            below = sym.mul(below, shape[j])
    if len(new_shape) == len(shape) and all(m == f"_i{i}" for i, m in enumerate(mapping)):
        return None
    value = K.substitute(kern.value, mapping)
    return replace(kern, shape=tuple(new_shape), value=value, reads=list(kern.reads))


def match_any(kern: K.Kernel, new_buffer_id: int) -> GemmAlternative | None:
    """A gemm alternative for ``kern`` as it is, else for a regrouping of its output axes
    (``regrouped``), with or without copied operands; None when no grouping fits."""
    alt = match_gemm(kern, new_buffer_id) or match_gemm_copy(kern, new_buffer_id)
    if alt is not None or kern.scatter_row is not None:
        return alt
    rank = len(kern.shape)
    for s in range(rank - 1, 0, -1):  # n: the trailing axes, widest last
        for t in range(s - 1, -1, -1):
            rk = regrouped(kern, t, s)
            if rk is None:
                continue
            alt = match_gemm(rk, new_buffer_id) or match_gemm_copy(rk, new_buffer_id)
            if alt is not None:
                return alt
    return None


def _plain_load(v: K.Value) -> bool:
    return _operand(v) is not None


# A copied operand may hold reductions over at most this many values (a pooling window, the
# max against padding of relu): the copy computes each once per element it writes.
COPY_REDUCE_MAX = 16


def _elementwise(v: K.Value) -> bool:
    """An f32 value computed pointwise from loads (an activation fused into the product's
    operand, such as silu(gate) * up, a pooled window feeding a convolution, rows picked by
    a gather): no reduction over more than ``COPY_REDUCE_MAX`` values."""
    return v.dtype is dt.f32 and not any(
        isinstance(x, K.SoftmaxSum)
        or (isinstance(x, K.Reduce)
            and not (isinstance(x.extent, int) and x.extent <= COPY_REDUCE_MAX))
        for x in K.walk(v)
    )  # fmt: skip


def match_gemm_copy(kern: K.Kernel, new_buffer_id: int) -> GemmAlternative | None:
    """A gemm alternative that first copies the operand(s) failing the layout premises into
    contiguous scratch buffers, or None. For kernels ``match_gemm`` refuses: it copies the
    left operand, else the right, else both, whichever is the first to satisfy every other
    premise."""
    if kern.scatter_row is not None or not kern.shape:
        return None
    for r in _find_reduces(kern.value):
        for roles in ((0,), (1,), (0, 1)):
            alt = _match_copied(kern, r, roles, new_buffer_id)
            if alt is not None:
                return alt
    return None


def _match_copied(
    kern: K.Kernel, r: K.Reduce, roles: tuple[int, ...], new_buffer_id: int
) -> GemmAlternative | None:
    """``_match`` on ``kern`` with operand A (role 0) and/or B (role 1) read from a copy. When
    both operands are values of one half type widened to f32 (a bf16 weight, an activation
    rounded to bf16), the copies keep the half type and the call reads it."""
    if r.dtype is not dt.f32 or not isinstance(r.body, K.Alu) or len(r.body.srcs) != 2:
        return None
    loads = r.body.srcs
    halves = [_half_of(x) for x in loads]
    half = halves[0] if halves[0] is not None and halves[0] is halves[1] else None
    ctype = half or dt.f32
    if not all(_plain_load(x) or _elementwise(x) for x in loads):
        return None
    if any(isinstance(x, K.Load) and x.buf == kern.out for v in loads for x in K.walk(v)):
        return None  # the call would overwrite what it reads
    shape, kv = kern.shape, r.var
    rank = len(shape)
    nb = max(rank - 2, 0)
    ivar = [sym.index_var(j, shape[j]) for j in range(rank)]
    n_name = f"_i{rank - 1}"
    m_name = f"_i{rank - 2}" if rank >= 2 else None
    m_var, n_var = (ivar[-2] if rank >= 2 else 0), ivar[-1]
    m_size, n_size = (shape[-2] if rank >= 2 else 1), shape[-1]
    batch_names = [f"_i{j}" for j in range(nb)]
    names = {*batch_names, n_name, kv.name} | ({m_name} if m_name else set())
    memo: dict[int, frozenset[str]] = {}
    used = [set(K.free_vars(x, memo)) for x in loads]
    # a variable of an enclosing loop has no value when the copy runs
    if any(u - names for u in used):
        return None
    # A does not move with n, B does not move with m (as in _match)
    if n_name not in used[0] and m_name not in used[1]:
        order = (0, 1)
    elif n_name not in used[1] and m_name not in used[0]:
        order = (1, 0)
    else:
        return None
    # each operand moves with its own output axis and with k: else the product repeats one
    # sum along an output axis (a group norm's mean of x times 1/n, read by every element of
    # its group) or scales one sum, and the copy would write a matrix of repeats (4096 x 4096
    # of 1/n) for a GEMM that does that many times the kernel's work
    a_used, b_used = used[order[0]], used[order[1]]
    if (
        (n_size != 1 and n_name not in b_used)
        or (m_name is not None and m_size != 1 and m_name not in a_used)
        or (r.extent != 1 and not (kv.name in a_used and kv.name in b_used))
    ):
        return None
    if any(not _plain_load(loads[order[role]]) for role in (0, 1) if role not in roles):
        return None  # an operand computed on the fly must be one of the copies
    srcs = list(loads)
    copies: list[K.Kernel] = []
    for role in roles:
        i = order[role]
        load = loads[i]
        # (masks too: a padded window's bounds check splits the pixel axis as its reads do)
        indices = [e for x in K.walk(load) if isinstance(x, K.Load) for e in (x.index, x.valid)]
        indices += [x.valid for x in K.walk(load) if isinstance(x, K.Masked)]
        # batch dims are copied only when the operand moves with them (else it is shared)
        own_batch = list(range(nb)) if set(batch_names) & used[i] else []
        inner = [(m_name, m_var, m_size), (kv.name, kv, r.extent)] if role == 0 else [
            (kv.name, kv, r.extent), (n_name, n_var, n_size)]  # fmt: skip
        axes = [(f"_i{j}", ivar[j], shape[j]) for j in own_batch] + inner
        # the copy loops over the axes split where the view splits them (k as (head, d)), so
        # that its reads are affine; the layout written is the unsplit one
        cshape: list[sint] = []
        mapping: dict[str, sint] = {}
        for nm, _, size in axes:
            at: sint = 0
            for part, mult in split_axis(indices, nm, size):
                at = sym.add(at, sym.mul(sym.index_var(len(cshape), part), mult))
                cshape.append(part)
            if nm:
                mapping[nm] = at
        buf = new_buffer_id + len(copies)
        stored = load.src if half is not None and isinstance(load, K.Cast) else load
        value = K.substitute(stored, mapping)
        name = f"{kern.name}_copy{'ab'[role]}"
        copies.append(K.Kernel(name, tuple(cshape), buf, value, ctype))
        sizes = tuple(size for _, _, size in axes)
        flat: sint = 0
        for (_, v, _), st in zip(axes, contiguous_strides(sizes), strict=True):
            flat = sym.add(flat, sym.mul(v, st))
        copied = K.Load(buf, flat, 1, ctype)
        srcs[i] = copied if half is None else K.Cast(copied, dt.f32)
    new_r = K.Reduce(r.op, kv, r.extent, K.Alu(r.body.op, tuple(srcs), r.body.dtype), r.dtype)
    value = _replace(kern.value, r, new_r)
    if not any(x is new_r for x in K.walk(value)):
        return None  # r sits where _replace does not reach: the epilogue could not read it
    alt = _match(replace(kern, value=value), new_r, new_buffer_id + len(copies))
    if alt is None:
        return None
    alt.copies = tuple(copies)
    return alt


# ``qdot``: a product by a block-quantized weight in the form that compile-time folding leaves
# (compiler/fold.py: block scales as f32, quants packed per block), computed by the target with
# integer dot products where the activation's blocks of 32 are int8 codes times a scale (the
# q8 activations of compiler/actquant.py), in f32 elsewhere. The formats, by the weight reads
# the dequantized value is built from (block b = n * k/32 + k // 32):
#   q4_0: u8 nibbles (element e < 16 the low nibble of byte e of the block, e >= 16 the high
#         one of byte e - 16) and one f32 per block;
#   q4_1: the same nibbles, one f32 per half block and one per block;
#   q8_0: i8 codes, q_stride bytes per block from q_offset, and one f32 per block.
# The reads pin the layout, not the arithmetic between them: the search checks the call's
# output against the generated kernel before it keeps it, so a value of another form is
# dropped there.
QDOT_FORMATS = {"q4_0": 0, "q4_1": 1, "q8_0": 2}


def match_qdot(kern: K.Kernel, new_buffer_id: int) -> GemmAlternative | None:
    """A ``qdot`` alternative for ``kern`` (args: A, the weight's buffers, C), or None."""
    if kern.scatter_row is not None or kern.dtype is not dt.f32 or not kern.shape:
        return None
    shape = kern.shape
    rank = len(shape)
    if any(s != 1 for s in shape[:-2]):
        return None
    for r in _find_reduces(kern.value):
        alt = _match_qdot(kern, r, rank, new_buffer_id)
        if alt is not None:
            return alt
    return None


def _match_qdot(
    kern: K.Kernel, r: K.Reduce, rank: int, new_buffer_id: int
) -> GemmAlternative | None:
    shape = kern.shape
    k_size = r.extent
    if r.dtype is not dt.f32 or not isinstance(k_size, int) or k_size % 32 or k_size == 0:
        return None
    assert isinstance(r.body, K.Alu)
    n_name, n_size = f"_i{rank - 1}", shape[-1]
    m_name, m_size = (f"_i{rank - 2}", shape[-2]) if rank >= 2 else (None, 1)
    drop: dict[str, sint] = {f"_i{j}": 0 for j in range(rank - 2)}
    kv = r.var.name
    for ai in (0, 1):
        a, w = r.body.srcs[ai], r.body.srcs[1 - ai]
        if not (isinstance(a, K.Load) and a.valid == 1 and a.dtype is dt.f32):
            continue
        names = ([m_name] if m_name else []) + [n_name, kv]
        aff = _affine(sym.substitute(a.index, drop), names)
        if aff is None or aff[1][kv] != 1 or aff[1][n_name] != 0:
            continue
        a_off, ca = aff
        lda = ca[m_name] if m_name else k_size
        if m_name and m_size != 1 and not _ge(lda, k_size):
            continue
        fmt = _qdot_weight(w, sym.index_var(rank - 1, n_size), kv, k_size, drop)
        if fmt is None or not sym.prove_nonneg(a_off):
            continue
        name, bufs, q_off, q_stride = fmt
        direct = kern.value is r
        out = kern.out if direct else new_buffer_id
        fields: dict[str, sint | float] = {
            "format": float(QDOT_FORMATS[name]), "m": m_size, "n": n_size, "k": k_size,
            "lda": lda if m_size != 1 else k_size, "a_offset": a_off,
            "q_offset": q_off, "q_stride": q_stride,
        }  # fmt: skip
        call = K.LibCall(f"{kern.name}_qdot", "qdot", fields, [a.buf, *bufs, out], out)
        epilogue = None if direct else _epilogue(kern, r, out, shape)
        return GemmAlternative(call, epilogue, None if direct else shape, m_size, n_size,
                               k_size, 1)  # fmt: skip
    return None


def _qdot_weight(
    w: K.Value, nv: sint, kv: str, k: int, drop: dict[str, sint]
) -> tuple[str, list[int], sint, sint] | None:
    """(format, [quants, scales...] buffers, q_offset, q_stride) of the weight value ``w`` read
    at row ``nv`` (its index variable) and column ``kv``, or None."""
    nblocks = k // 32
    loads = {x for x in K.walk(w) if isinstance(x, K.Load)}
    if any(x.valid != 1 for x in loads) or not loads:
        return None
    if any(v in K.free_vars(w, {}) for v in drop):
        return None
    kb, h, e = sym.var("_qkb", 0, nblocks - 1, nblocks), sym.var("_qh", 0, 1, 2), sym.var(
        "_qe", 0, 15, 16)  # fmt: skip
    col = sym.add(sym.add(sym.mul(kb, 32), sym.mul(h, 16)), e)
    block = sym.add(sym.mul(nv, nblocks), kb)
    by_kind: dict[str, list[tuple[K.Load, sint]]] = {}
    for x in loads:
        at = sym.substitute(x.index, {**drop, kv: col})
        by_kind.setdefault(x.dtype.name, []).append((x, at))
    f32 = by_kind.pop("f32", [])
    if len(by_kind) != 1 or len({x.buf for x, _ in by_kind[next(iter(by_kind))]}) != 1:
        return None
    ((kind, quants),) = by_kind.items()
    q_at = quants[0][1]
    at0 = {**({nv.name: 0} if isinstance(nv, sym.Expr) else {}), "_qh": 0, "_qe": 0}
    q_off = sym.substitute(q_at, {**at0, "_qkb": 0})
    q_stride = sym.add(sym.substitute(q_at, {**at0, "_qkb": 1}),
                       sym.mul(q_off, -1))  # fmt: skip
    if not isinstance(q_stride, int) or not sym.prove_nonneg(q_off):
        return None
    base = sym.add(q_off, sym.mul(block, q_stride))
    per_block = [x.buf for x, at in f32 if sym.add(at, sym.mul(block, -1)) == 0]
    per_half = [x.buf for x, at in f32
                if sym.add(at, sym.mul(sym.add(sym.mul(block, 2), h), -1)) == 0]  # fmt: skip
    if len(per_block) + len(per_half) != len(f32) or not all(
        sym.add(at, sym.mul(sym.add(base, e if kind == "u8" else sym.add(sym.mul(h, 16), e)),
                            -1)) == 0
        for _, at in quants
    ):  # fmt: skip
        return None
    q = quants[0][0].buf
    if kind == "i8" and len(set(per_block)) == 1 and not per_half:
        return "q8_0", [q, per_block[0]], q_off, q_stride
    if kind == "u8" and len(set(per_block)) == 1 and not per_half:
        return "q4_0", [q, per_block[0]], q_off, q_stride
    if kind == "u8" and len(set(per_block)) == 1 and len(set(per_half)) == 1:
        return "q4_1", [q, per_half[0], per_block[0]], q_off, q_stride
    return None
