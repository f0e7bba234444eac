"""Index arithmetic under a read's mask: a view's ``valid`` (0/1) holds where the read is
made, so its floor divisions and modulos may be simplified in the ranges ``valid`` leaves the
index variables (a padded window's row, the second half of a concatenation)."""

from __future__ import annotations

import functools

from ..graph import symbolic as sym
from ..graph.symbolic import sint
from ..graph.view import View, contiguous_strides


def unflatten(flat: sint, shape: tuple[sint, ...], valid: sint = 1) -> dict[str, sint]:
    """Index variables of a contiguous tensor of ``shape`` at flat offset ``flat``, where
    ``valid`` holds. When ``flat`` splits by the strides into parts that are each provably in
    their axis's range where ``valid`` holds (a padded view: ``(h - 1) * W + w``), the parts
    are the answer; else floor divisions and modulos of ``flat``."""
    return dict(_unflatten_kept(flat, shape, valid))


# a model's layers read through the same views: expressions are interned, so the answers are
# kept by them (SmolLM2's decode graph: 9312 calls)
@functools.lru_cache(maxsize=8192)
def _unflatten_kept(flat: sint, shape: tuple[sint, ...], valid: sint) -> dict[str, sint]:
    if 0 in shape:  # an empty tensor: no element is ever read, and its strides include 0
        return {f"_i{k}": 0 for k, s in enumerate(shape) if s != 1}
    narrow = _narrowed(valid)
    if narrow:
        # solved with the variables in the ranges valid leaves them (the answer is used only
        # there), then written with the variables themselves again
        solved = _unflatten_solve(sym.substitute(flat, narrow), shape, valid)
        back = _widened(flat, narrow)
        out = {k: sym.substitute(e, back) for k, e in solved.items()}
    else:
        out = _unflatten_solve(flat, shape, valid)
    facts = _facts(valid)
    if facts:
        out = {k: _fold(e, facts, {}) for k, e in out.items()}
    return out


def read_at(v: View, shape: tuple[sint, ...]) -> tuple[tuple[str, sint], ...]:
    """Where a read through ``v`` lands in a tensor of ``shape``, masks aside: views that
    differ only in their masks (a value and its padded copy, the two sides of a 2-way max)
    read one shared subtree, so inlining a node read through them computes it once."""
    if not shape:
        return ()
    return tuple(sorted(unflatten(v.index, shape, v.valid).items()))


def _widened(e: sint, narrow: dict[str, sint]) -> dict[str, sint]:
    """The variables of ``e`` that ``narrow`` replaces, by name: substituting them undoes it."""
    used = e.vars() if isinstance(e, sym.Expr) else frozenset()
    return {v.name: v for v in used if v.name in narrow}


def assuming(index: sint, valid: sint) -> sint:
    """``index`` simplified where ``valid`` holds (a masked read evaluates it only there):
    a view's floor divisions and modulos that are constant in the ranges ``valid`` leaves its
    variables fold away."""
    if valid == 1 or not sym.has_divmod(index):
        return index
    narrow = _narrowed(valid)
    if narrow:
        index = sym.substitute(sym.substitute(index, narrow), _widened(index, narrow))
    facts = _facts(valid)
    return _fold(index, facts, {}) if facts else index


_Fact = tuple[dict[sym.Expr, int], int, int]  # a sum's terms and its bounds


def _facts(valid: sint) -> list[_Fact]:
    """Bounds on sums that the factors ``c < X`` and ``X < c`` of ``valid`` give (a padded
    window's row ``s*o + r // k``), as ({term: coefficient}, lo, hi) of ``X`` less its
    constant."""
    bounds: dict[sym.Expr, list[int]] = {}
    for f in sym._factors(valid) if isinstance(valid, sym.Expr) else []:
        if f.kind != sym.LT:
            continue
        a, b = f.args
        side, c = (b, a) if isinstance(a, int) else (a, b)
        if not isinstance(c, int) or not isinstance(side, sym.Expr):
            continue
        terms, const = sym._lin(side)
        z = sym._from_lin(terms, 0)
        if not isinstance(z, sym.Expr):
            continue
        lo_hi = bounds.setdefault(z, [z.lo, z.hi])
        if side is b:  # c < z + const
            lo_hi[0] = max(lo_hi[0], c + 1 - const)
        else:  # z + const < c
            lo_hi[1] = min(lo_hi[1], c - 1 - const)
    return [(sym._lin(z)[0], lo, hi) for z, (lo, hi) in bounds.items() if (lo, hi) != (z.lo, z.hi)]


def _bounds(x: sint, facts: list[_Fact]) -> tuple[int, int]:
    """Bounds of ``x`` where the facts hold: each fact whose sum stands in ``x`` times a
    constant bounds those terms together; the other terms by their own bounds."""
    terms, const = sym._lin(x)
    rest = dict(terms)
    lo = hi = const
    for zt, zlo, zhi in facts:
        t0, c0 = next(iter(zt.items()))
        m, r = divmod(rest.get(t0, 0), c0)
        if m == 0 or r or any(rest.get(t) != m * c for t, c in zt.items()):
            continue
        for t in zt:
            del rest[t]
        lo, hi = lo + min(m * zlo, m * zhi), hi + max(m * zlo, m * zhi)
    for t, c in rest.items():
        lo, hi = lo + min(c * t.lo, c * t.hi), hi + max(c * t.lo, c * t.hi)
    return lo, hi


