"""Measure a kernel's alternatives, keep the fastest that matches the reference, cache it.

Shared by library-call selection (select.py) and schedule selection (schedules.py). For one
kernel the caller gives candidates (cut-out sub-programs with a cost-model estimate) and the
reference sub-program (the kernel as lowered, before any rewrite of the search). The tuner:

1. answers from the cache when it can: in memory (identical layers of one model), else on
   disk, keyed by (target, sizes, the sub-programs' fingerprints);
2. ranks candidates by the cost model and measures the best ``LUMINAL_SEARCH_CANDIDATES``
   (the default, what compile does without a search, always among them) through ``measure``,
   the caller's runtime path; a candidate whose first run exceeds ``LUMINAL_SEARCH_MEASURE_MS``
   is run once, and so is one whose first run is ``RACE_MARGIN`` times the fastest so far
   (on targets that race); past ``LUMINAL_SEARCH_BUDGET_S`` of measuring in one compile,
   kernels keep their default, unmeasured and uncached; a lone candidate (the caller's cost
   model left no other) is not timed, only checked;
3. checks the fastest against the reference's outputs on the same seeded random inputs; a
   mismatch drops it (a warning at ``LUMINAL_DEBUG>=1``) and the next fastest is checked;
4. caches the timings, verdicts and choice.

``LUMINAL_DEBUG>=3`` prints one line per searched kernel and a summary per compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import flags
from ...graph import dtypes as dt
from ...graph import symbolic as sym
from .. import kernel_ir as K
from ..lower import BufferInfo, Lowered
from ..target import CostModel, ScheduleSpace

# bumped when what a decision measured changes (v2: gemm calls run on the runtime's workers;
# v3: symbolic dims are measured at their smallest values too; v4: vector code at the
# target's native width; v5: padding masks as loop windows, outer indices advanced per task;
# v6: candidates measured with their schedule applied, which v5 timed as the default code;
# v7: a plain product's default schedule renders a 2-D register block;
# v8: a schedule decision lists its candidates default first, then by cost, unrendered past
# the measured ones; v9: jammed products by quantized weights in named vector accumulators;
# v10: their default jam is 8, few rows unrolled; v11: 4 where 8 rows leave the L1;
# v12: a jammed dim's rest runs as one block; v13: in clamped blocks of its digits;
# v14: a jammed block's costly epilogue runs along its columns; v15: the measured slots go
# to candidates of distinct structure among those the cost model (nearly) ties, ``spread``;
# v16: reducing kernels estimated at the target's reduce_speedup, ranked above copy+gemm;
# v17: a jam whose rows leave the L1 estimated as half of it)
CACHE_VERSION = "tuner-v20"

# Bytes of all the buffers of the program being compiled (weights, inputs, intermediates) at
# the dims its candidates are measured at, set by the pipeline while its stages search: at
# most this much other data passes through a device's caches between two runs of one step,
# which a target's measurement may reproduce (a small model's weights stay cached)
PROGRAM_BYTES: ContextVar[int | None] = ContextVar("program_bytes", default=None)

# values of symbolic dims the caller knows the graph runs at (the example a torch.compile call
# traced): candidates are measured there rather than at the shared budget of
# ``select.representative_dims``, and the range's smallest sizes weigh by the time they add
TYPICAL_DIMS: ContextVar[Mapping[str, int] | None] = ContextVar("typical_dims", default=None)


def program_bytes(low: Lowered, dims: Mapping[str, int]) -> int:
    return sum(int(sym.evaluate(b.nbytes(), dims)) for b in low.buffers)


# A candidate whose first run is this many times the fastest one's time cannot win by its
# repeats (repeats take the fastest of a few runs; on a quiet machine they differ from the
# first, cold one by well under 2x), so with a target that races it is run once. Set by the
# GEMM decisions of GPT-2 and BERT, where generated kernels timed 5-20x the library call and
# their repeats were most of the search's time.
RACE_MARGIN = 3.0
# ... and never below this many seconds: a short first run carries one-time costs (binding,
# first touch of the outputs) of the order of a small kernel, and repeating it is cheap
RACE_FLOOR_S = 1e-3

# Estimates within this fraction of the cheapest candidate not yet taken count as a tie
# (``spread``): the cost model does not see task order or chunking, and scores a kernel's
# 2-D blocks a few percent apart. Set by x(32,128) @ w(128,512) then tanh-GELU: schedules
# the model scores equal (601 us) measured 101-132 us, the 4x2 and 2x4 blocks scored 616.
TIE_MARGIN = 0.1


def spread(
    costs: Sequence[float],
    groups: Sequence[tuple[Hashable, ...]],
    picked: Sequence[int],
    pool: Iterable[int],
    counts: dict[tuple[Hashable, ...], int] | None = None,
) -> int | None:
    """The next candidate to measure after ``picked``, from ``pool`` (None when empty).

    Among the candidates whose cost is within ``TIE_MARGIN`` of the cheapest in the pool, the
    one least like those picked: ``groups[i]`` describes candidate ``i`` coarse to fine (a
    schedule's block shape, task order, split, chunk), and a candidate sharing fewer picks'
    first level wins, then fewer picks' first two levels, and so on; then the cheaper, then
    the earlier listed. So a kernel's 2-D blocks, jams and task orders each get a slot
    before a third variant the model cannot tell apart from the default (its ties were
    otherwise broken by list order, and the slots went to near copies of the default).
    ``counts`` (prefix -> picks with it) may be passed to keep between calls; it must then
    already count ``picked``."""
    pool = list(pool)
    if not pool:
        return None
    if counts is None:
        counts = {}
        for j in picked:
            for n in range(1, len(groups[j]) + 1):
                counts[groups[j][:n]] = counts.get(groups[j][:n], 0) + 1
    bound = min(costs[i] for i in pool) * (1 + TIE_MARGIN)

    def key(i: int) -> tuple:
        g = groups[i]
        return (tuple(counts.get(g[:n], 0) for n in range(1, len(g) + 1)), costs[i], i)

    return min((i for i in pool if costs[i] <= bound), key=key)


def spread_order(
    costs: Sequence[float], groups: Sequence[tuple[Hashable, ...]], first: int, n: int
) -> list[int]:
    """``first``, then the next ``n - 1`` candidates ``spread`` picks one after another."""
    picked = [first]
    counts: dict[tuple[Hashable, ...], int] = {}
    pool = set(range(len(costs))) - {first}
    while True:
        last = groups[picked[-1]]
        for k in range(1, len(last) + 1):
            counts[last[:k]] = counts.get(last[:k], 0) + 1
        if len(picked) >= n:
            return picked
        i = spread(costs, groups, picked, sorted(pool), counts)
        if i is None:
            return picked
        picked.append(i)
        pool.discard(i)


def smallest_dims(sub: Lowered, dims: Mapping[str, int]) -> dict[str, int]:
    """``dims`` with every symbolic dim at its smallest value (a decode step's one token): a
    plan serves its whole range, so a choice is measured at both ends of it. A program that
    runs for a part of a product of dims (``Kernel.when``) is measured within that part."""
    low = {n: (max(sub.dims[n].lo, 1) if n in sub.dims else v) for n, v in dims.items()}
    return fit_product(low, K.part_of(sub.kernels), sub.dims)


def fit_product(
    dims: Mapping[str, int], when: K.When | None, box: Mapping[str, sym.Expr]
) -> dict[str, int]:
    """``dims`` moved (each within its range in ``box``) so that the product of the dims of
    ``when`` lies in its range: the largest dim shrinks while the product is above it, the
    smallest grows while below. Unchanged for no condition or a one-dim one (the dim's own
    range says it)."""
    out = dict(dims)
    if when is None or len(when[0]) < 2:
        return out
    names, lo, hi = [n for n in when[0] if n in out], when[1], when[2]

    def prod() -> int:
        p = 1
        for n in names:
            p *= out[n]
        return p

    while prod() > hi:
        movable = [n for n in names if out[n] > max(box[n].lo, 1)]
        if not movable:
            break
        n = max(movable, key=lambda n: out[n])
        rest = prod() // out[n]
        out[n] = max(max(box[n].lo, 1), min(out[n] - 1, hi // rest))
    while prod() < lo:
        movable = [n for n in names if out[n] < box[n].hi]
        if not movable:
            break
        n = min(movable, key=lambda n: out[n])
        rest = prod() // out[n]
        out[n] = min(box[n].hi, max(out[n] + 1, -(-lo // rest)))
    return out


def _scores(
    rep: Mapping[int, float], small: Mapping[int, float], typical: bool = False
) -> dict[int, float]:
    """Per candidate: its time relative to the fastest, the worse of the representative and
    the smallest sizes (minimax: no choice much slower than the best at either end). With
    ``typical`` (the representative sizes are the ones the caller said the graph runs at,
    ``TYPICAL_DIMS``), the smallest sizes count by the time they add: a candidate's loss there
    over the fastest, as a fraction of the fastest time at the typical sizes. Measured by
    ratio, a conv's patches copied summed axis first lost to the row-order copy on every
    layer of a ResNet that they ran faster in (1.1-1.4x at 64 x 64 pixels), for a 2x
    loss of microseconds at the range's 2 x 2."""
    best = min(rep.values(), default=1.0) or 1e-12
    out = {i: t / best for i, t in rep.items()}
    if small:
        best_s = min(small.values()) or 1e-12
        if typical:
            return {i: max(r, 1 + (small.get(i, best_s) - best_s) / best) for i, r in out.items()}
        out = {i: max(r, small.get(i, best_s) / best_s) for i, r in out.items()}
    return out


# Candidates scored within this fraction of the fastest are measured again
# (``LUMINAL_SEARCH_CONFIRM`` rounds, in turns): one candidate's repeats take a few tens of
# milliseconds, and a burst of another process's work in that window made a kernel look up
# to 2x slower. Set by a diffusers VAE compiled four times with empty caches on a 2-core
# machine while other work ran (its plans ran 14.3-25.5 ms; its decisions' candidates
# measured 5-40% apart) and by the spread of repeated measurements of one kernel there
# under load, 5-20% (``flags.SEARCH_CANDIDATES``)
CLOSE_MARGIN = 0.25
# Scores within this fraction of the best count as equal and go to the candidate the cost
# model ranks first, so that repeated compiles keep one choice where the measurement cannot
# tell them apart (repeats of one kernel in one compile differ by a few percent)
SAME_SCORE = 0.03


def _preference(score: Mapping[int, float], rank: Mapping[int, int]) -> list[int]:
    """Measured candidates, most preferred first: those scoring within ``SAME_SCORE`` of the
    best by the cost model's rank, then the rest by score."""
    bound = min(score.values(), default=0.0) * (1 + SAME_SCORE)
    same = sorted((i for i in score if score[i] <= bound), key=lambda i: rank[i])
    return same + sorted((i for i in score if score[i] > bound), key=lambda i: (score[i], rank[i]))


@dataclass
class Timing:
    """A measurement: seconds of one run (the target says how it is taken from ``runs`` runs)
    and, when the runner keeps them, the outputs of a run on the seeded inputs of
    ``random_inputs`` (used for the check)."""

    seconds: float
    runs: int = 1
    outputs: dict[str, np.ndarray] | None = None


# measure(subprogram, dims) -> seconds, or a Timing with the outputs
Measure = Callable[[Lowered, dict[str, int]], "float | Timing"]
# evaluate(subprogram, dims) -> outputs on the seeded inputs of random_inputs
Evaluate = Callable[[Lowered, dict[str, int]], dict[str, np.ndarray]]


@dataclass
class Candidate:
    label: str
    sub: Lowered  # the cut-out program that runs it
    cost: float  # cost-model estimate in seconds: ranks which candidates are measured
    payload: Any = None  # what the caller applies when this one is chosen
    # its structure, coarse to fine (``spread``); () counts as its label alone
    group: tuple[Hashable, ...] = ()


def _groups(candidates: Sequence[Candidate]) -> list[tuple[Hashable, ...]]:
    return [c.group or (c.label,) for c in candidates]


@dataclass
class Stats:
    searched: int = 0  # kernels decided by measurement
    cached: int = 0  # kernels answered from a cache
    measurements: int = 0  # calls of measure
    checks: int = 0  # candidates compared against the reference
    rejected: int = 0  # candidates dropped by the check
    over_budget: int = 0  # kernels left at their default because the budget was spent
    seconds: float = 0.0  # spent measuring and checking


STATS = Stats()  # process-wide totals (tests count measurements with them)
_MEMORY: dict[str, dict[str, Any]] = {}  # cache key -> decision, for identical kernels


def clear_memory_cache() -> None:
    """Forget decisions held in memory (the disk cache stays)."""
    _MEMORY.clear()


def cache_dir() -> str:
    base = flags.cache_base()
    return os.path.join(base, "search")


def sub_fingerprint(sub: Lowered) -> str:
    """A digest of a cut-out program: its buffers (dtype, role, shape) and steps."""
    bufs = ";".join(
        f"{b.dtype.name}:{b.role}:{','.join(sym.fingerprint(s) for s in b.shape)}"
        for b in sub.buffers
    )
    return bufs + "/" + K.fingerprint(sub.kernels)  # type: ignore[arg-type]


def cache_key(parts: Sequence[str]) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


# random inputs kept for later measurements (the candidates of a decision read the same
# buffers, and each is measured at two sizes and checked): at most this many bytes
INPUTS_KEPT_BYTES = 128 << 20
_INPUTS: OrderedDict[tuple, np.ndarray] = OrderedDict()


def random_inputs(
    sub: Lowered, dims: Mapping[str, int], np_types: Mapping[str, Any], seed: int
) -> dict[str, np.ndarray]:
    """Seeded random inputs for a cut-out program. Each buffer's values depend only on its
    name (cut-outs name buffers after the whole program's), so two candidates that read the
    same buffers in a different order see the same data; a buffer the cut-out holds in its
    ``weights`` (a weight stored in another layout by one candidate) takes those values. The
    arrays are read-only: they are kept and shared with later measurements."""
    out = {}
    for b in sub.buffers:
        if b.role != "input":
            continue
        shape = tuple(int(sym.evaluate(s, dims)) for s in b.shape)
        np_type = np.dtype(np_types[b.name])
        held = sub.weights.get(b.name)
        if held is not None:
            w = np.asarray(held).astype(np_type, copy=False).reshape(shape)
            w.flags.writeable = False  # a view: the plan's own array stays as it is
            out[b.name] = w
            continue
        key = (seed, b.name, shape, b.dtype.name, np_type.str)
        a = _INPUTS.get(key)
        if a is None:
            a = _random_array(
                b.dtype, shape, np_type, np.random.default_rng([seed, zlib.crc32(b.name.encode())])
            )
            a.flags.writeable = False
            if a.nbytes <= INPUTS_KEPT_BYTES:
                _INPUTS[key] = a
                kept = sum(x.nbytes for x in _INPUTS.values())
                while kept > INPUTS_KEPT_BYTES:
                    kept -= _INPUTS.popitem(last=False)[1].nbytes
        else:
            _INPUTS.move_to_end(key)
        out[b.name] = a
    return out


def _random_array(
    d: dt.DType, shape: tuple[int, ...], np_type: np.dtype, rng: np.random.Generator
) -> np.ndarray:
    a: np.ndarray
    if d is dt.e8m0:  # block scales: powers of two near 1 (255 would be NaN)
        a = np.exp2(rng.integers(-4, 5, shape)).astype(np.float32)
    elif d.is_float:
        a = rng.standard_normal(shape, dtype=np.float32)
    elif d is dt.bool_:
        a = rng.integers(0, 2, shape).astype(bool)
    elif d.bits <= 8:  # quantized bytes and nibbles: every code
        info = (-8, 8) if d is dt.i4 else (0, 16) if d is dt.u4 else None
        if info is None:
            ii = np.iinfo(np.dtype(d.np_type))
            info = (int(ii.min), int(ii.max) + 1)
        a = rng.integers(info[0], info[1], shape, dtype=np.int16)
    else:  # indices: small, mostly in range
        a = rng.integers(0, 16, shape)
    return a.astype(np_type, copy=False)


def mismatch(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> str | None:
    """Why ``got`` does not match the reference outputs, or None. Floats may differ by
    rounding (the search reorders sums): 1e-3 relative (1e-2 for 16-bit and smaller types)
    plus 1e-4 of the output's largest magnitude; NaNs must match; integers exactly."""
    common = sorted(set(ref) & set(got))
    if not common:
        return "no output in common with the reference"
    for name in common:
        a, b = np.asarray(ref[name]), np.asarray(got[name])
        if a.shape != b.shape:
            return f"{name}: shape {b.shape}, reference {a.shape}"
        if a.dtype.kind in "iub":
            differ = int(np.count_nonzero(a != b))
            if differ:
                return f"{name}: {differ} of {a.size} values differ"
            continue
        x, y = a.astype(np.float64), b.astype(np.float64)
        nan = np.isnan(x)
        if not np.array_equal(nan, np.isnan(y)):
            return f"{name}: NaNs differ"
        x, y = np.where(nan, 0, x), np.where(nan, 0, y)
        same_inf = np.isinf(x) & (x == y)
        x, y = np.where(same_inf, 0, x), np.where(same_inf, 0, y)
        rtol = 1e-2 if a.dtype.itemsize <= 2 else 1e-3
        finite = np.abs(x[np.isfinite(x)])
        atol = 1e-4 * float(finite.max()) if finite.size else 0.0
        err = np.abs(x - y)
        bad = ~(err <= atol + rtol * np.abs(x))
        if bad.any():
            i = int(np.argmax(np.where(bad, err, -1)))
            return (f"{name}: {int(bad.sum())} of {a.size} values differ, worst "
                    f"{y.flat[i]!r} vs {x.flat[i]!r}")  # fmt: skip
    return None


def _to_prepare(reference: Lowered, measured: Sequence[Candidate]) -> list[Lowered]:
    """The programs a decision runs: its measured candidates and the reference the kept one is
    checked against (compiled in the same batch, not alone after the measurements)."""
    subs = [c.sub for c in measured]
    return subs if any(s is reference for s in subs) else [*subs, reference]


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{1e3 * s:.2f}ms" if s >= 1e-3 else f"{1e6 * s:.1f}us"


@dataclass
class Tuner:
    """One compile's search: its measuring and checking callables, bounds and counters."""

    measure: Measure
    target: str
    evaluate: Evaluate | None = None  # None: candidates are kept unchecked (no runner)
    cost: CostModel = field(default_factory=CostModel)  # the target's, for ranking
    space: ScheduleSpace = field(default_factory=ScheduleSpace)  # the target's schedules
    # the target's other implementations of a library call (Target.library_variants)
    variants: Callable[[K.LibCall, Sequence[BufferInfo]], list[tuple[str, K.LibCall]]] | None = None
    # the target's batch preparation (Target.prepare(lows, wait)): a stage's candidates
    # compiled at once; with wait=False, started in the background
    prepare: Callable[..., None] | None = None
    # measure takes ``cutoff=`` (Target.races): a candidate's first run slower than that is its
    # only one, so a clear loser costs one run instead of its repeats
    races: bool = False
    # a schedule stage follows that chooses task orders: the library-call choice leaves them
    schedules: bool = False
    # what the target's measurements depend on beyond a cut-out and its dims
    # (Target.measure_context): part of each decision's cache key
    context: Callable[[], str] | None = None
    # the target's implementations of a library call that also run its epilogue kernel
    # (Target.library_epilogues): each writes the epilogue's output itself
    epilogues: Callable[[K.LibCall, K.Kernel, Sequence[BufferInfo]],
                        list[tuple[str, K.LibCall]]] | None = None  # fmt: skip
    budget_s: float = field(default_factory=flags.SEARCH_BUDGET.as_float)
    max_candidates: int = field(default_factory=flags.SEARCH_CANDIDATES.as_int)
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        if self.max_candidates < 1:
            raise ValueError(f"{flags.SEARCH_CANDIDATES.name} must be at least 1")
        self._spent = 0.0
        # candidate programs prefetch prepared (or handed over to prepare in the background)
        self._ready: dict[int, Lowered] = {}
        self._handed = False  # a prefetch(wait=False) since the last one that waited
        self._keys: dict[int, tuple[Any, ...]] = {}  # id(candidates) -> (them, ..., cache key)

    def _count(self, what: str, n: float = 1) -> None:
        for s in (self.stats, STATS):
            setattr(s, what, getattr(s, what) + n)

    def _say(self, line: str, level: int = 3) -> None:
        if flags.debug() >= level:
            print(f"luminal search: {line}", file=sys.stderr)

    def choose(
        self,
        name: str,
        kind: str,
        dims: dict[str, int],
        reference: Lowered,
        candidates: Sequence[Candidate],
        default: int = 0,
    ) -> Candidate:
        """The candidate to keep for kernel ``name`` (``kind`` names the search in messages).
        A candidate whose ``sub`` is ``reference`` needs no check."""
        return self.decide(name, kind, dims, reference, candidates, default)[0]

    def decide(
        self,
        name: str,
        kind: str,
        dims: dict[str, int],
        reference: Lowered,
        candidates: Sequence[Candidate],
        default: int = 0,
    ) -> tuple[Candidate, dict[str, Any] | None]:
        """``choose``, with the decision's record (per candidate its ``seconds`` at ``dims``
        and ``small_seconds`` at the smallest dims; None when the budget was spent)."""
        if not candidates:
            raise ValueError(f"search for {name}: no candidates")
        key, hit = self._cached(kind, dims, reference, candidates)
        mkey = cache_dir() + "/" + key  # another cache folder is another cache
        if hit is not None:
            _MEMORY[mkey] = hit
            self._count("cached")
            chosen = candidates[hit["choice"]]
            self._say(f"{name} [{kind}]: cached -> {chosen.label}")
            return chosen, hit
        if self._spent >= self.budget_s:
            self._count("over_budget")
            self._say(f"{name} [{kind}]: search budget ({self.budget_s:g} s) spent -> "
                      f"{candidates[default].label}")  # fmt: skip
            return candidates[default], None
        t0 = time.perf_counter()
        try:
            record = self._search(name, dims, reference, candidates, default)
        finally:
            self._spent += time.perf_counter() - t0
            self._count("seconds", time.perf_counter() - t0)
        self._count("searched")
        _MEMORY[mkey] = record
        self._write(key, record)
        chosen = candidates[record["choice"]]
        rows = []
        for c, r in zip(candidates, record["candidates"], strict=True):
            if r["seconds"] is None:
                rows.append(f"#{r['rank']} {c.label} -")
            else:
                v = {None: "", True: " ok", False: " WRONG"}[r["verdict"]]
                rows.append(f"#{r['rank']} {c.label} {_fmt_time(r['seconds'])}x{r['runs']}{v}")
        self._say(f"{name} [{kind}]: {len(candidates)} considered: {' | '.join(rows)} "
                  f"-> {chosen.label}")  # fmt: skip
        return chosen, record

    def _cached(
        self, kind: str, dims: dict[str, int], reference: Lowered, candidates: Sequence[Candidate]
    ) -> tuple[str, dict[str, Any] | None]:
        """The decision's cache key and its cached record (in memory, else on disk), if any.
        The key of a decision ``prefetch`` saw is not computed again (fingerprints walk every
        candidate's kernels)."""
        seen = self._keys.get(id(candidates))
        dims_key = repr(sorted(dims.items()))
        context = self.context() if self.context is not None else ""
        if context:
            dims_key += "|" + context
        if (
            seen is not None
            and seen[0] is candidates
            and seen[1] is reference
            and seen[2:4] == (kind, dims_key)
        ):
            key = seen[4]
        else:
            key = cache_key(
                [CACHE_VERSION, kind, self.target, dims_key,
                 repr(sorted(smallest_dims(reference, dims).items())), sub_fingerprint(reference)]
                + [f"{c.label}={sub_fingerprint(c.sub)}" for c in candidates]
            )  # fmt: skip
            self._keys[id(candidates)] = (candidates, reference, kind, dims_key, key)
        hit = _MEMORY.get(cache_dir() + "/" + key) or self._read(key)
        ok = hit is not None and 0 <= hit.get("choice", -1) < len(candidates)
        return key, hit if ok else None

    def _measured(self, candidates: Sequence[Candidate], default: int) -> list[int]:
        """The candidates a search measures: the default and the others ``spread`` picks."""
        costs = [c.cost for c in candidates]
        return spread_order(costs, _groups(candidates), default, self.max_candidates)

    def prefetch(
        self,
        decisions: Sequence[tuple[str, dict[str, int], Lowered, Sequence[Candidate]]],
        wait: bool = True,
    ) -> None:
        """Ready the target to measure the candidates of many decisions (``(kind, dims,
        reference, candidates)``, default 0) in one ``prepare``: a stage's kernels compile on
        all cores together instead of a few at a time. Cached decisions need nothing.

        ``wait=False`` hands them to the target to compile in the background and returns: a
        stage that lists its decisions one by one (Python, one core) hands each over as it is
        listed, so the compiler runs on the other core meanwhile; its last call (waiting, with
        every decision) compiles what was not started yet on all cores."""
        if self.prepare is None or self._spent >= self.budget_s:
            return
        subs = []
        for kind, dims, reference, candidates in decisions:
            if (len(candidates) > 1 or candidates[0].sub is not reference) and self._cached(
                kind, dims, reference, candidates
            )[1] is None:
                subs += [
                    s
                    for s in _to_prepare(
                        reference, [candidates[i] for i in self._measured(candidates, 0)]
                    )
                    if self._ready.get(id(s)) is not s
                ]
        if not wait:
            if subs:
                self.prepare(subs, wait=False)
                self._ready.update({id(s): s for s in subs})
                self._handed = True
            return
        if len(subs) > 1 or self._handed:
            t0 = time.perf_counter()
            self.prepare(subs)
            self._spent += time.perf_counter() - t0
            self._ready.update({id(s): s for s in subs})
            self._handed = False

    def warm(self, programs: Sequence[Lowered]) -> None:
        """Hand programs the plan will run that no decision measures to the target to compile
        in the background (``prepare(wait=False)``): the stages after the search run
        meanwhile, and the plan then finds their kernels compiled."""
        if self.prepare is not None and programs:
            self.prepare(list(programs), wait=False)

    def _search(
        self,
        name: str,
        dims: dict[str, int],
        reference: Lowered,
        candidates: Sequence[Candidate],
        default: int,
    ) -> dict[str, Any]:
        # ranks by the cost model: the order measured in (a likely winner first, so racing
        # cuts the losers short), not which are (``spread``)
        order = sorted(range(len(candidates)), key=lambda i: (candidates[i].cost, i != default, i))
        rank = {i: r + 1 for r, i in enumerate(order)}
        chosen = self._measured(candidates, default)
        timings: dict[int, Timing] = {}
        start = self._spent
        t0 = time.perf_counter()
        small = smallest_dims(reference, dims)
        small_times: dict[int, float] = {}
        failed: set[int] = set()
        if self.prepare is not None and (len(chosen) > 1 or candidates[0].sub is not reference):
            subs = _to_prepare(reference, [candidates[i] for i in chosen])
            if not all(self._ready.get(id(s)) is s for s in subs):
                self.prepare(subs)
        for i in sorted(chosen, key=lambda i: rank[i]):
            if len(chosen) == 1:  # nothing to compare: only checked
                timings[i] = Timing(0.0, 0)
                break
            if i != default and start + time.perf_counter() - t0 >= self.budget_s:
                continue
            try:
                t = self._measure(candidates[i].sub, dims, [x.seconds for x in timings.values()])
                ts = self._measure(candidates[i].sub, small, list(small_times.values())) \
                    if small != dims else None  # fmt: skip
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run is no choice
                if candidates[i].sub is reference:
                    raise
                failed.add(i)
                self._count("rejected")
                self._say(f"{name}: candidate {candidates[i].label} failed to run and is "
                          f"dropped ({type(e).__name__}: {e})", level=1)  # fmt: skip
                continue
            timings[i] = t
            if ts is not None:
                small_times[i] = ts.seconds
        typical = TYPICAL_DIMS.get() or {}
        at_typical = bool(dims) and all(n in typical for n in dims)
        score = _scores({i: t.seconds for i, t in timings.items()}, small_times, at_typical)
        for r in range(flags.SEARCH_CONFIRM.as_int()):
            if start + time.perf_counter() - t0 >= self.budget_s:
                break
            if not self._confirm(candidates, dims, small, timings, small_times, score, rank, r):
                break
            score = _scores({i: t.seconds for i, t in timings.items()}, small_times, at_typical)
        verdicts: dict[int, bool | None] = {}
        choice = None
        ref_out: dict[str, np.ndarray] | None = None
        for i in _preference(score, rank):
            cand = candidates[i]
            if cand.sub is reference or self.evaluate is None:
                verdicts[i] = None  # the reference itself, or nothing to check with
                choice = i
                break
            if ref_out is None:
                ref_out = next(
                    (t.outputs for j, t in timings.items()
                     if candidates[j].sub is reference and t.outputs is not None),
                    None,
                ) or self.evaluate(reference, dims)  # fmt: skip
            got = timings[i].outputs or self.evaluate(cand.sub, dims)
            self._count("checks")
            why = mismatch(ref_out, got)
            verdicts[i] = why is None
            if why is None:
                choice = i
                break
            self._count("rejected")
            self._say(f"{name}: candidate {cand.label} does not match the reference and is "
                      f"dropped ({why})", level=1)  # fmt: skip
        if choice is None:  # every measured candidate failed: the reference, else the default
            refs = [i for i, c in enumerate(candidates) if c.sub is reference]
            choice = refs[0] if refs else default
        return {
            "kernel": name,
            "choice": choice,
            "candidates": [
                {"label": c.label, "rank": rank[i], "cost": c.cost,
                 "seconds": timings[i].seconds if timings.get(i, Timing(0.0, 0)).runs else None,
                 "small_seconds": small_times.get(i),
                 "runs": timings[i].runs if i in timings else 0,
                 "verdict": False if i in failed else verdicts.get(i)}
                for i, c in enumerate(candidates)
            ],
        }  # fmt: skip

    def _confirm(
        self,
        candidates: Sequence[Candidate],
        dims: dict[str, int],
        small: dict[str, int],
        timings: dict[int, Timing],
        small_times: dict[int, float],
        score: Mapping[int, float],
        rank: Mapping[int, int],
        round_: int,
    ) -> bool:
        """One round of measuring again the candidates within ``CLOSE_MARGIN`` of the best
        score, one after another (in turn order, reversed every other round), each keeping its
        fastest time so far; False when fewer than two are that close or they are long runs
        (measured once: their time varies less, and a run costs more)."""
        best = min(score.values(), default=0.0)
        close = sorted(
            (i for i in timings
             if timings[i].runs and score[i] <= best * (1 + CLOSE_MARGIN)
             and 1e3 * timings[i].seconds <= flags.SEARCH_MEASURE_MS.as_float()),
            key=lambda i: rank[i],
        )  # fmt: skip
        if len(close) < 2:
            return False
        for i in close if round_ % 2 else reversed(close):
            sub = candidates[i].sub
            t = self._measure(sub, dims, [])
            old = timings[i]
            timings[i] = Timing(min(old.seconds, t.seconds), old.runs + t.runs, old.outputs)
            if i in small_times:
                small_times[i] = min(small_times[i], self._measure(sub, small, []).seconds)
        return True

    def _measure(self, sub: Lowered, dims: dict[str, int], so_far: list[float]) -> Timing:
        """One candidate's timing; with ``races``, cut off at ``RACE_MARGIN`` times the fastest
        candidate timed so far at these sizes (at least ``RACE_FLOOR_S``)."""
        self._count("measurements")
        if self.races and so_far:
            cutoff = max(RACE_MARGIN * min(so_far), RACE_FLOOR_S)
            t = self.measure(sub, dims, cutoff=cutoff)  # type: ignore[call-arg]
        else:
            t = self.measure(sub, dims)
        return t if isinstance(t, Timing) else Timing(float(t))

    def _read(self, key: str) -> dict[str, Any] | None:
        try:
            with open(os.path.join(cache_dir(), key + ".json")) as f:
                rec = json.load(f)
            return rec if isinstance(rec, dict) and isinstance(rec.get("choice"), int) else None
        except (OSError, ValueError):
            return None

    def _write(self, key: str, record: dict[str, Any]) -> None:
        path = os.path.join(cache_dir(), key + ".json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)

    def summary(self) -> None:
        s = self.stats
        if s.searched or s.cached or s.over_budget:
            self._say(f"{s.searched} kernels measured ({s.measurements} runs of candidates, "
                      f"{s.checks} checked, {s.rejected} rejected), {s.cached} from the cache, "
                      f"{s.over_budget} over budget, {s.seconds:.2f} s")  # fmt: skip
