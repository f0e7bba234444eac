"""The Llama family as one luminal graph: RMSNorm, RoPE, grouped-query attention, SwiGLU,
tied or separate output embeddings, optional q/k/v biases (Qwen2).

KV cache: each layer has persistent caches ``k_cache_<l>`` / ``v_cache_<l>`` of shape
(ctx, kv_heads * head_dim): graph inputs whose updated values are the outputs
``k_cache_<l>_new`` / ``v_cache_<l>_new``, declared with ``g.output(..., updates=<input>)``
(``Llama.state`` lists them). A compiled plan writes the new rows straight into the caller's
cache array and returns that array as the output: no copy of the cache per token. The
new keys/values of a step are written with SCATTER at rows ``pos .. pos + seq - 1`` and
attention reads rows ``0 .. pos + seq - 1`` through a slice view. ``seq`` and ``pos`` are
symbolic dims, so one graph serves prefill (seq = prompt length, pos = 0) and every decode
step (seq = 1, pos = tokens so far) up to the context limit: nothing is rebuilt per token.

Long prompts get a second graph of the same inputs and outputs (``build_prefill``): weights
folded to f32 once, so its projections are GEMMs. ``LlamaSession`` runs steps of
``prefill_min`` or more tokens on it and everything else on the decode graph; both plans
update the same cache arrays.
"""

from __future__ import annotations

