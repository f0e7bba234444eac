"""Views: how an edge reads its source without copying.

A ``View`` maps the logical index of the consumer (index variables ``_i0 .. _i{n-1}``, one per
dimension of ``shape``) to a flat element offset into the source node's contiguous buffer, plus
a 0/1 ``valid`` expression: where it is 0 the read gives 0 (padding). Permute, expand, slice
(any step), pad, reshape and merge/split of dims are substitutions into these expressions, so
none of them copies; a reshape of a permuted tensor becomes div/mod index arithmetic, which the
symbolic simplifier folds back to strides wherever they exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import symbolic as sym
from .symbolic import sint


def _prod(xs: Sequence[sint]) -> sint:
    out: sint = 1
    for x in xs:
        out = sym.mul(out, x)
    return out


def contiguous_strides(shape: Sequence[sint]) -> tuple[sint, ...]:
    strides: list[sint] = []
    acc: sint = 1
    for s in reversed(shape):
        strides.append(acc)
        acc = sym.mul(acc, s)
    return tuple(reversed(strides))


def idx_vars(shape: Sequence[sint]) -> list[sint]:
    return [sym.index_var(k, s) for k, s in enumerate(shape)]


@dataclass(frozen=True)
class View:
    shape: tuple[sint, ...]
    index: sint
    valid: sint = 1

    @staticmethod
    def contiguous(shape: Sequence[sint]) -> View:
        shape = tuple(shape)
        idx: sint = 0
        for v, st in zip(idx_vars(shape), contiguous_strides(shape)):
            idx = sym.add(idx, sym.mul(v, st))
        return View(shape, idx, 1)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def is_contiguous(self) -> bool:
        return self.valid == 1 and self == View.contiguous(self.shape)

    def numel(self) -> sint:
        return _prod(self.shape)

    def _remap(self, new_shape: Sequence[sint], old_idx: Sequence[sint], valid: sint = 1) -> View:
        """New view whose old index variable k reads ``old_idx[k]`` (in new index vars)."""
        mapping = {f"_i{k}": e for k, e in enumerate(old_idx)}
        return View(
            tuple(new_shape),
            sym.substitute(self.index, mapping),
            sym.mul(sym.substitute(self.valid, mapping), valid),
        )

    def permute(self, order: Sequence[int]) -> View:
        new_shape = [self.shape[o] for o in order]
        nv = idx_vars(new_shape)
        old: list[sint] = [0] * self.ndim
        for j, o in enumerate(order):
            old[o] = nv[j]
        return self._remap(new_shape, old)

    def expand(self, shape: Sequence[sint]) -> View:
        """Broadcast size-1 dims to ``shape`` (same rank)."""
        nv = idx_vars(shape)
        old = [
            0 if (s == 1 and n != 1) else nv[k] for k, (s, n) in enumerate(zip(self.shape, shape))
        ]
        return self._remap(shape, old)

    def unsqueeze(self, dim: int) -> View:
        new_shape = list(self.shape)
        new_shape.insert(dim, 1)
        nv = idx_vars(new_shape)
        old = [nv[k] if k < dim else nv[k + 1] for k in range(self.ndim)]
        return self._remap(new_shape, old)

    def slice(self, dim: int, start: sint, length: sint, step: int = 1) -> View:
        """Keep ``length`` elements along ``dim``: ``start, start+step, ...`` (step may be < 0)."""
        new_shape = list(self.shape)
        new_shape[dim] = length
        nv = idx_vars(new_shape)
        old = list(nv[: self.ndim])
        old[dim] = sym.add(start, sym.mul(nv[dim], step))
        return self._remap(new_shape, old)

    def pad(self, dim: int, before: sint, after: sint) -> View:
        """Grow ``dim`` by ``before``/``after`` elements that read as 0."""
        n = self.shape[dim]
        new_shape = list(self.shape)
        new_shape[dim] = sym.add(sym.add(n, before), after)
        nv = idx_vars(new_shape)
        old = list(nv)
        old[dim] = sym.add(nv[dim], sym.mul(before, -1))
        ok = sym.mul(
            sym.lt(sym.add(before, -1), nv[dim]),
            sym.lt(nv[dim], sym.add(before, n)),
        )
        return self._remap(new_shape, old, ok)

    def reshape(self, shape: Sequence[sint]) -> View:
        shape = tuple(shape)
        flat: sint = 0
        for v, st in zip(idx_vars(shape), contiguous_strides(shape)):
            flat = sym.add(flat, sym.mul(v, st))
        # the outermost dim needs no modulo: flat < numel
        old = [
            0
            if s == 1
            else sym.floordiv(flat, st)
            if k == 0
            else sym.mod(sym.floordiv(flat, st), s)
            for k, (s, st) in enumerate(zip(self.shape, contiguous_strides(self.shape)))
        ]
        return self._remap(shape, old)

    def __repr__(self) -> str:
        v = "" if self.valid == 1 else f", valid={self.valid}"
        return f"View({list(self.shape)}, index={self.index}{v})"


def _is_var(e: sint, name: str) -> bool:
    return isinstance(e, sym.Expr) and e.kind == sym.VAR and e.args[0] == name


def _divisors(e: sint, name: str, out: set[sint]) -> None:
    """Divisors (constant or symbolic) of the floor divisions and mods in ``e`` whose dividend
    is variable ``name`` plus other terms."""
    if not isinstance(e, sym.Expr) or e.kind == sym.VAR:
        return
    a, d = e.args[0], e.args[-1]
    if e.kind in (sym.DIV, sym.MOD) and isinstance(a, sym.Expr):
        if _is_var(a, name) or a.kind == sym.ADD and any(_is_var(t, name) for t, _ in a.args[0]):
            out.add(d)
    subs = [t for t, _ in e.args[0]] if e.kind == sym.ADD else e.args
    for x in subs:
        _divisors(x, name, out)


def _divides(d: sint, n: sint) -> bool:
    """Whether ``n == d * q`` exactly for some q other than 1 (symbolically)."""
    if isinstance(d, int) and isinstance(n, int):
        return 1 < d < n and n % d == 0
    q, r = sym._split_multiples(n, d)
    return r == 0 and q not in (0, 1)


def split_axis(index: sint | list[sint], name: str | None, size: sint) -> list[tuple[sint, sint]]:
    """(extent, multiplier) of the loops that walk axis ``name`` of ``size``, outermost first:
    one loop, or several where ``index`` (or any of a list of indices) divides the axis
    variable by a chain of divisors (k read as (head, d); pixels read as (row, column) of a
    symbolic width): loops over those parts read affinely where one loop over the axis would
    divide at every step."""
    if name is None:
        return [(size, 1)]
    found: set[sint] = set()
    for e in index if isinstance(index, list) else [index]:
        _divisors(e, name, found)
    if isinstance(size, int):
        found = {d for d in found if isinstance(d, int)}
    chain: list[sint] = []
    for d in sorted(found, key=lambda d: (sym.upper_bound(d), repr(d))):
        if _divides(d, size) and (not chain or _divides(chain[-1], d)):
            chain.append(d)
    bounds = [size, *reversed(chain), 1]
    return [(sym.floordiv(bounds[j], bounds[j + 1]), bounds[j + 1]) for j in range(len(bounds) - 1)]