def _quotient(kind: str, args: list[sint], facts: list[_Fact]) -> int | None:
    """The quotient of a floor division or modulo by a constant, where the facts fix it."""
    if kind not in (sym.DIV, sym.MOD) or not isinstance(args[1], int) or args[1] <= 0:
        return None
    lo, hi = _bounds(args[0], facts)
    return lo // args[1] if lo // args[1] == hi // args[1] else None


def _fold(x: sint, facts: list[_Fact], memo: dict[int, sint]) -> sint:
    """``x`` with each floor division and modulo by a constant whose quotient the facts fix
    replaced (innermost first, so an outer one sees the inner ones folded)."""
    if isinstance(x, int) or x.kind == sym.VAR:
        return x
    hit = memo.get(id(x))
    if hit is not None:
        return hit
    if x.kind == sym.ADD:
        out: sint = x.args[1]
        for t, c in x.args[0]:
            out = sym.add(out, sym.mul(_fold(t, facts, memo), c))
    else:
        args = [_fold(a, facts, memo) for a in x.args]
        q = _quotient(x.kind, args, facts)
        if q is not None:
            out = q if x.kind == sym.DIV else sym.add(args[0], -args[1] * q)
        else:
            out = sym._prod(args) if x.kind == sym.MUL else sym._BUILDERS[x.kind](*args)
    memo[id(x)] = out
    return out


def _unflatten_solve(flat: sint, shape: tuple[sint, ...], valid: sint) -> dict[str, sint]:
    strides = contiguous_strides(shape)
    parts = _split_by_strides(flat, shape, strides)
    if _parts_in_range(parts, shape, valid):
        return {f"_i{k}": q for k, q in enumerate(parts) if shape[k] != 1}
    out: dict[str, sint] = {}
    for k, (s, st) in enumerate(zip(shape, strides)):
        if s == 1:
            continue
        q = sym.floordiv(flat, st)
        out[f"_i{k}"] = q if k == 0 else sym.mod(q, s)
    return out


def _split_by_strides(flat: sint, shape: tuple[sint, ...], strides: tuple[sint, ...]) -> list[sint]:
    """``flat == sum(strides[k] * parts[k])``, each term in the part of the outermost axis
    whose stride it is a multiple of (the innermost takes the rest)."""
    parts: list[sint] = []
    rem = flat
    for s, st in zip(shape, strides):
        if s == 1:
            parts.append(0)
        elif st == 1:
            parts.append(rem)
            rem = 0
        else:
            q, rem = sym._split_multiples(rem, st)
            parts.append(q)
    return parts


def _parts_in_range(parts: list[sint], shape: tuple[sint, ...], valid: sint) -> bool:
    """Whether ``0 <= parts[k] < shape[k]`` for every k wherever ``valid`` holds: from the
    parts' own bounds, or from factors ``c < e`` and ``e < E`` of ``valid`` with a part equal
    to ``e`` plus a constant (a padded window's row ``2*o + k - 1`` where
    ``0 < 2*o + k < H + 1``)."""
    facts = (
        [f.args for f in sym._factors(valid) if f.kind == sym.LT]
        if isinstance(valid, sym.Expr)
        else []
    )

    def offset(q: sint, e: sint) -> int | None:
        return sym.as_int(sym.add(q, sym.mul(e, -1)))

    for q, size in zip(parts, shape):
        if size == 1:
            continue
        low = sym.prove_nonneg(q) or any(
            isinstance(a, int) and (d := offset(q, b)) is not None and a + 1 + d >= 0
            for a, b in facts
        )
        high = sym.prove_lt(q, size) or any(
            (d := offset(q, a)) is not None
            and sym.prove_nonneg(sym.add(size, sym.mul(sym.add(b, d), -1)))
            for a, b in facts
        )
        if not (low and high):
            return False
    return True


def _narrowed(valid: sint) -> dict[str, sint]:
    """Index variables with the ranges that the factors ``c < v`` and ``v < c`` (c an int)
    of ``valid`` leave them: the second half of a concatenation reads its source at
    ``32*h + k - 16`` where ``15 < k``, an affine index only under that fact."""
    lo: dict[str, int] = {}
    hi: dict[str, int] = {}
    found: dict[str, sym.Expr] = {}
    for f in sym._factors(valid) if isinstance(valid, sym.Expr) else []:
        if f.kind != sym.LT:
            continue
        a, b = f.args
        if isinstance(a, int) and isinstance(b, sym.Expr) and b.kind == sym.VAR:
            lo[b.name] = max(lo.get(b.name, b.lo), a + 1)
            found[b.name] = b
        elif isinstance(b, int) and isinstance(a, sym.Expr) and a.kind == sym.VAR:
            hi[a.name] = min(hi.get(a.name, a.hi), b - 1)
            found[a.name] = a
    out: dict[str, sint] = {}
    for name, v in found.items():
        low, high = lo.get(name, v.lo), hi.get(name, v.hi)
        if low > high:
            continue  # never valid: the read is masked out everywhere
        if (low, high) == (v.lo, v.hi):
            continue
        ext = v.args[3]
        if name in hi and (ext is None or isinstance(ext, int)):
            ext = high + 1 if ext is None else min(ext, high + 1)
        out[name] = sym.var(name, low, high, ext)
    return out