import copy
import os
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..functional import (
    apply_rotary_emb,
    causal_mask,
    linear,
    rms_norm,
    rope_cos_sin,
    rope_positions,
    silu,
)
from ..functional import scaled_dot_product_attention as sdpa
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.view import idx_vars
from ..tensor import Graph, Tensor
from . import crossing
from .base import Runner, WeightSource, progress


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    context_length: int = 2048
    rope_interleaved: bool = False  # GGUF "llama" weights are permuted for adjacent-pair RoPE
    rope_scaling: dict[str, Any] | None = None
    attn_bias: bool = False
    arch: str = "llama"
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_hf(c: dict[str, Any]) -> LlamaConfig:
        """From a transformers ``config.json`` (safetensors layout: rotate-half RoPE)."""
        heads = c["num_attention_heads"]
        # transformers >= 5 nests RoPE settings in rope_parameters; older configs are flat
        rp = dict(c.get("rope_parameters") or {})
        theta = rp.pop("rope_theta", c.get("rope_theta", 10000.0))
        scaling = c.get("rope_scaling") or (
            rp if rp.get("rope_type", "default") != "default" else None
        )
        return LlamaConfig(
            vocab_size=c["vocab_size"],
            hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"],
            n_layers=c["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=c.get("num_key_value_heads", heads),
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            rope_theta=float(theta),
            rms_eps=float(c.get("rms_norm_eps", 1e-5)),
            context_length=c.get("max_position_embeddings", 2048),
            rope_scaling=scaling,
            attn_bias=bool(c.get("attention_bias", c.get("model_type") == "qwen2")),
            arch=c.get("model_type", "llama"),
        )


class Llama:
    """A Llama-family decoder over a ``WeightSource`` with GGUF tensor names."""

    def __init__(
        self, config: LlamaConfig, weights: WeightSource, max_context: int | None = None
    ) -> None:
        self.config = config
        self.weights = weights
        self.ctx = min(max_context or config.context_length, config.context_length)
        c = config
        if c.n_heads % c.n_kv_heads:
            raise ValueError(
                f"llama: {c.n_heads} query heads are not a multiple of {c.n_kv_heads} kv heads"
            )
        self.tied = not weights.has("output.weight")

    @property
    def kv_width(self) -> int:
        return self.config.n_kv_heads * self.config.head_dim

    def cache_names(self) -> list[str]:
        return [f"{kv}_cache_{i}" for i in range(self.config.n_layers) for kv in ("k", "v")]

    @property
    def state(self) -> dict[str, str]:
        """Output name -> the input it updates (the KV caches)."""
        return {n + "_new": n for n in self.cache_names()}

    def new_cache(self) -> dict[str, np.ndarray]:
        return {n: np.zeros((self.ctx, self.kv_width), np.float32) for n in self.cache_names()}

    def cache_key(self, graph: str, **options: Any) -> dict[str, Any] | None:
        """What determines the plan of ``build()`` (``graph='decode'``) or ``build_prefill``
        (``'prefill'``, with its ``min_seq``) without building it: the config, the context,
        the options and the weights' identity (None when the weight source has none)."""
        identity = getattr(self.weights, "identity", None)
        if identity is None:
            return None
        return {"model": "llama", "config": asdict(self.config), "ctx": self.ctx,
                "graph": graph, "options": options, "weights": identity()}  # fmt: skip

    def build(
        self,
        logits: str = "last",
        name: str = "llama",
        min_seq: int = 1,
    ) -> Graph:
        """The forward graph. Inputs: ``tokens`` i32 (seq,) and the caches; dims ``seq`` (from
        the tokens, ``min_seq`` .. ctx) and ``pos``. Outputs: ``logits`` (1, vocab) for the
        last position (``logits='all'``: (seq, vocab)) and the updated caches."""
        if logits not in ("last", "all"):
            raise ValueError(f"logits must be 'last' or 'all', got {logits!r}")
        if not 1 <= min_seq <= self.ctx:
            raise ValueError(f"min_seq must be in [1, {self.ctx}] (the context), got {min_seq}")
        c, w = self.config, self.weights
        g = Graph(name)
        seq = sym.dim("seq", min_seq, self.ctx)
        pos = sym.dim("pos", 0, self.ctx - 1)
        tokens = g.input("tokens", (seq,), dt.i32)
        x = w.rows(g, "token_embd.weight", tokens)  # (seq, hidden)
        positions = rope_positions(g, seq, pos)
        scaling = c.rope_scaling
        if w.has("rope_freqs.weight"):  # Llama 3.1 GGUF: per-frequency divisors stored as a tensor
            scaling = None
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, c.rope_interleaved, scaling)
        if w.has("rope_freqs.weight"):
            cos, sin = self._freq_factors(g, positions)
        for i in range(c.n_layers):
            x = self._block(g, i, x, seq, pos, cos, sin)
        x = rms_norm(x, c.hidden_size, w.get(g, "output_norm.weight"), c.rms_eps)
        if logits == "last":
            x = x.slice(0, sym.add(seq, -1), 1)
        head = w.get(g, "token_embd.weight" if self.tied else "output.weight")
        g.output("logits", linear(x, head))
        return g

    def build_prefill(
        self, min_seq: int, name: str = "llama_prefill", progress: Any = None
    ) -> Graph:
        """The graph of the prefill plan, for steps of at least ``min_seq`` tokens: every
        weight-only expression (dequantization, casts) folded into an f32 weight at build time
        (``compiler.fold``), so the projections are plain GEMMs on f32 weights instead of
        dequantizing each weight again for every row; the output head, applied to one row,
        stays packed. Same inputs, outputs and dims as ``build()``, so both plans share one KV
        cache. Costs 4 bytes per folded weight value (SmolLM2-135M: about 0.4 GB).

        With int8 activations (``LUMINAL_ACT_QUANT=q8``) the block-quantized weights stay
        packed: their products by q8 activations are the integer ``qdot`` call's (or what the
        search measures faster), which at prefill rows outruns f32 GEMMs on the folded copy."""
        from ..compiler import actquant
        from ..compiler.fold import fold_weights

        if actquant.mode() == "q8":
            return self.build(name=name, min_seq=min_seq)

        # the head multiplies one row (the last position's): reading it packed is cheaper
        head = "token_embd.weight" if self.tied else "output.weight"
        model = copy.copy(self)
        model.weights = _Folded(self.weights, keep={head})
        graph = model.build(name=name, min_seq=min_seq)
        return fold_weights(graph, progress, keep=[head])

    def _freq_factors(self, g: Graph, positions: Tensor) -> tuple[Tensor, Tensor]:
        c = self.config
        inv = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
        factors = self.weights.get(g, "rope_freqs.weight")
        ang = (
            positions.cast(dt.f32)
            .unsqueeze(-1)
            .mul(g.tensor(inv.astype(np.float32)))
            .mul(factors.reciprocal())
        )
        half = c.head_dim // 2
        if c.rope_interleaved:
            ang = ang.unsqueeze(-1).expand([*ang.shape, 2]).reshape([*ang.shape[:-1], c.head_dim])
        else:
            ang = (
                ang.unsqueeze(-2)
                .expand([*ang.shape[:-1], 2, half])
                .reshape([*ang.shape[:-1], c.head_dim])
            )
        s2 = ang.mul(0.5).sin()
        return s2.mul(s2).mul(-2.0).add(1.0), ang.sin()

    def _proj(self, g: Graph, x: Tensor, name: str) -> Tensor:
        w = self.weights
        bias = w.get(g, name + ".bias") if w.has(name + ".bias") else None
        return linear(x, w.get(g, name + ".weight"), bias)

    def _block(
        self,
        g: Graph,
        i: int,
        x: Tensor,
        seq: Any,
        pos: Any,
        cos: Tensor,
        sin: Tensor,
    ) -> Tensor:
        c, w, p = self.config, self.weights, f"blk.{i}."
        hd, nh, nkv = c.head_dim, c.n_heads, c.n_kv_heads
        h = rms_norm(x, c.hidden_size, w.get(g, p + "attn_norm.weight"), c.rms_eps)
        q = self._proj(g, h, p + "attn_q").reshape(seq, nh, hd)
        k = self._proj(g, h, p + "attn_k").reshape(seq, nkv, hd)
        v = self._proj(g, h, p + "attn_v")
        # cos/sin are (seq, hd): broadcast over the head dim
        q = apply_rotary_emb(q, cos.unsqueeze(1), sin.unsqueeze(1), c.rope_interleaved)
        k = apply_rotary_emb(k, cos.unsqueeze(1), sin.unsqueeze(1), c.rope_interleaved)
        total = sym.add(pos, seq)
        ks = self._cache(g, f"k_cache_{i}", k.reshape(seq, nkv * hd), seq, pos, total)
        vs = self._cache(g, f"v_cache_{i}", v, seq, pos, total)
        kh = ks.reshape(total, nkv, hd).permute(1, 0, 2)  # (kv, T, hd)
        vh = vs.reshape(total, nkv, hd).permute(1, 0, 2)
        mask = causal_mask(g, seq, total, pos)
        o = sdpa(q.permute(1, 0, 2), kh, vh, attn_mask=mask, enable_gqa=True)  # (heads, seq, hd)
        # o is head-major: read as (seq, heads * hd) it is no gemm operand, so the search may
        # copy it contiguously first (compiler/search/gemm.py, match_gemm_copy)
        x = x.add(self._proj(g, o.permute(1, 0, 2).reshape(seq, nh * hd), p + "attn_output"))
        h = rms_norm(x, c.hidden_size, w.get(g, p + "ffn_norm.weight"), c.rms_eps)
        gate = self._proj(g, h, p + "ffn_gate")
        up = self._proj(g, h, p + "ffn_up")
        return x.add(self._proj(g, silu(gate).mul(up), p + "ffn_down"))

    def _cache(self, g: Graph, name: str, new: Tensor, seq: Any, pos: Any, total: Any) -> Tensor:
        """Write ``new`` (seq, width) into rows pos.. of the persistent cache; return a view of
        rows 0 .. pos+seq-1 of the updated cache."""
        cache = g.input(name, (self.ctx, self.kv_width), dt.f32)
        rows = Tensor(
            g.add_op(Op.IOTA, [], arg=sym.add(pos, idx_vars((seq,))[0]), shape=(seq,), dtype=dt.i32)
        )
        updated = Tensor(g.add_op(Op.SCATTER, [cache.edge, rows.edge, new.edge]))
        g.output(name + "_new", updated, updates=name)
        return updated.slice(0, 0, total)


