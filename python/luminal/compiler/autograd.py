"""Reverse-mode autodiff as a graph pass: gradients become ordinary nodes of the same graph.

Each of the 15 primitives has one vector-Jacobian rule below; high-level ops (matmul, softmax,
conv, attention, ...) are compositions of primitives, so they differentiate with no code of
their own. Views are not ops, but an edge's view also needs an adjoint: where the view reads
each source element at most once along an axis, the adjoint is another view (the inverse
index, solved by floor division), and axes that read a source element many times (broadcast,
sliding windows) are summed. Index expressions that are not affine fall back to a one-hot sum.
The result is fused, searched and planned like any other graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import log

from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.graph import Graph, Node, Src
from ..graph.ops import Leaf, Op
from ..graph.symbolic import sint
from ..graph.view import View, contiguous_strides, idx_vars, split_axis

_LN2 = log(2.0)


# ----------------------------------------------------------------------------- edge helpers
def _e(n: Node) -> Src:
    return (n, View.contiguous(n.shape))


def _shape(e: Src) -> tuple[sint, ...]:
    return e[1].shape


def _const(g: Graph, value: float, dtype: dt.DType, shape: Sequence[sint]) -> Src:
    """A scalar read at every position of ``shape`` (no buffer of that shape)."""
    return (g.add_constant(value, dtype), View(tuple(shape), 0, 1))


def _op(g: Graph, op: Op, *srcs: Src, arg: object = None) -> Src:
    return _e(g.add_op(op, list(srcs), arg))


def _add(g: Graph, a: Src, b: Src) -> Src:
    return _op(g, Op.ADD, a, b)


def _mul(g: Graph, a: Src, b: Src) -> Src:
    return _op(g, Op.MUL, a, b)


def _scale(g: Graph, a: Src, k: float) -> Src:
    return _mul(g, a, _const(g, k, a[0].dtype, _shape(a)))


def _cast(g: Graph, a: Src, d: dt.DType) -> Src:
    return a if a[0].dtype is d else _op(g, Op.CAST, a, arg=d)


def _broadcast_axis(e: Src, axis: int, size: sint) -> Src:
    """``e`` (a reduce's output) read with ``axis`` re-inserted at ``size`` (a view)."""
    n, v = e
    v = v.unsqueeze(axis)
    shape = list(v.shape)
    shape[axis] = size
    return (n, v.expand(shape))


def _not_less(g: Graph, a: Src, b: Src, d: dt.DType) -> Src:
    """1.0 where not a < b, else 0.0 (in ``d``)."""
    lt = _cast(g, _op(g, Op.LESS_THAN, a, b), d)
    return _add(g, _const(g, 1.0, d, _shape(a)), _scale(g, lt, -1.0))


def _equal(g: Graph, a: Src, b: Src, d: dt.DType) -> Src:
    """1.0 where a == b (for values without NaN), else 0.0."""
    return _mul(g, _not_less(g, a, b, d), _not_less(g, b, a, d))


# ----------------------------------------------------------------------------- primitive VJPs
def _vjp(g: Graph, n: Node, gy: Src, k: int) -> Src | None:
    """Gradient w.r.t. the k-th source edge of ``n`` (shape of that edge's view), given the
    gradient ``gy`` of ``n``'s output; None where the source gets no gradient."""
    op, d = n.op, n.dtype
    srcs = n.srcs
    x = srcs[k] if k < len(srcs) else None
    y = _e(n)
    if op is Op.EXP2:  # d 2^x = 2^x ln 2
        return _mul(g, gy, _scale(g, y, _LN2))
    if op is Op.LOG2:  # d log2 x = 1 / (x ln 2)
        return _mul(g, gy, _scale(g, _op(g, Op.RECIP, srcs[0]), 1.0 / _LN2))
    if op is Op.SIN:  # cos x = sin(x + pi/2)
        assert x is not None
        shifted = _add(g, x, _const(g, 1.5707963267948966, d, _shape(x)))
        return _mul(g, gy, _op(g, Op.SIN, shifted))
    if op is Op.SQRT:  # 1 / (2 sqrt x)
        return _mul(g, gy, _scale(g, _op(g, Op.RECIP, y), 0.5))
    if op is Op.RECIP:  # -1 / x^2 = -y^2
        return _mul(g, gy, _scale(g, _mul(g, y, y), -1.0))
    if op is Op.ADD:
        return gy
    if op is Op.MUL:
        return _mul(g, gy, srcs[1 - k])
    if op is Op.MOD:  # fmod(a, b) = a - trunc(a / b) b
        if k == 0:
            return gy
        a, b = srcs
        trunc = _mul(g, _add(g, a, _scale(g, y, -1.0)), _op(g, Op.RECIP, b))
        return _scale(g, _mul(g, gy, trunc), -1.0)
    if op is Op.SUM_REDUCE:
        assert x is not None
        return _broadcast_axis(gy, n.arg, _shape(x)[n.arg])
    if op is Op.MAX_REDUCE:  # ties share the gradient equally, as torch.amax
        assert x is not None
        size = _shape(x)[n.arg]
        hit = _not_less(g, x, _broadcast_axis(y, n.arg, size), d)
        count = _op(g, Op.SUM_REDUCE, hit, arg=n.arg)
        share = _mul(g, gy, _op(g, Op.RECIP, count))
        return _mul(g, hit, _broadcast_axis(share, n.arg, size))
    if op is Op.CAST:
        assert x is not None
        return _cast(g, gy, x[0].dtype) if x[0].dtype.is_float else None
    if op is Op.GATHER:
        return _gather_vjp(g, n, gy) if k == 0 else None
    if op is Op.SCATTER:
        dest, idx, src = srcs
        if k == 0:  # the written rows do not reach the output
            return _op(g, Op.SCATTER, gy, idx, _const(g, 0.0, d, _shape(src)))
        return _op(g, Op.GATHER, gy, idx) if k == 2 else None
    return None  # LESS_THAN (bool out), IOTA (no inputs)


def _read_expr(e: Src) -> sint | None:
    """The value an integer edge reads, as an expression of the reader's index variables,
    when its node is an IOTA or an integer constant (else None)."""
    n, v = e
    if n.op is Op.IOTA:
        value = n.arg
    elif n.op is Leaf.CONSTANT and isinstance(n.arg, (int, sym.Expr)) and n.dtype.is_int:
        value = n.arg
    else:
        return None
    mapping: dict[str, sint] = {}
    for k, (s, st) in enumerate(zip(n.shape, contiguous_strides(n.shape))):
        q = sym.floordiv(v.index, st)
        mapping[f"_i{k}"] = q if k == 0 else sym.mod(q, s)
    return sym.mul(sym.substitute(value, mapping), v.valid)


def _selected_index(idx: Src) -> list[tuple[sint, Src | None, bool]] | None:
    """An index of the form ``iota`` or ``iota + iota * cast(cond)`` (how a select reads one
    of two candidates laid end to end) as branches (index expression, cond, taken when cond
    is true / false); None for any other index."""
    n, v = idx
    if v != View.contiguous(n.shape):
        return None
    whole = _read_expr(idx)
    if whole is not None:
        return [(whole, None, True)]
    if n.op is not Op.ADD:
        return None
    for a, b in (n.srcs, n.srcs[::-1]):
        base = _read_expr(a)
        m, mv = b
        if base is None or m.op is not Op.MUL or mv != View.contiguous(m.shape):
            continue
        for x, c in (m.srcs, m.srcs[::-1]):
            step = _read_expr(x)
            cn = c[0]
            if step is None or cn.op is not Op.CAST or cn.srcs[0][0].dtype is not dt.bool_:
                continue
            if c[1] != View.contiguous(cn.shape):
                continue
            cond = cn.srcs[0]
            return [(base, cond, False), (sym.add(base, step), cond, True)]
    return None


def _gather_vjp(g: Graph, n: Node, gy: Src) -> Src:
    """Scatter-add of ``gy`` into the data's rows. An index computed from positions alone
    (a select's) makes the gather a view: its adjoint is a view adjoint. Otherwise a sum
    over index positions of onehot(index == row) * gy (duplicates accumulate;
    out-of-range indices add nothing)."""
    data, idx = n.srcs
    branches = _selected_index(idx)
    if branches is not None:
        return _gather_as_views(g, n, gy, branches)
    ishape, dshape = _shape(idx), _shape(data)
    p, rows, rest = len(ishape), dshape[0], tuple(dshape[1:])
    hot_shape = (*ishape, rows)
    pos = _e(g.add_op(Op.IOTA, [], arg=idx_vars(hot_shape)[-1], shape=hot_shape,
                      dtype=idx[0].dtype))  # fmt: skip
    hot = _equal(g, (idx[0], idx[1].unsqueeze(p).expand(hot_shape)), pos, n.dtype)
    full = (*hot_shape, *rest)
    hv = hot[1]
    for _ in rest:
        hv = hv.unsqueeze(hv.ndim)
    gv = gy[1].unsqueeze(p)
    prod = _mul(g, (hot[0], hv.expand(full)), (gy[0], gv.expand(full)))
    for _ in range(p):
        prod = _op(g, Op.SUM_REDUCE, prod, arg=0)
    return prod


def _gather_as_views(g: Graph, n: Node, gy: Src,
                     branches: list[tuple[sint, Src | None, bool]]) -> Src:  # fmt: skip
    """Each branch reads the data through a view (index expression, rows in range valid),
    masked by its condition; the gradient is the sum of those views' adjoints."""
    data = n.srcs[0]
    dshape = _shape(data)
    rows, rest = dshape[0], tuple(dshape[1:])
    ishape = n.shape[: len(n.shape) - len(rest)]
    out_vars = idx_vars(n.shape)
    inner: sint = 0
    for v, st in zip(out_vars[len(ishape) :], contiguous_strides(rest)):
        inner = sym.add(inner, sym.mul(v, st))
    total: Src | None = None
    for expr, cond, when in branches:
        row = sym.substitute(expr, {f"_i{k}": out_vars[k] for k in range(len(ishape))})
        ok = sym.mul(sym.lt(-1, row), sym.lt(row, rows))
        view = View(n.shape, sym.add(sym.mul(row, _prod(rest)), inner), ok)
        part = gy
        if cond is not None:
            cv = cond[1]
            for _ in rest:
                cv = cv.unsqueeze(cv.ndim)
            mask = _cast(g, (cond[0], cv.expand(n.shape)), n.dtype)
            if not when:
                mask = _add(g, _const(g, 1.0, n.dtype, n.shape), _scale(g, mask, -1.0))
            part = _mul(g, gy, mask)
        contrib = view_vjp(g, part, view, dshape)
        total = contrib if total is None else _add(g, total, contrib)
    assert total is not None
    return total


# ----------------------------------------------------------------------------- view adjoints
def _nominal(x: sint) -> int:
    """A typical value of ``x`` (dims at 64 within their range): orders strides only."""
    if isinstance(x, int):
        return x
    env = {v.name: min(max(64, v.lo), v.hi) for v in sym.free_dims([x])}
    return int(sym.evaluate(x, env))


def _fold_divmod(index: sint) -> sint:
    """d * (x // d) + x % d -> x for a symbolic d (the simplifier folds constant d only):
    a flatten / unflatten pair over a dim-sized axis."""
    terms, off = sym._lin(index)
    out: sint = off
    used: set[sym.Expr] = set()
    for t, c in terms.items():
        if t.kind == sym.MOD and not isinstance(t.args[1], int):
            x, d = t.args
            q = sym.mul(d, sym.floordiv(x, d))
            if isinstance(q, sym.Expr) and terms.get(q) == c and q not in used:
                used |= {t, q}
                out = sym.add(out, sym.mul(x, c))
    for t, c in terms.items():
        if t not in used:
            out = sym.add(out, sym.mul(t, c))
    return out


def _affine(index: sint, nvars: int) -> tuple[list[sint], sint] | None:
    """(stride per index variable, offset) when ``index`` is affine in the index variables
    (strides may be expressions of dims), else None."""
    terms, off = sym._lin(_fold_divmod(index))
    strides: list[sint] = [0] * nvars
    offset: sint = off
    for t, c in terms.items():
        fs = t.args if t.kind == sym.MUL else (t,)
        if any(not isinstance(f, sym.Expr) for f in fs):
            return None
        ivs = [f for f in fs if f.kind == sym.VAR and f.extent is not None]
        rest = [f for f in fs if f not in ivs]
        if len(ivs) > 1 or any(sym.has_divmod(f) or f.vars() & set(ivs) for f in rest):
            return None
        if any(v.extent is not None for f in rest for v in f.vars()):
            return None
        coef: sint = c
        for f in rest:
            coef = sym.mul(coef, f)
        if ivs:
            k = int(ivs[0].name[2:])
            strides[k] = sym.add(strides[k], coef)
        else:
            offset = sym.add(offset, coef)
    return strides, offset


def view_vjp(g: Graph, gy: Src, view: View, src_shape: Sequence[sint]) -> Src:
    """The adjoint of reading a buffer of ``src_shape`` through ``view``: ``gy`` (the
    gradient of what the view reads, shape ``view.shape``) summed back onto the buffer."""
    src_shape = tuple(src_shape)
    if any(isinstance(s, int) and s == 0 for s in view.shape):
        return _const(g, 0.0, gy[0].dtype, src_shape)  # an empty read adds nothing
    if (
        view == View.contiguous(view.shape)
        and sym.add(view.numel(), sym.mul(_prod(src_shape), -1)) == 0
    ):
        return (gy[0], gy[1].reshape(src_shape))  # a reshape of a contiguous read
    # split axes the index divides (a reshape of a permuted tensor) into affine parts
    new_shape: list[sint] = []
    mapping: dict[str, sint] = {}
    parts: list[list[tuple[sint, sint]]] = []
    for k, s in enumerate(view.shape):
        iv = idx_vars(view.shape)[k]
        name = iv.name if isinstance(iv, sym.Expr) else None
        parts.append(split_axis([view.index, view.valid], name, s))
        new_shape += [ext for ext, _ in parts[-1]]
    nv = idx_vars(new_shape)
    j = 0
    for k, ps in enumerate(parts):
        e: sint = 0
        for _, mult in ps:
            e = sym.add(e, sym.mul(nv[j], mult))
            j += 1
        mapping[f"_i{k}"] = e
    index = sym.substitute(view.index, mapping)
    valid = sym.substitute(view.valid, mapping)
    g_read = gy[1].reshape(new_shape) if tuple(new_shape) != tuple(view.shape) else gy[1]
    aff = _affine(index, len(new_shape))
    if aff is None:
        return _onehot_vjp(g, (gy[0], g_read), index, valid, src_shape)
    strides, offset = aff
    # broadcast axes (stride 0) do not move the index: sum them first (masked by the view's
    # valid, which may depend on them), then solve the rest on the smaller gradient
    zero = [a for a, c in enumerate(strides) if c == 0 and new_shape[a] != 1]
    if zero:
        summed_g: Src = (gy[0], View(tuple(new_shape), g_read.index, sym.mul(g_read.valid, valid)))
        for a in reversed(zero):
            summed_g = _op(g, Op.SUM_REDUCE, summed_g, arg=a)
        keep = [a for a in range(len(new_shape)) if a not in zero]
        new_shape = [new_shape[a] for a in keep]
        kv = idx_vars(new_shape)
        index = sym.substitute(index, {f"_i{a}": kv[j] for j, a in enumerate(keep)})
        strides = [strides[a] for a in keep]
        valid, gy, g_read = 1, summed_g, summed_g[1]
    # axes with a negative stride walk backwards: read them flipped
    flip: set[int] = set()
    for a, c in enumerate(strides):
        if isinstance(c, int) and c < 0:
            flip.add(a)
            offset = sym.add(offset, sym.mul(c, sym.add(new_shape[a], -1)))
            strides[a] = -c
        elif not isinstance(c, int) and not sym.prove_nonneg(c):
            return _onehot_vjp(g, (gy[0], g_read), index, valid, src_shape)
    # solve for as many axes as stay one-to-one (each stride beyond the span of the smaller
    # ones); the rest (broadcasts, window offsets) are summed over
    order = sorted(
        (a for a in range(len(new_shape)) if strides[a] != 0),
        key=lambda a: (_nominal(strides[a]), -_nominal(new_shape[a])),
    )
    solved: list[int] = []
    span: sint = 0
    at: dict[int, sint] = {a: 0 for a, s in enumerate(new_shape) if s == 1}
    for a in order:
        if sym.prove_lt(span, strides[a]):
            solved.append(a)
            span = sym.add(span, sym.mul(strides[a], sym.add(new_shape[a], -1)))
    summed = [a for a in range(len(new_shape)) if a not in solved and a not in at]
    out_shape = (*src_shape, *(new_shape[a] for a in summed))
    ov = idx_vars(out_shape)
    flat: sint = 0
    for v, st in zip(ov, contiguous_strides(src_shape)):
        flat = sym.add(flat, sym.mul(v, st))
    at.update({a: ov[len(src_shape) + q] for q, a in enumerate(summed)})
    r = sym.add(flat, sym.mul(offset, -1))
    for a in summed:
        r = sym.add(r, sym.mul(at[a], sym.mul(strides[a], -1)))
    ok: sint = 1
    for a in reversed(solved):  # largest stride first
        ia = sym.floordiv(r, strides[a])
        r = sym.mod(r, strides[a])
        at[a] = ia
        ok = sym.mul(ok, sym.mul(sym.lt(-1, ia), sym.lt(ia, new_shape[a])))
    ok = sym.mul(ok, sym.eq(r, 0))
    names = {f"_i{a}": (sym.add(sym.add(new_shape[a], -1), sym.mul(e, -1)) if a in flip else e)
             for a, e in at.items()}  # fmt: skip
    ok = sym.mul(ok, sym.substitute(valid, names))
    read = View(
        out_shape,
        sym.substitute(g_read.index, names),
        sym.mul(sym.substitute(g_read.valid, names), ok),
    )
    out: Src = (gy[0], read)
    for _ in summed:
        out = _op(g, Op.SUM_REDUCE, out, arg=len(_shape(out)) - 1)
    return out


def _prod(xs: Sequence[sint]) -> sint:
    out: sint = 1
    for x in xs:
        out = sym.mul(out, x)
    return out


def _onehot_vjp(g: Graph, gy: Src, index: sint, valid: sint, src_shape: tuple[sint, ...]) -> Src:
    """General adjoint: every read position adds its gradient where its index hits the
    buffer element (work is reads x buffer size; only for non-affine index expressions)."""
    shape = _shape(gy)
    numel = _prod(src_shape)
    full = (*shape, numel)
    hit = sym.mul(sym.eq(index, idx_vars(full)[-1]), valid)
    d = gy[0].dtype
    mask = _e(g.add_op(Op.IOTA, [], arg=hit, shape=full, dtype=dt.i32))
    n, v = gy
    prod = _mul(g, _cast(g, mask, d), (n, v.unsqueeze(v.ndim).expand(full)))
    for _ in shape:
        prod = _op(g, Op.SUM_REDUCE, prod, arg=0)
    return (prod[0], prod[1].reshape(src_shape))


# ----------------------------------------------------------------------------- the pass
def gradients(
    g: Graph, root: Src, wrt: Sequence[Node], seed: Src | None = None
) -> list[Src | None]:
    """Gradients of ``root`` (an edge; ``seed`` is its incoming gradient, default ones)
    w.r.t. each node of ``wrt`` (each of its node's shape), as new nodes of ``g``. None
    for a node the root does not depend on (or that is not a float)."""
    rn, rv = root
    if not rn.dtype.is_float:
        raise TypeError(f"grad: the differentiated value must be a float, got {rn.dtype.name}")
    for w in wrt:
        if w.graph is not g:
            raise ValueError(f"grad: {w} belongs to another graph")
    order = g.toposort([rn])
    targets = {w.id for w in wrt}
    live: set[int] = set()
    for n in order:
        if n.dtype.is_float and (n.id in targets or any(s.id in live for s, _ in n.srcs)):
            live.add(n.id)
    if rn.id not in live:
        return [None for _ in wrt]
    seed = seed if seed is not None else _const(g, 1.0, rn.dtype, rv.shape)
    if tuple(_shape(seed)) != tuple(rv.shape):
        raise ValueError(f"grad: seed shape {_shape(seed)} differs from the root's {rv.shape}")
    pending: dict[int, list[Src]] = {rn.id: [view_vjp(g, seed, rv, rn.shape)]}
    done: dict[int, Src] = {}
    for n in reversed(order):
        contribs = pending.pop(n.id, None)
        if contribs is None:
            continue
        gy = contribs[0]
        for c in contribs[1:]:
            gy = _add(g, gy, c)
        done[n.id] = gy
        if n.op is Leaf.INPUT or n.op is Leaf.CONSTANT:
            continue
        for k, (s, v) in enumerate(n.srcs):
            if s.id not in live:
                continue
            gx = _vjp(g, n, gy, k)
            if gx is not None:
                pending.setdefault(s.id, []).append(view_vjp(g, gx, v, s.shape))
    return [done.get(w.id) for w in wrt]


def add_gradients(g: Graph, loss: str, wrt: Sequence[str], prefix: str = "grad.") -> Graph:
    """The pass over whole graphs: output ``loss``'s gradient w.r.t. each named input as
    output ``prefix + name`` (zeros where the loss does not depend on it)."""
    if loss not in g.outputs:
        raise ValueError(f"grad: graph {g.name!r} has no output {loss!r}")
    out = g.outputs[loss]
    nodes = []
    for name in wrt:
        if name not in g.inputs:
            raise ValueError(f"grad: graph {g.name!r} has no input {name!r}")
        nodes.append(g.inputs[name])
    for name, w, gw in zip(wrt, nodes, gradients(g, out.srcs[0], nodes)):
        if gw is None:
            if not w.dtype.is_float:
                raise TypeError(f"grad: input {name!r} is {w.dtype.name}, not a float")
            gw = _const(g, 0.0, w.dtype, w.shape)
            gw = _add(g, gw, _const(g, 0.0, w.dtype, w.shape))
        g.add_output(prefix + name, gw)
    return g
