"""The CPU target: C kernels (``codegen/c.py``) compiled by the system compiler and run by the
runtime's thread pool; GEMMs through the runtime's BLAS.

Cost constants are round numbers for one core class (they only rank which candidates are
measured; measurement decides). The schedule space: reduction splits of 8, 16 and 32 lanes (8
floats are one AVX2 register, 16 one AVX-512 register, 32 two registers of independent
partial sums), 8 or 32 output elements per task, both task orders, jams of 2, 4 or 8 rows
(register blocks), 2-D blocks of rows x columns of plain products and of products by
block-quantized weights, and blocks of one row by a few columns of products by a weight
gathered per row (``codegen/cpu/jam.py``: those that fit the registers).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import flags
from ..codegen.cpu import CKernel, render_kernel
from ..codegen.cpu.jam import (
    BLOCKS,
    COLUMNS,
    QBLOCKS,
    block_fits,
    columns_fit,
    qblock_fits,
    vector_registers,
)
from ..compiler import kernel_ir as K
from ..compiler.lower import BufferInfo, Lowered
from ..compiler.schedule import apply
from ..compiler.search.select import canonical_vars, cut_value, subprogram
from ..compiler.search.tuner import PROGRAM_BYTES, Timing, random_inputs, sub_fingerprint
from ..compiler.target import CostModel, ScheduleSpace
from ..graph import dtypes as dt
from ..plan import KernelFormat, Plan
from . import pgemm_epilogue
from .base import Launchable, assemble_plan

if TYPE_CHECKING:
    from ..runtime import Executor

# reduce_speedup: generated kernels that reduce measured 4-14x faster than ``ops`` makes them
# (f32 products x @ w.T, (rows x n x k) 32x512x128, 64x576x576, 128x768x768, 128x3072x768:
# 4-9x; Q4_1 1x576x576, 8x1536x576, 32x1536x576: 13-14x; 2 threads, AVX2), while the
# dequantizing copy of copy+gemm measured at 0.7-1.2x of its estimate and the GEMM call at
# 0.5-1.2x: at 1 a product by a quantized weight ranked copy+gemm first though it measured
# 3-9x slower than the generated kernel (and timed fully, before the racing cutoff was set)
COST = CostModel(bandwidth=10e9, ops=10e9, library_speedup=8.0, reduce_speedup=8.0,
                 launch=5e-6, cache_bytes=1 << 20, cache_bandwidth=40e9)  # fmt: skip


_REGS = vector_registers()  # 2-D blocks: those within the registers (codegen/cpu/jam.py)
SPACE = ScheduleSpace(splits=(8, 16, 32), chunks=(8, 32), orders=(0, 1), jams=(2, 4, 8),
                      blocks=tuple(b for b in BLOCKS if block_fits(*b, _REGS)),
                      qblocks=tuple(b for b in QBLOCKS if qblock_fits(*b, _REGS)),
                      columns=tuple(c for c in COLUMNS if columns_fit(c, _REGS)))  # fmt: skip


# rendered kernels kept by content: the search renders a candidate to tell schedules apart,
# again for its measuring plan, and the final plan renders the kept one once more
RENDERED_MAX = 4096
_RENDERED: OrderedDict[tuple, CKernel] = OrderedDict()


def render(k: K.Kernel, dim_names: list[str]) -> CKernel:
    """The C of a scheduled kernel (a searched chunk reaches the generator as inner_chunk)."""
    key = (k.name, K.fingerprint([k]), tuple(dim_names))
    hit = _RENDERED.get(key)
    if hit is not None:
        _RENDERED.move_to_end(key)
        return hit
    chunk = k.schedule.chunk if k.schedule is not None else 0
    c = render_kernel(k, dim_names, inner_chunk=chunk) if chunk else render_kernel(k, dim_names)
    _RENDERED[key] = c
    if len(_RENDERED) > RENDERED_MAX:
        _RENDERED.popitem(last=False)
    return c


class _SignatureFile:
    """Schedule signatures of kernels seen before, one line (key, signature) each, in a file
    of the search cache per luminal code version (the C a kernel renders to depends on the
    kernel, the dim names and the code generator). A search tells a decision's candidates
    apart by their C: with every decision cached this rendering was most of a compile
    (SmolLM2's decode plan: 825 renders, 12 of 29 s)."""

    KEEP = 4  # files of other code versions kept (the most recently used)

    def __init__(self, path: str) -> None:
        self.path = path
        self.known: dict[str, str] = {}
        try:
            with open(path, encoding="ascii") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2:  # a torn last line of a killed writer is skipped
                        self.known[parts[0]] = parts[1]
        except (OSError, UnicodeDecodeError):
            self.known.clear()

    def get(self, key: str) -> str | None:
        return self.known.get(key)

    def add(self, key: str, sig: str) -> None:
        self.known[key] = sig
        folder = os.path.dirname(self.path)
        try:
            new = not os.path.exists(self.path)
            os.makedirs(folder, exist_ok=True)
            # one short line per append: concurrent writers do not interleave within a line
            with open(self.path, "a", encoding="ascii") as f:
                f.write(f"{key} {sig}\n")
            if new:
                self._prune(folder)
        except OSError:
            pass  # a read-only cache: signatures are rendered again next time

    def _prune(self, folder: str) -> None:
        old = [os.path.join(folder, n) for n in os.listdir(folder)
               if n.startswith("signatures-") and os.path.join(folder, n) != self.path]  # fmt: skip
        old.sort(key=lambda p: os.stat(p).st_mtime, reverse=True)
        for p in old[self.KEEP :]:
            with contextlib.suppress(OSError):
                os.remove(p)


_SIGNATURE_FILES: dict[str, _SignatureFile] = {}


def _signatures() -> _SignatureFile:
    from ..compiler.search.tuner import cache_dir
    from ..plan_cache import code_id

    path = os.path.join(cache_dir(), f"signatures-{code_id()}.txt")
    f = _SIGNATURE_FILES.get(path)
    if f is None:
        f = _SIGNATURE_FILES[path] = _SignatureFile(path)
    return f


def _signature_key(k: K.Kernel, dim_names: list[str]) -> str:
    """What the C of ``k`` depends on: the kernel (every field) and the dim names."""
    text = (f"{K.fingerprint([k])}|{k.name}|{k.schedule!r}|{k.scheduled}|{k.reads!r}|"
            f"{k.when!r}|{','.join(dim_names)}")  # fmt: skip
    return hashlib.sha1(text.encode()).hexdigest()[:32]


def render_all(low: Lowered) -> list[Launchable]:
    """Every generated kernel of ``low`` as C. Kernels that differ only in the buffers they
    touch (the layers of a model) are rendered once: each is cut out with its buffers
    renumbered in order of use, and the cut-outs' code is shared."""
    names = sorted(low.dims)
    done: dict[str, CKernel] = {}
    out = []
    for k in low.kernels:
        if not isinstance(k, K.Kernel):
            continue
        sub = subprogram(low, [k])
        key = f"{sub_fingerprint(sub)}|{k.schedule!r}"
        c = done.get(key)
        if c is None:
            sk = sub.kernels[0]
            assert isinstance(sk, K.Kernel)
            c = done[key] = render(replace(_as_run(sk), name=k.name), names)
        original = [int(b.name[1:]) for b in sub.buffers]  # subprogram names buffers b<id>
        out.append(Launchable(c.name, KernelFormat.c_source, c.source,
                              [original[a] for a in c.args], (c.tasks, 1, 1),
                              (c.min_chunk, 1, 1)))  # fmt: skip
    return out


def _as_run(k: K.Kernel) -> K.Kernel:
    """``k`` with its schedule applied and its loop variables renamed in tree order: the same
    code whether it was scheduled before it was cut out (a plan's kernel, after the loop
    rewrites) or after (a candidate the search measures), so the plan loads the library the
    measurement compiled."""
    applied = apply(k)
    assert isinstance(applied, K.Kernel)
    return replace(applied, value=canonical_vars(applied.value, [0], tag="k"))


# timed repeats of one measurement stop at about this many seconds (five of a 10 ms kernel,
# one of a 50 ms one): set by SmolLM2's vocabulary projection, whose four schedules at 256
# rows (43-105 ms each, within 2x of each other) took about 2 s of five repeats at two sizes
REPEATS_WITHIN_S = 0.05
# measuring plans kept between prepare and measure (each holds a small program's kernels)
PREPARED_MAX = 1024
# executors of measuring plans kept: a decision measures each candidate at two sizes and
# checks the kept one, and a candidate's executor serves all three
EXECUTORS_MAX = 8
# input bytes above which a measured run starts with cold caches: more than an L1 holds, which
# in a model the kernels between two calls (a layer reads megabytes of weights) evict; set by
# SmolLM2's 576 x 576 Q4_1 projection (about 200 KB), timed warm at 0.29 ms as a copy + GEMM
EVICT_ABOVE = 64 << 10
# the copies of a measurement's inputs that runs take in turn hold at most this; larger sets
# of inputs are evicted from the caches before each run instead
RING_MAX_BYTES = 96 << 20
_EVICT: list[np.ndarray] = []
# library calls that keep state made from an input across runs: qdot packs its weight on its
# first run from a buffer (csrc/cpu/qdot.cpp), as pgemm does with `pack` 1 (csrc/cpu/pgemm.cpp);
# a ring is run through once before timing them
STATEFUL_CALLS = frozenset({"qdot"})


def _stateful(step: K.Kernel | K.LibCall) -> bool:
    if not isinstance(step, K.LibCall):
        return False
    return step.func in STATEFUL_CALLS or (step.func == "pgemm" and step.fields.get("pack") == 1)


# luminal's own GEMM (csrc/cpu/pgemm.cpp) is offered for f32 gemm calls on AVX-512 at these
# micro-tile heights (rows of C per register tile). Heights 4, 6, 8, 12 and 14, timed against
# each other and OpenBLAS at M 1..2048 by the K, N of SmolLM2, MiniLM and a 512-1024 MLP (one
# sitting, interleaved), came within 10% of each other at almost every size, 12 the best or
# near it at most; each height offered is one more measurement per product (and the search
# measures only its best-ranked LUMINAL_SEARCH_CANDIDATES, so a second height would mostly go
# untimed).
PGEMM_MR = (12,)


def _last_level_cache() -> int:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()
        return int(text[:-1]) * 1024 if text.endswith("K") else int(text)
    except (OSError, ValueError):
        return 32 << 20


def _other_bytes(size: int) -> int:
    """Bytes of other data that pass through the caches between two runs of a step whose
    inputs take ``size`` bytes: the rest of the program (``PROGRAM_BYTES``), at most twice
    the last-level cache (which leaves none of the step's inputs cached)."""
    cap = 2 * _last_level_cache()
    program = PROGRAM_BYTES.get()
    return cap if program is None else max(0, min(cap, program - size))


class _Ring:
    """Copies of one set of inputs that timed runs take in turn, so each run reads data that
    ``other`` bytes of other data have passed through since its last use, as in the program:
    in a model larger than twice the last-level cache each step starts with none of its
    inputs cached (the layers evict each other and weights stream from memory every step);
    in a small one they stay cached. Timed warm, SmolLM2's dequantized copy + GEMM of a
    576 x 576 projection took 0.29 ms (as fast as the GEMV that dequantizes in place) and
    1.15 ms per layer in decode. Copies are made once per set of inputs (a decision's
    candidates share them), where evicting the caches before every run wrote 64 MB each. Sets
    too large to copy within ``RING_MAX_BYTES`` are evicted before every run."""

    def __init__(self, inputs: dict[str, np.ndarray], other: int) -> None:
        size = max(sum(a.nbytes for a in inputs.values()), 1)
        count = 1 + -(-other // size)
        self.sets = [inputs]
        if count * size <= RING_MAX_BYTES:
            self.sets += [{n: a.copy() for n, a in inputs.items()} for _ in range(count - 1)]
        self.turn = 0
        # executors already run through every copy (held, not their ids: an id can be reused)
        self._primed: list[Executor] = []

    def prime(self, ex: Executor, dims: dict[str, int]) -> None:
        """Runs ``ex`` once on every copy (once per executor): a call that keeps state made
        from its inputs (``STATEFUL_CALLS``) makes it per copy then, not in a timed run."""
        if len(self.sets) == 1 or any(e is ex for e in self._primed):
            return
        self._primed.append(ex)
        for inputs in self.sets[1:]:
            ex.run(inputs, dims)

    def next(self) -> dict[str, np.ndarray]:
        if len(self.sets) == 1:  # too large to copy: a buffer twice the cache is rewritten
            if not _EVICT:
                _EVICT.append(np.zeros(2 * _last_level_cache(), dtype=np.uint8))
            _EVICT[0] += 1
            return self.sets[0]
        self.turn = (self.turn + 1) % len(self.sets)
        return self.sets[self.turn]


def _ring_key(inputs: dict[str, np.ndarray], other: int) -> tuple:
    return (other, *((n, id(a), a.shape, a.dtype.str) for n, a in sorted(inputs.items())))


def _idle_core() -> bool:
    """Whether a core is idle now: fewer runnable tasks (the fourth field of /proc/loadavg,
    the caller among them) than the cores this process may use. True where it cannot tell."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        return running < len(os.sched_getaffinity(0))
    except (OSError, ValueError, IndexError, AttributeError):
        return True


class _Background:
    """Batches of measuring plans compiled (``_rt.prepare``, on all cores: the OS shares them
    with the caller's Python) on a background thread, in the order given; the batches that
    wait while it compiles are taken together next, so a stage's many small decisions make a
    few compiler runs (each run loads the precompiled prelude again, about 0.06 CPU s).

    The thread starts only while a core is idle (``_idle_core``): on a machine busy with other
    work the compiles would only take turns with the caller's Python, and cost more CPU
    (SmolLM2's cold decode compile beside a test run, load 3: 12-14 s without, 15-17 with the
    thread); batches handed over then wait for ``finish``."""

    def __init__(self) -> None:
        self._pending: list[list[Any]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, batch: list[Any]) -> None:
        with self._lock:
            self._pending.append(batch)
            if self._thread is None and _idle_core():
                self._thread = threading.Thread(target=self._run, name="luminal-prepare")
                self._thread.start()

    def _run(self) -> None:
        from .. import _rt

        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                batch = [p for b in self._pending for p in b]
                self._pending.clear()
            # a kernel that fails to compile is compiled again by its measuring executor,
            # which reports the error where the search can say which candidate it was
            with contextlib.suppress(Exception):
                _rt.prepare(batch, "cpu", 0)

    def finish(self, batch: list[Any]) -> None:
        """Compiles ``batch`` and the batches not started yet on all cores, then waits for
        the one the thread is compiling."""
        from .. import _rt

        with self._lock:
            todo = [p for b in self._pending for p in b] + batch
            self._pending.clear()
            thread = self._thread
        if todo:
            _rt.prepare(todo, "cpu", 0)
        if thread is not None:
            thread.join()


def _pgemm_variants(call: K.LibCall, operands: Sequence[BufferInfo]) -> list[tuple[str, K.LibCall]]:
    """The gemm call as luminal's own GEMM at each of ``PGEMM_MR``; a weight B (the same
    values on every run) is packed once (``pack`` 1), another B on every run; A is read in
    place unless transposed. Operands f32, or both bf16 (AVX-512 BF16 dot products where the
    CPU has them) or both f16 (widened while packed); the product f32."""
    a, b, c = (x.dtype for x in operands)
    if vector_registers() < 32 or c != dt.f32 or a != b or a not in (dt.f32, dt.bf16, dt.f16):
        return []  # the kernel is AVX-512 (elsewhere it runs, as plain loops)
    pack = int(operands[1].role == "weight")
    name = call.name.replace("_gemm", "_pgemm")
    if "conv_c" in call.fields:
        # an implicit convolution (B read from the image, csrc/cpu/pgemm_conv.inc) in the plain
        # form: packing its panels of 32 pixels took 0.63 ms for 64 channels of 56 x 56 by a
        # 3 x 3 kernel, the swapped form's tiles of 12 pixels 1.96 ms (1 thread, one output
        # channel, so that packing is most of the time)
        mr = PGEMM_MR[-1]
        fields = {"mr": mr, "pack": 0, "pack_a": int(call.fields.get("trans_a", 0) != 0)}
        return [
            (
                f"pgemm,mr={mr}",
                replace(call, name=name, func="pgemm", fields={**call.fields, **fields}),
            )
        ]
    # A read in place where it can be (rows of A, trans_a 0): 1.04-1.15x faster than packed at
    # every size timed (M 17..2048 by the PGEMM_MR sizes, one sitting, interleaved)
    forms = [("", {"pack": pack, "pack_a": int(call.fields.get("trans_a", 0) != 0)})]
    if operands[0].role == "weight" and operands[1].role != "weight":
        # a weight on the left (a convolution's W @ patches): the transposed product packs it
        # once and its tiles run along the pixels (256 x 2304 by 16 pixels: 1.36 ms plain,
        # OpenBLAS 0.59, swapped 0.17; 1 thread). Offered first: the cost model ranks library
        # calls alike, and the search measures its first few
        forms.insert(0, (",swap", {"swap": 1, "pack": 1,
                                   "pack_a": int(call.fields.get("trans_b", 0) == 0)}))  # fmt: skip
    return [
        (f"pgemm,mr={mr}{tag}", replace(call, name=name, func="pgemm",
                                        fields={**call.fields, "mr": mr, **fields}))
        for tag, fields in forms
        for mr in PGEMM_MR
    ]  # fmt: skip


def cpu_id() -> str:
    """Names the CPU measured decisions belong to: its model, feature flags and core count
    (a decision measured with AVX-512 does not hold on an AVX2 machine)."""
    from ..plan_cache import cpu_id as machine

    return f"cpu-{platform.machine()}-{machine()}"


@dataclass
class CpuTarget:
    name: str = "cpu"
    cost: CostModel = COST
    space: ScheduleSpace = SPACE
    searches_schedules: bool = True
    repeats: int = 5
    races: bool = True  # measure takes a cutoff (Tuner.races)

    def cache_id(self) -> str:
        from ..plan_cache import render_id

        return f"{cpu_id()}-{render_id()}"

    def build_plan(self, low: Lowered, name: str) -> Plan:
        plan = self._assemble(low, name)
        # kernels the search handed over (Tuner.warm) may be compiling: the plan's executor
        # would compile them again
        self._background.finish([])
        return plan

    def _assemble(self, low: Lowered, name: str) -> Plan:
        libcalls = {i: k for i, k in enumerate(low.kernels) if isinstance(k, K.LibCall)}
        return assemble_plan(low, name, "cpu", "", render_all(low), libcalls)

    def library_variants(
        self, call: K.LibCall, operands: Sequence[BufferInfo]
    ) -> list[tuple[str, K.LibCall]]:
        if call.func == "gemm":
            return _pgemm_variants(call, operands)
        # qdot's `tile` field (csrc/cpu/qdot_packed.inc) is not offered: it changes only runs
        # of 1-2 rows, where its default (1) reads the weight from memory 1.3-2x faster and 2
        # wins only on a cached weight, which measurements from a ring never see; timed at one
        # row the two came within the search's noise (SmolLM2 q8: 2 chosen for 2 of 5 layer
        # products, each 1.35x slower in decode than with 1)
        return []

    def library_epilogues(
        self, call: K.LibCall, epilogue: K.Kernel, operands: Sequence[BufferInfo]
    ) -> list[tuple[str, K.LibCall]]:
        """pgemm storing the epilogue's value of each tile (targets/pgemm_epilogue.py)."""
        if call.func != "gemm" or flags.SEARCH_EPILOGUES.get() == "0":
            return []
        out = []
        for label, variant in _pgemm_variants(call, operands):
            fused = pgemm_epilogue.fused_call(variant, epilogue)
            if fused is not None:
                out.append((f"{label},fused", fused))
        return out

    def _measuring_plan(self, low: Lowered) -> Plan:
        return self._assemble(low, "measure")

    def prepare(self, lows: list[Lowered], wait: bool = True) -> None:
        """Compiles the kernels of every program in ``lows`` at once, on all cores, into the
        disk cache: the measuring runs after it compile nothing. ``wait=False`` queues them
        for a background thread (``_Background``) while the caller's Python goes on; the next
        waiting ``prepare``, or measurement, compiles what it has not started together with
        its own and waits for the rest."""
        from .. import _rt

        plans = [self._measuring_plan(low) for low in lows]
        batch = [_rt.Plan.from_parts(p.parts(), ".") for p in plans]
        if wait:
            self._background.finish(batch)
        else:
            self._background.submit(batch)
        # the measuring runs take these plans instead of rendering them again (a search's
        # later, smaller batches add to a stage's; bounded across compiles)
        if len(self._prepared) > PREPARED_MAX:
            self._prepared.clear()
        self._prepared.update({id(low): (low, plan) for low, plan in zip(lows, plans, strict=True)})

    def signature(self, k: K.Kernel, dim_names: list[str]) -> Hashable:
        # a digest of the C as its measuring plan renders it (cut out, buffers and variables
        # renamed in order), so preparing that plan finds the render kept; known signatures
        # come from the disk (_signatures)
        memo = _signatures()
        key = _signature_key(k, dim_names)
        hit = memo.get(key)
        if hit is not None:
            return hit
        w, r = K.step_buffers(k)
        ids = {b: i for i, b in enumerate(dict.fromkeys(r + w))}
        row = K.remap_buffers(k.scatter_row, ids) if k.scatter_row is not None else None
        cut = replace(k, value=cut_value(k.value, ids), out=ids[k.out], scatter_row=row)
        c = render(replace(_as_run(cut), name=k.name), dim_names)
        sig = hashlib.sha1(f"{c.source}\x00{c.tasks!r}\x00{c.min_chunk}".encode()).hexdigest()
        memo.add(key, sig)
        return sig

    def __post_init__(self) -> None:
        self._prepared: dict[int, tuple[Lowered, Plan]] = {}
        # id(low) -> (low, its executor), most recently used last
        self._executors: OrderedDict[int, tuple[Lowered, Any]] = OrderedDict()
        self._rings: OrderedDict[tuple, _Ring] = OrderedDict()
        self._background = _Background()

    def _executor(self, low: Lowered) -> Any:
        from .. import runtime

        self._background.finish([])  # nothing compiles while a measurement runs
        hit = self._executors.get(id(low))
        if hit is not None and hit[0] is low:
            self._executors.move_to_end(id(low))
            return hit[1]
        ready = self._prepared.pop(id(low), None)
        plan = ready[1] if ready is not None and ready[0] is low else self._measuring_plan(low)
        ex = runtime.Executor(plan)
        if flags.debug() >= 2:  # measuring runs are not the user's: keep them off the table
            ex.set_profiling(False)
            if ex in runtime._PROFILED:
                runtime._PROFILED.remove(ex)
        self._executors[id(low)] = (low, ex)
        while len(self._executors) > EXECUTORS_MAX:
            self._executors.popitem(last=False)
        return ex

    def _ring(self, inputs: dict[str, np.ndarray]) -> _Ring | None:
        """The ring a measurement on ``inputs`` takes its runs' inputs from; None: runs on
        the inputs as they are, warm (they fit an L1, or nothing else in the program would
        pass through the caches between two runs)."""
        size = sum(a.nbytes for a in inputs.values())
        other = _other_bytes(size)
        if size <= EVICT_ABOVE or other == 0:
            return None
        key = _ring_key(inputs, other)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = _Ring(inputs, other)
            while len(self._rings) > 2:  # a decision's two sizes
                self._rings.popitem(last=False)
        return ring

    def measure(self, low: Lowered, dims: dict[str, int], cutoff: float | None = None) -> Timing:
        """Seconds of one run of a small plan (the fastest of ``repeats``: other processes only
        add time, and on a shared machine a median still carries their stalls into the cached
        decision), through the runtime that runs plans, with the outputs of its first run on
        the search's seeded inputs. A first run longer than LUMINAL_SEARCH_MEASURE_MS is the
        only one; runs repeat up to ``repeats`` times within about ``REPEATS_WITHIN_S``; a
        first timed run (after the warm-up) longer than ``cutoff`` seconds is the
        only timed one."""
        ex = self._executor(low)
        inputs = random_inputs(low, dims, ex.inputs, flags.SEARCH_SEED.as_int())
        t = time.perf_counter()
        outputs = ex.run(inputs, dims)  # warm-up, and the outputs the search checks
        first = time.perf_counter() - t
        if first * 1e3 > flags.SEARCH_MEASURE_MS.as_float():
            return Timing(first, 1, outputs)
        # inputs larger than an L1 come from memory in a large model too; smaller ones (a
        # decode step's activations, just written) are timed warm
        ring = self._ring(inputs)
        if ring is not None and any(_stateful(s) for s in low.kernels):
            ring.prime(ex, dims)
        times = []
        # a long run varies less between runs, and its repeats are most of a search's time
        repeats = max(1, min(self.repeats, int(REPEATS_WITHIN_S / max(first, 1e-9))))
        for _ in range(repeats):
            run_inputs = ring.next() if ring is not None else inputs
            t = time.perf_counter()
            ex.run(run_inputs, dims)
            times.append(time.perf_counter() - t)
            if cutoff is not None and times[0] > cutoff:
                break  # past the warm-up's one-time costs and still a clear loser
        return Timing(min(times), len(times), outputs)

    def measure_context(self) -> str:
        """The size class of the program being compiled where some of it stays cached
        between two runs of a step (``_other_bytes``): measurements differ by it."""
        program = PROGRAM_BYTES.get()
        if program is None or program >= 2 * _last_level_cache():
            return ""
        return f"program<={1 << max(program - 1, 1).bit_length()}"

    def evaluate(self, low: Lowered, dims: dict[str, int]) -> dict[str, np.ndarray]:
        """Outputs of a small plan on the search's seeded inputs (to check a candidate)."""
        ex = self._executor(low)
        return ex.run(random_inputs(low, dims, ex.inputs, flags.SEARCH_SEED.as_int()), dims)