class _Folded:
    """A weight source whose weights enter the graph as the f32 arrays that folding their
    dequantization would give, where the source computes those directly (``f32(name)``: a
    GGUF file's formats whose numpy dequantization is bit-exact with the graph's): numpy in
    one pass per tensor instead of the reference interpreter over each expression (SmolLM2:
    ~3 s against ~14 s). Other weights, and those in ``keep``, come from the source as they
    are (``fold_weights`` folds what is left)."""

    def __init__(self, source: Any, keep: set[str]) -> None:
        self.source, self.keep = source, keep
        self._f32 = getattr(source, "f32", None)
        # per graph: name -> (node id, layout) of the weight made here (not the Tensor: it
        # would keep the graph alive)
        self._made: weakref.WeakKeyDictionary[Graph, dict[str, tuple[int, Any]]] = (
            weakref.WeakKeyDictionary()
        )

    def has(self, name: str) -> bool:
        return bool(self.source.has(name))

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.source.shape(name))

    def get(self, g: Graph, name: str) -> Tensor:
        made = self._made.setdefault(g, {})
        if name in made:
            return Tensor(g.nodes[made[name][0]], made[name][1])
        data = None
        if self._f32 is not None and name not in self.keep and name not in g.inputs:
            data = self._f32(name)
        if data is None:  # as the source makes it (an input it registered: its own way)
            return self.source.get(g, name)
        t = g.weight(name, data=data)
        made[name] = (t.node.id, t.layout)
        return t

    def rows(self, g: Graph, name: str, idx: Tensor) -> Tensor:
        return self.source.rows(g, name, idx)


