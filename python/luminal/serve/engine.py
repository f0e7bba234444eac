"""The engines behind the server: ``LLMEngine`` (continuous batching of text generation on
one thread) and ``EmbedEngine`` (sentence embeddings), each able to drop its model after an
idle period and load it again from the plan cache on the next request.

Continuous batching: one engine thread owns the KV caches (``max_seqs`` slots) and loops:
cancelled sequences free their slots; waiting requests take free slots; then one run of the
batched plan takes every decoding sequence's next token and, in the rows left of
``step_tokens``, the next prompt tokens of the sequences still being prefilled, oldest first
(chunked prefill: prompts that arrive together are prefilled together, and a long prompt
does not stall the streams already decoding). A sequence whose prompt is complete samples
its first token from that step's logits. ``prefill="serial"`` instead prefills each new
request alone, whole, with ``LlamaSession``'s prefill plan before the step. A finished
request (EOS, stop
string, max_tokens, context full) or a cancelled one (client gone, shutdown) frees its slot
at once, and the next step runs without it. Events go back to each request's asyncio queue
through its event loop, all of an iteration's at once. Plan runs release the GIL, so the
HTTP side stays responsive, and a step's text work (detokenizing, stop strings, logprobs,
events) runs on a second thread while the next step's plan runs: between two steps the
engine thread only samples and decides which sequences go on.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..sampling import Sampler
from .batched import BatchedDecoder
from .limits import Limits
from .metrics import Metrics


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc keeps them otherwise:
    after an unload RSS would stay hundreds of MB above the baseline)."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in writable, contents unchanged


def populate(arrays: list[np.ndarray]) -> None:
    """Fault the pages of ``arrays`` in now (where the OS can do so without touching their
    contents), so that a KV-cache slot's first use does not pay for them inside a step: at
    16 slots of 512 tokens, a first-use copy of a 30-token prefix into a fresh slot took
    2-45 ms against 0.3 ms into a used one. Safe while the arrays are in use; a no-op where
    madvise has no such advice."""
    try:
        import ctypes
        import mmap

        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    for a in arrays:
        lo = -(-a.ctypes.data // page) * page
        hi = (a.ctypes.data + a.nbytes) // page * page
        if hi > lo and madvise(lo, hi - lo, _MADV_POPULATE_WRITE) != 0:
            return  # an older kernel: pages fault in on first use instead


def log(msg: str) -> None:
    print(f"luminal serve: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- models
def load_llm(path: str, max_context: int) -> Any:
    """The Llama-family model at ``path`` (a GGUF file or a transformers folder), without its
    tokenizer (``load_tokenizer``)."""
    from ..models.llama import Llama, config_from_gguf, load_hf_dir

    if os.path.isdir(path):
        model, _ = load_hf_dir(path, max_context)
        return model
    from ..loaders.gguf import GGUFFile, GGUFWeights

    f = GGUFFile(path)
    return Llama(config_from_gguf(f), GGUFWeights(f, "graph"), max_context)


def load_tokenizer(path: str) -> Any:
    from ..tokenizer import Tokenizer

    if os.path.isdir(path):
        return Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    from ..loaders.gguf import GGUFFile

    return Tokenizer.from_gguf(GGUFFile(path))


@dataclass
class Loaded:
    """What an unload drops: the model (mapped weights), the plans and the KV caches."""

    model: Any
    decoder: BatchedDecoder
    runner: Any  # packed weights (None when every step runs on runner_f32)
    runner_f32: Any  # weights folded to f32 (None: off)
    prefill: Any  # a LlamaSession for prefill="serial" (None: chunked prefill)
    cache: dict[str, np.ndarray]
    f32_from: int  # steps of this many rows or more run on runner_f32 (0: never)


# ----------------------------------------------------------------------------- requests
@dataclass
class GenRequest:
    """One generation request. The engine thread fills ``events`` (an asyncio queue of the
    handler's loop) with ``("text", piece)``, then one ``("done", finish_reason)`` or
    ``("error", message)``. With ``top_logprobs`` (an int >= 0) each generated token first
    sends ``("logprob", (token, logprob, [(token, logprob), ...]))``: its log-probability
    under the model and the ``top_logprobs`` likeliest tokens. ``prompt_logprobs``: first,
    for each prompt token after the first, ``("prompt_logprob", (token, logprob, top))``
    (such a request is prefilled as rows of the batched steps, whose logits give them)."""

    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    top_logprobs: int | None = None
    prompt_logprobs: bool = False
    events: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    # engine-side state
    slot: int = -1
    pos: int = 0  # tokens in its KV-cache slot (prompt tokens fed, then generated ones)
    last: int = 0
    generated: int = 0
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0
    last_time: float = 0.0
    streamer: Any = None
    finished: bool = False  # done (its last events may still be on their way)

    def cancel(self) -> None:
        self.cancelled.set()

    def _emit(self, kind: str, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the handler's loop is closed: nobody is listening
            self.cancelled.set()


def _deliver(events: list[tuple[GenRequest, str, Any]]) -> None:
    for r, kind, value in events:
        r.events.put_nowait((kind, value))


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


class LLMEngine:
    def __init__(
        self,
        path: str,
        name: str,
        limits: Limits,
        metrics: Metrics,
        backend: str = "auto",
        quiet: bool = False,
        f32_batch: int | str = 0,
        step_tokens: int = 64,
        prefill: str = "chunked",
        prefix_reuse: bool = True,
    ) -> None:
        """``f32_batch``: steps of at least this many tokens run on a second batched plan
        whose weights are folded to f32 (GEMMs over the rows; 4 bytes per weight) instead of
        dequantizing each weight again per row; 1: every step, 0: never; ``"auto"``: both
        plans are measured at the step sizes the engine runs, once (``serve.choose``), and
        each step runs on the faster; a plan that is never the faster is not kept.
        ``step_tokens``: tokens one step takes at most (at least ``limits.max_seqs``): one
        per decoding sequence, the rest prompt tokens. ``prefill``: ``"chunked"`` (prompt
        tokens are rows of the batched steps) or ``"serial"`` (each prompt alone through the
        prefill plan, between steps). ``prefix_reuse``: a prompt that begins as a sequence
        a slot holds (running or finished) takes those keys and values instead of running
        them again."""
        if f32_batch != "auto" and (
            isinstance(f32_batch, bool) or not isinstance(f32_batch, int) or f32_batch < 0
        ):
            raise ValueError(f"f32_batch must be an int >= 0 or 'auto', got {f32_batch!r}")
        if isinstance(step_tokens, bool) or not isinstance(step_tokens, int) or step_tokens < 1:
            raise ValueError(f"step_tokens must be a positive int, got {step_tokens!r}")
        if prefill not in ("chunked", "serial"):
            raise ValueError(f"prefill must be 'chunked' or 'serial', got {prefill!r}")
        self.f32_batch = f32_batch
        self.serial = prefill == "serial"
        self.prefix_reuse = bool(prefix_reuse)
        self.rows = max(step_tokens, limits.max_seqs)  # serial: the same plans, rows unused
        self.path = path
        self.name = name
        self.limits = limits
        self.metrics = metrics
        self.backend = backend
        self.quiet = quiet
        self.tokenizer = load_tokenizer(path)
        self.loaded: Loaded | None = None
        self.ctx = 0
        self.vocab = 0
        self.pending: deque[GenRequest] = deque()
        self.active: dict[int, GenRequest] = {}  # slot -> request
        # slot -> the request whose keys and values it holds (running or finished): a new
        # prompt that begins as one of theirs reuses those rows (prefix reuse)
        self.resident: dict[int, GenRequest] = {}
        self.cv = threading.Condition()
        self.last_request = time.monotonic()
        self.stopping = False
        self.closed = False
        self.cold_starts: list[float] = []
        # the events of one iteration, by event loop, delivered together when it ends: one
        # wake-up of each loop per step, where one per token cost the engine thread a GIL
        # hand-off to the busy loop thread each (a socket write that waited for the GIL)
        self.outbox: dict[asyncio.AbstractEventLoop, list[tuple[GenRequest, str, Any]]] = {}
        # a step's work that the next step does not depend on (text, stop strings, logprobs,
        # events: ``_show``) runs on this thread while the next step's plan runs (the run
        # releases the GIL), instead of between the steps
        self.deferred: list[Callable[[], None]] = []
        self.post = ThreadPoolExecutor(1, thread_name_prefix="luminal-post")
        self.thread = threading.Thread(target=self._loop, name="luminal-engine", daemon=True)

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Loads the model (compiling its plans the first time) and starts the engine."""
        self._load()
        self.thread.start()

    def _load(self) -> None:
        from ..models.llama import LlamaSession

        t0 = time.perf_counter()
        model = load_llm(self.path, self.limits.max_context)
        if model.ctx < self.limits.max_context:
            log(f"{self.name}: the model's context is {model.ctx} tokens (below --ctx)")
        decoder = BatchedDecoder(model, self.limits.max_seqs, rows=self.rows)
        runner = decoder.runner(self.backend, self.quiet) if self.f32_batch != 1 else None
        runner_f32 = None
        if self.f32_batch == "auto" or 0 < int(self.f32_batch) <= self.rows:
            folded = BatchedDecoder(model, self.limits.max_seqs, fold=True, rows=self.rows)
            runner_f32 = folded.runner(self.backend, self.quiet)
        cache = decoder.new_cache()
        if self.f32_batch == "auto":
            from .choose import choose_f32_from

            f32_from = choose_f32_from(
                decoder, runner, runner_f32, cache, self.rows, lambda m: log(f"{self.name}: {m}")
            )
            if f32_from == 1:
                runner = None  # the f32 plan runs every step
            elif f32_from == 0:
                runner_f32 = None
        else:
            f32_from = int(self.f32_batch) if runner_f32 is not None else 0
        session = None
        if self.serial:
            session = LlamaSession(model, self.backend, self.quiet)
            session.compile_prefill()
            session.cache = {}
        self.loaded = Loaded(model, decoder, runner, runner_f32, session, cache, f32_from)
        self.resident = {}
        self.ctx, self.vocab = model.ctx, model.config.vocab_size
        took = time.perf_counter() - t0
        self.last_request = time.monotonic()  # idle time counts from here
        self.cold_starts.append(took)
        self.metrics.loads.labels(self.name).inc()
        self.metrics.cold_start.labels(self.name).set(took)
        self.metrics.loaded.labels(self.name).set(1)
        plans = [r for r in (runner, runner_f32) if r is not None]
        cached = all(r.cached for r in plans)
        how = "plans from the plan cache" if cached else f"backend {plans[0].backend}"
        log(f"{self.name}: loaded in {took:.2f} s ({how})")
        # after the load (and any measuring of the plans), beside the first requests: the
        # load does not wait for it (the thread holds the arrays)
        threading.Thread(target=populate, args=(list(cache.values()),), daemon=True).start()

    def _unload(self) -> None:
        self.loaded = None
        release_memory()
        self.metrics.loaded.labels(self.name).set(0)
        self.metrics.unloads.labels(self.name).inc()
        log(f"{self.name}: unloaded after {self.limits.idle_unload:g} s idle")

    def shutdown(self, grace: float | None = None) -> None:
        """Stop taking requests; let running ones finish for ``grace`` seconds, then cancel
        what is left and stop the engine thread."""
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        deadline = time.monotonic() + (self.limits.shutdown_grace if grace is None else grace)
        while time.monotonic() < deadline:
            with self.cv:
                if not self.active and not self.pending:
                    break
            time.sleep(0.02)
        with self.cv:
            for r in list(self.pending) + list(self.active.values()):
                r._emit("done", "cancelled")  # a second "done" later is ignored
                r.cancel()
            self.closed = True
            self.cv.notify_all()
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loaded = None  # the plans and caches go with the engine
            self.post.shutdown(wait=False)

    # ---------------------------------------------------------------- requests
    def submit(self, req: GenRequest) -> None:
        with self.cv:
            if self.stopping:
                raise ShuttingDown()
            if len(self.pending) >= self.limits.max_queue + max(
                0, self.limits.max_seqs - len(self.active)
            ):
                raise QueueFull()
            self.pending.append(req)
            self.last_request = time.monotonic()
            self.metrics.queue_depth.set(len(self.pending))
            self.cv.notify_all()

    @property
    def is_loaded(self) -> bool:
        return self.loaded is not None

    def counts(self) -> tuple[int, int]:
        with self.cv:
            return len(self.active), len(self.pending)

    # ---------------------------------------------------------------- the loop
    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.closed and not self.pending and not self.active:
                    if self._idle_due():
                        self._unload()
                    self.cv.wait(timeout=self._idle_wait())
                if self.closed:
                    self._finish_all("cancelled")
                    return
            try:
                self._iteration()
            except Exception as e:  # an engine fault fails the requests, not the server
                log(f"engine error: {type(e).__name__}: {e}")
                with self.cv:
                    for r in list(self.pending) + list(self.active.values()):
                        r._emit("error", f"{type(e).__name__}: {e}")
                    self.pending.clear()
                    self.active.clear()
                    self.resident = {}  # a failed step may have left any rows half written
                    self._gauges()

    def _idle_due(self) -> bool:
        s = self.limits.idle_unload
        return bool(s) and self.loaded is not None and time.monotonic() - self.last_request >= s

    def _idle_wait(self) -> float | None:
        if not self.limits.idle_unload or self.loaded is None:
            return None
        return max(0.01, self.limits.idle_unload - (time.monotonic() - self.last_request))

    def _gauges(self) -> None:
        self.metrics.queue_depth.set(len(self.pending))
        self.metrics.active.set(len(self.active))

    def _finish_all(self, reason: str) -> None:
        for r in list(self.pending) + list(self.active.values()):
            r._emit("done", reason)
        self.pending.clear()
        self.active.clear()
        self._gauges()

    def _iteration(self) -> None:
        t_start = time.perf_counter()
        try:
            plan_s = self._iterate()
            if not self.active:  # no step follows at once to overlap it with
                self._show_deferred()
        except BaseException:
            self.deferred.clear()
            raise
        finally:
            self._flush()
        if plan_s is not None:  # the engine thread's own time: everything but plan runs
            self.metrics.host.observe(time.perf_counter() - t_start - plan_s)

    def _send(self, r: GenRequest, kind: str, value: Any) -> None:
        """An event for ``r``, delivered at the end of this iteration (engine thread)."""
        self.outbox.setdefault(r.loop, []).append((r, kind, value))

    def _show_deferred(self) -> None:
        todo, self.deferred = self.deferred, []
        for f in todo:
            f()
        self._flush()

    def _flush(self) -> None:
        out, self.outbox = self.outbox, {}
        for loop, events in out.items():
            try:
                loop.call_soon_threadsafe(_deliver, events)
            except RuntimeError:  # the loop is closed: nobody is listening
                for r, _, _ in events:
                    r.cancelled.set()

    def _iterate(self) -> float | None:
        """One engine iteration; the seconds its plan runs took (None: no step ran)."""
        plan_s = 0.0
        with self.cv:
            for slot, r in list(self.active.items()):
                if r.cancelled.is_set():
                    del self.active[slot]
            admit: list[GenRequest] = []
            free = [s for s in range(self.limits.max_seqs) if s not in self.active]
            while self.pending and len(admit) < len(free):
                r = self.pending.popleft()
                if not r.cancelled.is_set():
                    admit.append(r)
            for r, s in zip(admit, free, strict=False):
                r.slot = s
                self.active[s] = r
            self._gauges()
        if (admit or self.active) and self.loaded is None:
            t0 = time.perf_counter()
            self._load()
            log(f"{self.name}: cold start {time.perf_counter() - t0:.2f} s")
        lo = self.loaded
        if lo is None:
            return None
        for r in admit:
            r.streamer = self.tokenizer.streamer()
            if self.prefix_reuse and not r.prompt_logprobs:  # that needs all prompt logits
                self._reuse_prefix(lo, r)
            self.resident[r.slot] = r
            # as rows of the steps: prompt logprobs (every row's logits), and a rest after a
            # reused prefix too short for the prefill plan (the session's decode plan runs
            # such steps, slowly: it dequantizes its weights per row)
            short = len(r.prompt) - r.pos < (getattr(lo.prefill, "prefill_min", None) or 1)
            if lo.prefill is None or r.prompt_logprobs or (r.pos and short):
                continue
            if r.cancelled.is_set():
                self._release(r)
                continue
            self._show_deferred()  # the prefill is long: the last step's text goes first
            t0 = time.perf_counter()
            logits = lo.decoder.prefill(lo.prefill, lo.cache, r.slot, r.prompt, r.pos)
            took = time.perf_counter() - t0
            plan_s += took
            self.metrics.prefill.observe(took)
            self.metrics.prompt_tokens.inc(len(r.prompt) - r.pos)
            r.pos = len(r.prompt)
            row = logits.reshape(-1)
            greedy = r.sampler.temperature <= 0 or r.cancelled.is_set()
            self._advance(r, row, int(np.argmax(row)) if greedy else r.sampler(row))
            self._show_deferred()  # its first token goes now, not after the step
        with self.cv:
            running = [r for r in self.active.values() if not r.cancelled.is_set()]
        if not running:
            return plan_s
        # rows: each decoding sequence's next token, then prompt tokens, oldest request first
        toks: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        picks: list[int] = []
        # (request, what the row's logits are for: the next token "decode", the "first"
        # generated one, or "prompt": the log-probability of the prompt's next token)
        picked: list[tuple[GenRequest, str]] = []
        for r in running:
            if r.pos >= len(r.prompt):
                picks.append(len(toks))
                picked.append((r, "decode"))
                toks.append(r.last)
                pos.append(r.pos)
                slots.append(r.slot)
        feeding: list[tuple[GenRequest, int]] = []
        for r in running:
            room = self.rows - len(toks)
            if r.pos >= len(r.prompt) or room <= 0:
                continue
            take = min(room, len(r.prompt) - r.pos)
            toks += r.prompt[r.pos : r.pos + take]
            pos += range(r.pos, r.pos + take)
            slots += [r.slot] * take
            feeding.append((r, take))
            if r.prompt_logprobs:
                inner = take if r.pos + take < len(r.prompt) else take - 1
                picks += range(len(toks) - take, len(toks) - take + inner)
                picked += [(r, "prompt")] * inner
            if r.pos + take == len(r.prompt):
                picks.append(len(toks) - 1)
                picked.append((r, "first"))
        if not toks:
            return plan_s
        t0 = time.perf_counter()
        f32 = lo.runner is None or (lo.f32_from > 0 and len(toks) >= lo.f32_from)
        # the last step's deferred work runs beside this one; it touches no KV cache
        shown = self.post.submit(self._show_deferred) if self.deferred else None
        try:  # a step of inner prompt tokens only still takes one pick: its logits go unused
            logits = lo.decoder.step(
                lo.runner_f32 if f32 else lo.runner, lo.cache, toks, pos, slots, picks or [0]
            )
        finally:
            if shown is not None:
                shown.result()
        took = time.perf_counter() - t0
        plan_s += took
        self.metrics.step.observe(took)
        self.metrics.batch.observe(len(set(slots)))
        self.metrics.step_tokens.observe(len(toks))
        at = {id(r): r.pos for r, _ in feeding}  # each prompt row's position, in order
        for r, take in feeding:
            r.pos += take
            self.metrics.prompt_tokens.inc(take)
        # one pass over the logits: each row's argmax (the greedy token) and, at it, the row's
        # largest value, which is NaN or +inf if any value is (numpy's argmax stops at the
        # first NaN): such a row (an overflow in the model) fails its request, not silently
        rows = logits[: len(picked)]
        best = rows.argmax(axis=1)
        bad = np.flatnonzero(~np.isfinite(rows[np.arange(len(picked)), best]))
        failed = {id(picked[i][0]): picked[i][0] for i in bad.tolist()}
        for r in failed.values():
            self._send(r, "error", "the model gave non-finite logits")
            self._release(r)
            if self.resident.get(r.slot) is r:  # its rows are no prefix to reuse
                del self.resident[r.slot]
        for (r, what), row, tok in zip(picked, rows, best.tolist(), strict=True):
            if (failed and id(r) in failed) or r.finished:  # finished: by a stop string
                continue
            if what == "prompt":
                p = at[id(r)] = at[id(r)] + 1
                if not r.cancelled.is_set():
                    self.deferred.append(partial(self._prompt_logprob, r, row, r.prompt[p]))
                continue
            if what == "decode":
                r.pos += 1
            if r.sampler.temperature > 0 and not r.cancelled.is_set():
                tok = r.sampler(row)
            if self._take(r, tok):
                self.deferred.append(partial(self._show, r, row, tok))
        return plan_s

    def _prompt_logprob(self, r: GenRequest, row: np.ndarray, tok: int) -> None:
        self._send(r, "prompt_logprob", _logprobs(row, tok, r.top_logprobs or 0))

    def _reuse_prefix(self, lo: Loaded, r: GenRequest) -> None:
        """Start ``r`` after the longest beginning of its prompt that some slot holds the
        keys and values of (a shared system prompt, the turns before in a chat), copying
        those rows into its slot unless they are there already; at least its last prompt
        token is still run (its logits give the first generated token)."""
        best, src = 0, r.slot
        for s, q in self.resident.items():
            held = (q.prompt + q.tokens)[: q.pos]
            n, top = 0, min(len(held), len(r.prompt) - 1)
            while n < top and held[n] == r.prompt[n]:
                n += 1
            if n > best or (n == best and s == r.slot):
                best, src = n, s
        if best == 0:
            return
        if src != r.slot:
            ctx = lo.decoder.ctx
            a, b = src * ctx, r.slot * ctx
            for c in lo.cache.values():
                c[b : b + best] = c[a : a + best]
        r.pos = best
        self.metrics.prompt_reused.inc(best)

    def _release(self, r: GenRequest) -> None:
        with self.cv:
            if self.active.get(r.slot) is r:
                del self.active[r.slot]
            self.last_request = time.monotonic()
            self._gauges()

    def _advance(self, r: GenRequest, logits: np.ndarray, tok: int) -> None:
        """Take ``tok`` (sampled from ``logits``) as the next token of ``r``; emit text;
        finish when due."""
        if self._take(r, tok):
            self._show(r, logits, tok)

    def _take(self, r: GenRequest, tok: int) -> bool:
        """What the next step needs of ``tok`` becoming ``r``'s next token: the sequence's
        state, and whether it ends (EOS, ``max_tokens``, the context: it leaves its slot
        before the next step). False: nothing is left to show (cancelled, or EOS)."""
        if r.cancelled.is_set():
            self._release(r)
            return False
        now = time.perf_counter()
        if r.generated == 0:
            self.metrics.ttft.observe(now - r.arrived)
        else:
            self.metrics.itl.observe(now - r.last_time)
        r.last_time = now
        r.generated += 1
        self.metrics.completion_tokens.inc()
        if tok in self.tokenizer.eos_ids:
            self._done(r, "stop")
            return False
        r.tokens.append(tok)
        r.last = tok
        if r.generated >= r.max_tokens or r.pos >= self.ctx:
            r.finished = True  # its text and "done" follow in _show
            self._release(r)
        return True

    def _show(self, r: GenRequest, logits: np.ndarray, tok: int) -> None:
        """The rest of taking ``tok``: its logprobs, its text (held back while it may begin
        a stop string), and the end of the request at a stop string or when ``_take`` ended
        it. A request a stop string ends may have a row in the step running meanwhile: its
        result is dropped (its key and value are past the tokens the slot is known to hold)."""
        if r.cancelled.is_set():
            return
        if r.top_logprobs is not None:
            self._send(r, "logprob", _logprobs(logits, tok, r.top_logprobs))
        r.text += r.streamer.push(tok)
        stop_at = _first_stop(r.text, r.stop, r.sent)
        if stop_at is not None:
            if stop_at > r.sent:
                self._send(r, "text", r.text[r.sent : stop_at])
            r.sent = stop_at
            self._done(r, "stop")
            return
        hold = _stop_prefix(r.text, r.stop)  # text that may begin a stop string waits
        if len(r.text) - hold > r.sent:
            self._send(r, "text", r.text[r.sent : len(r.text) - hold])
            r.sent = len(r.text) - hold
        if r.finished:
            self._done(r, "length")

    def _done(self, r: GenRequest, reason: str) -> None:
        if reason == "length" and r.sent < len(r.text):
            self._send(r, "text", r.text[r.sent :])
            r.sent = len(r.text)
        r.finished = True
        self._send(r, "done", reason)
        self._release(r)


def _logprobs(logits: np.ndarray, tok: int, top: int) -> tuple[int, float, list[Any]]:
    """``tok``'s log-probability under ``logits`` and the ``top`` likeliest tokens'."""
    x = np.asarray(logits, np.float64).reshape(-1)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m).sum()))
    best: list[Any] = []
    if top:
        ids = np.argpartition(-x, top - 1)[:top]
        ids = ids[np.argsort(-x[ids], kind="stable")]
        best = [(int(t), float(x[t]) - lse) for t in ids]
    return tok, float(x[tok]) - lse, best