# The smallest step that may run on the prefill plan (``Llama.build_prefill``): a step this long
# compiles it (its search sizes start here) and measures from how many tokens it beats the
# decode program, whose jammed quantized products win on short steps; that measured split is
# what the plan uses (``LlamaSession``). Set below the crossing measured for SmolLM2-135M on 2
# AVX2 cores (fastest of 7 runs each: 24 tokens 65 ms against the prefill plan's 87, 40
# tokens 110 against 120, 48 tokens 172 against 132; docs/plan-cache.md): a chat prompt of
# one short question (~30-40 tokens with the template) needs no prefill plan at all.
PREFILL_MIN = 40

# Seconds the first long step may spend measuring the split (once per model, machine and
# thread setting: remembered in the plan cache's folder, ``measured/prefill_split.json``); a
# ladder of step lengths, each 1.5x the last, stops when the prefill plan has won twice in a row.
SPLIT_BUDGET_S = 5.0
_SPLIT_MEMO = os.path.join("measured", "prefill_split.json")


class LlamaSession:
    """A model with its KV cache: ``forward(tokens)`` runs the new tokens at the next
    positions and returns the logits of the last one.

    One plan runs every step: the decode program (``model.build()``, quantized weights
    dequantized inside the matmuls: right for one token at a time) and, for long steps, the
    prefill program (``model.build_prefill()``: f32 weights folded at compile time, GEMMs) are
    variants of one plan chosen by ``seq`` (``luminal.plan.by_dim``; each is compiled, searched
    and cached for its own part of the range). The prefill variant is compiled the first time
    a step of ``prefill_min`` tokens or more arrives (with a progress line unless ``quiet``),
    or at once with ``compile_prefill()``; ``prefill_min=None`` turns it off. Decode steps
    never compile.

    From how many tokens the prefill variant runs (``prefill_from``): with ``prefill_min=
    "auto"`` (the default: ``PREFILL_MIN``) it is measured when the prefill plan is first
    compiled, at step lengths from ``PREFILL_MIN`` up, and remembered in the plan cache's
    folder, so a later session runs shorter steps on the decode plan without compiling or
    mapping the prefill one (without a plan cache: ``PREFILL_MIN``, unmeasured); an int is
    used as given."""

    def __init__(
        self,
        model: Any,
        backend: str = "auto",
        quiet: bool = True,
        prefill_min: int | str | None = "auto",
    ) -> None:
        # any decoder with build(), new_cache(), ctx and config.vocab_size: Llama, GPT2;
        # a prefill plan needs build_prefill() as well
        measured = prefill_min == "auto"
        if measured:
            prefill_min = PREFILL_MIN
        if prefill_min is not None and (
            isinstance(prefill_min, bool) or not isinstance(prefill_min, int) or prefill_min < 1
        ):
            raise ValueError(
                f"prefill_min must be a positive int, 'auto' or None, got {prefill_min!r}"
            )
        self.model = model
        self.quiet = quiet
        # a cached plan needs no graph: it is built only to compile or interpret it
        self.runner = Runner(model.build, backend, quiet, key=self._key("decode"), name="llama")
        self.graph = self.runner.graph
        self.prefill_min: int | None = prefill_min
        # the first step length the prefill variant runs: measured (None: not yet known)
        self.split_measured = measured
        self.prefill_from: int | None = None if measured else prefill_min
        self.split_ms: dict[str, dict[int, float]] | None = None  # what the measurement saw
        self.prefill_runner: Runner | None = None
        self._merged_plan: Any = None  # the plan with both variants (see ``plan``)
        self._plan_path: Any = None
        self._executor: Any = None
        self.cache = model.new_cache()
        self.pos = 0

    @property
    def backend(self) -> str:
        return self.runner.backend

    @property
    def has_prefill(self) -> bool:
        """Whether long prompts can use a prefill plan (compiled backend, a model with
        ``build_prefill``, ``prefill_min`` set and within the context)."""
        return (
            self.prefill_min is not None
            and self.runner.backend == "compiled"
            and hasattr(self.model, "build_prefill")
            and self.prefill_min <= self.model.ctx
        )

    def wants_prefill(self, n_tokens: int) -> bool:
        """Whether a step of ``n_tokens`` needs the prefill variant compiled or loaded: it is
        long enough to run on it, or long enough that where it starts is still unmeasured."""
        if not self.has_prefill or self.prefill_min is None or n_tokens < self.prefill_min:
            return False
        start = self.prefill_from if self.prefill_from is not None else self._remembered_split()
        return start is None or n_tokens >= start

    def compile_prefill(self) -> bool:
        """Compile the prefill plan now (it is otherwise compiled on the first long prompt);
        False when this session has none (see ``has_prefill``)."""
        if not self.has_prefill:
            return False
        if self.prefill_runner is None:
            pmin = self.prefill_min
            assert pmin is not None

            def build() -> Graph:
                progress(f"prompts of {pmin}+ tokens: building a prefill plan", self.quiet)
                say = None if self.quiet else (lambda msg: progress(msg))
                # compiled (and searched) for the steps it runs: pmin tokens and more
                return self.model.build_prefill(pmin, progress=say)

            key = self._key("prefill", min_seq=pmin)
            self.prefill_runner = Runner(build, "compiled", self.quiet, key=key,
                                         name="llama_prefill")  # fmt: skip
            if self.prefill_from is None:
                self.prefill_from = self._measured_split(pmin)
            self._one_plan(self.prefill_from)
        return True

    def _split_key(self) -> str | None:
        """The memo key of the measured split: both programs' cache keys (model, weights,
        options, luminal's code) and the threads; None without a plan cache."""
        from .. import plan_cache

        pmin = self.prefill_min
        parts = [self._key("decode"), self._key("prefill", min_seq=pmin)]
        if plan_cache.default_cache() is None:
            return None
        digests = []
        for p in parts:
            if p is None:  # a model without cache keys: nothing to remember it by
                return None
            digests.append(plan_cache.make_key(p, "cpu", {"search": True}).digest)
        return crossing.memo_key(digests)

    def _remembered_split(self) -> int | None:
        """The split a session of this model measured before (None: never measured)."""
        if not self.split_measured:
            return self.prefill_from
        key = self._split_key()
        got = crossing.read_memo(_SPLIT_MEMO).get(key) if key is not None else None
        if isinstance(got, dict) and isinstance(got.get("from"), int):
            self.prefill_from = max(int(got["from"]), self.prefill_min or 1)
        return self.prefill_from

    def _measured_split(self, pmin: int) -> int:
        """The first step length from which the prefill plan is faster than the decode plan:
        remembered, else measured (each at lengths from ``pmin`` up, 1.5x apart, on a scratch
        cache), else ``pmin`` when nothing can be remembered (no plan cache)."""
        known = self._remembered_split()
        if known is not None:
            return known
        key = self._split_key()
        if key is None or self.prefill_runner is None:
            return pmin
        ctx = self.model.ctx
        sizes, n = [], pmin
        while n < ctx:
            sizes.append(n)
            n = max(n + 1, -(-n * 3 // 2))
        sizes.append(ctx)
        scratch = self.model.new_cache()
        vocab = self.model.config.vocab_size

        def step(r: Runner, rows: int) -> None:
            toks = (np.arange(rows, dtype=np.int32) * 7919) % vocab
            r({"tokens": toks, **scratch}, pos=0)

        def settled(t: dict[str, dict[int, float]]) -> bool:  # the prefill plan won twice
            won = [t["prefill"][k] < t["decode"][k] for k in sorted(t["prefill"])]
            return won[-2:] == [True, True]

        progress("measuring from how many tokens the prefill plan is faster", self.quiet)
        runners = {"decode": self.runner, "prefill": self.prefill_runner}
        t = crossing.measure(step, runners, sizes, budget_s=SPLIT_BUDGET_S, done=settled,
                             warmup=pmin)  # fmt: skip
        found = crossing.threshold(t["decode"], t["prefill"])
        last = max(t["prefill"])
        # never the faster: from past the measured lengths (a full-context step if all were)
        start = found or next((n for n in sizes if n > last), ctx)
        self.split_ms = {k: {n: round(1e3 * s, 2) for n, s in v.items()} for k, v in t.items()}
        crossing.write_memo(_SPLIT_MEMO, key, {"from": start, "ms": self.split_ms})
        return max(start, pmin)

    def _one_plan(self, pmin: int) -> None:
        """The decode and prefill plans as one plan whose variants are chosen by ``seq``. With
        both from the plan cache, the merged plan is cached too (keyed by theirs): a warm start
        maps it in C++ and never parses a plan in Python."""
        from .. import plan_cache, runtime

        parts = [r._plan for r in (self.runner, self.prefill_runner) if r is not None]
        paths = [getattr(p, "path", None) for p in parts]
        names = [os.path.basename(os.fspath(p)) for p in paths if p is not None]
        cache = plan_cache.default_cache()
        if cache is not None and len(names) == len(parts):
            what = {"variants_of": names, "by": "seq", "from": pmin}
            key = plan_cache.make_key(what, "cpu")
            path, _ = cache.get_or_build(key, lambda: self._merged([p.plan for p in parts], pmin))
            self._plan_path, self._merged_plan = path, None
            self._executor = runtime.Executor(path)
        else:
            self._merged_plan = self._merged([p.plan for p in parts], pmin)
            # cached plans refer to weight files beside them (the plan cache's folder)
            base = os.path.dirname(os.fspath(paths[0])) if paths[0] is not None else "."
            self._executor = runtime.Executor(self._merged_plan, base_dir=base)
        for p in parts:  # the merged plan runs; theirs no longer
            p._executor = None

    @staticmethod
    def _merged(plans: list[Any], pmin: int) -> Any:
        from ..plan import by_dim

        lo = next(d.min for d in plans[0].dims if d.name == "seq")
        return by_dim(plans, "seq", [lo, pmin])

    @property
    def plan(self) -> Any:
        """The plan with both variants once the prefill one exists (read from the plan cache
        when it came from there), else None."""
        if self._merged_plan is None and self._plan_path is not None:
            from ..plan import Plan

            return Plan.load(self._plan_path)
        return self._merged_plan

    def _key(self, graph: str, **options: Any) -> dict[str, Any] | None:
        fn = getattr(self.model, "cache_key", None)
        return fn(graph, **options) if fn is not None else None

    def _prepare(self, n_tokens: int) -> None:
        """Compiles the prefill variant the first time a long enough step arrives."""
        if self.prefill_runner is None and self.wants_prefill(n_tokens):
            self.compile_prefill()

    def reset(self) -> None:
        self.pos = 0  # stale rows beyond pos are never read: the mask and the slice stop at pos+seq

    def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        toks = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if toks.size == 0:
            raise ValueError("no tokens to run")
        if self.pos + toks.size > self.model.ctx:
            raise ValueError(
                f"context full: {self.pos} cached + {toks.size} new tokens exceed the context "
                f"limit of {self.model.ctx} tokens"
            )
        vocab = self.model.config.vocab_size
        if toks.min() < 0 or toks.max() >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab}), got {toks.min()}..{toks.max()}")
        self._prepare(toks.size)
        inputs = {"tokens": toks, **self.cache}
        if self._executor is not None:
            out = self._executor.run(inputs, pos=self.pos)
        else:
            out = self.runner(inputs, pos=self.pos)
        for n in self.cache:
            # a compiled plan updated the cache array in place and returns it (no copy); the
            # interpreter returns a new array
            self.cache[n] = out[n + "_new"]
        self.pos += toks.size
        return out["logits"][-1]


_GGUF_ARCHS = ("llama", "qwen2", "smollm")


def config_from_gguf(f: Any) -> LlamaConfig:
    """Hyper-parameters from GGUF metadata (``<arch>.block_count`` etc.)."""
    arch = f.architecture
    if arch not in _GGUF_ARCHS:
        raise NotImplementedError(
            f"{f.path}: architecture {arch!r} is not supported by luminal.models.llama "
            f"(supported: {', '.join(_GGUF_ARCHS)})"
        )

    need = f.need_arch_key

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    vocab = (
        f.arch_key("vocab_size")
        or len(f.get("tokenizer.ggml.tokens") or [])
        or f.shape("token_embd.weight")[0]
    )
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        n_layers=int(need("block_count")),
        n_heads=heads,
        n_kv_heads=int(f.arch_key("attention.head_count_kv", heads)),
        head_dim=int(f.arch_key("attention.key_length", hidden // heads)),
        rope_theta=float(f.arch_key("rope.freq_base", 10000.0)),
        rms_eps=float(f.arch_key("attention.layer_norm_rms_epsilon", 1e-5)),
        context_length=int(f.arch_key("context_length", 2048)),
        # llama.cpp's converter permutes Llama q/k rows for adjacent-pair RoPE; Qwen2 keeps halves
        rope_interleaved=arch in ("llama", "smollm"),
        attn_bias=arch == "qwen2",
        arch=arch,
    )


def load_gguf(
    path: str, dequant: str = "graph", max_context: int | None = None
) -> tuple[Llama, Any]:
    """A Llama-family model and its tokenizer from a GGUF file."""
    from ..loaders.gguf import GGUFFile, GGUFWeights
    from ..tokenizer import Tokenizer

    f = GGUFFile(path)
    cfg = config_from_gguf(f)
    return Llama(cfg, GGUFWeights(f, dequant), max_context), Tokenizer.from_gguf(f)


_HF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def hf_to_gguf_name(name: str) -> str | None:
    """transformers Llama/Qwen2 parameter name -> the GGUF name the model uses (None: unused)."""
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if name in top:
        return top[name]
    parts = name.split(".")
    if len(parts) >= 5 and parts[:2] == ["model", "layers"]:
        mod, leaf = ".".join(parts[3:-1]), parts[-1]
        if mod in _HF_NAMES:
            return f"blk.{parts[2]}.{_HF_NAMES[mod]}.{leaf}"
    return None


def from_hf(
    config: dict[str, Any], arrays: dict[str, np.ndarray], max_context: int | None = None
) -> Llama:
    """A model from a transformers config dict and its (safetensors) arrays."""
    from .base import DictWeights

    cfg = LlamaConfig.from_hf(config)
    ws = {}
    for k, v in arrays.items():
        n = hf_to_gguf_name(k)
        if n is not None:
            ws[n] = v
    if config.get("tie_word_embeddings", False):
        ws.pop("output.weight", None)
    return Llama(cfg, DictWeights(ws), max_context)


def load_hf_dir(path: str, max_context: int | None = None) -> tuple[Llama, Any]:
    """A transformers folder: config.json, *.safetensors (mapped), tokenizer.json."""
    import glob
    import json
    import os

    from ..loaders.safetensors import SafetensorsFile
    from ..tokenizer import Tokenizer

    with open(os.path.join(path, "config.json")) as fh:
        config = json.load(fh)
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{path}: no .safetensors files")
    arrays: dict[str, np.ndarray] = {}
    for fn in files:
        st = SafetensorsFile(fn)
        arrays.update({k: st[k] for k in st.keys()})
    return from_hf(config, arrays, max_context), Tokenizer.from_file(
        os.path.join(path, "tokenizer.json")
    )