def _first_stop(text: str, stops: list[str], since: int) -> int | None:
    """Where the earliest stop string in ``text`` begins (searching from a little before
    ``since``: a stop string may straddle what was already checked)."""
    best: int | None = None
    for s in stops:
        i = text.find(s, max(0, since - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def _stop_prefix(text: str, stops: list[str]) -> int:
    """The length of the longest tail of ``text`` that begins some stop string."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if s.startswith(text[-k:]):
                hold = k
                break
    return hold


# ----------------------------------------------------------------------------- embeddings
class EmbedEngine:
    """A BERT sentence embedder, loaded at start, dropped after the idle period, reloaded
    (plans from the plan cache) on the next request. Calls are serialized."""

    def __init__(
        self,
        path: str,
        name: str,
        limits: Limits,
        metrics: Metrics,
        backend: str = "auto",
        quiet: bool = False,
    ) -> None:
        from ..tokenizer import Tokenizer

        self.path = path
        self.name = name
        self.limits = limits
        self.metrics = metrics
        self.backend = backend
        self.quiet = quiet
        self.tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        self.embedder: Any = None
        self.lock = threading.Lock()
        self.last_request = time.monotonic()

    def start(self) -> None:
        with self.lock:
            self._load()

    def _load(self) -> None:
        from ..models import Bert, Embedder
        from ..tokenizer import Tokenizer

        t0 = time.perf_counter()
        tok = Tokenizer.from_file(os.path.join(self.path, "tokenizer.json"))
        self.embedder = Embedder(Bert.from_dir(self.path), tok, self.backend, self.quiet)
        took = time.perf_counter() - t0
        self.metrics.loads.labels(self.name).inc()
        self.metrics.cold_start.labels(self.name).set(took)
        self.metrics.loaded.labels(self.name).set(1)
        log(f"{self.name}: loaded in {took:.2f} s")

    @property
    def is_loaded(self) -> bool:
        return self.embedder is not None

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(self.tokenizer.tk.encode(t).ids) for t in texts]

    def embed(self, texts: list[str]) -> np.ndarray:
        with self.lock:
            self.last_request = time.monotonic()
            if self.embedder is None:
                self._load()
            out = np.asarray(self.embedder(texts), np.float32)
            self.last_request = time.monotonic()
            return out

    def maybe_unload(self) -> None:
        s = self.limits.idle_unload
        if not s or self.embedder is None or time.monotonic() - self.last_request < s:
            return
        with self.lock:
            if self.embedder is not None and time.monotonic() - self.last_request >= s:
                self.embedder = None
                release_memory()
                self.metrics.loaded.labels(self.name).set(0)
                self.metrics.unloads.labels(self.name).inc()
                log(f"{self.name}: unloaded after {s:g} s idle")


OnEvent = Callable[[str, Any], None]
