"""Decoder-only language models beyond plain Llama, as one parameterized graph: Qwen2/Qwen3
(q/k norm), Mistral (sliding window), Gemma 2/3 (soft-capping, (1 + w) norms, sandwich
norms, scaled tied embeddings, local/global layers), Phi-3 (fused qkv and gate-up), GPT-NeoX
(LayerNorm, partial rotary, parallel residual) and mixture-of-experts MLPs (Mixtral,
Qwen2-MoE with a shared expert, Qwen3-MoE).

Weights are read by GGUF tensor names (``blk.0.attn_q.weight``) from a ``WeightSource``;
the transformers mapping (``hf_weights``) and the config readers are in
``decoder_configs.py``. The KV cache, the symbolic ``seq``/``pos`` dims and the prefill graph
work as in ``llama.py``, so ``LlamaSession`` drives these models too.

Mixture of experts: the router's top-k is k rounds of argmax over the expert probabilities,
and each routed expert's weights are GATHERed by expert id (one row of an (experts, rows *
cols) view per token and slot), so a decode step reads only the weights of the experts it
routes to, not all of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..functional import (
    apply_rotary_emb,
    argmax,
    embedding,
    eq,
    ge,
    gelu,
    gt,
    layer_norm,
    linear,
    logical_and,
    logical_or,
    matmul,
    maximum,
    rms_norm,
    rope_positions,
    sigmoid,
    silu,
    softmax,
    tanh,
    where,
)
from ..functional import scaled_dot_product_attention as sdpa
from ..functional._base import iota
from ..functional._nnbase import bool_to_bias
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.view import idx_vars
from ..tensor import Graph, Tensor
from .base import WeightSource
from .rope import rope_tables

_ACTS = ("silu", "gelu", "gelu_tanh")


@dataclass
class DecoderConfig:
    """Hyper-parameters; every architecture difference is a field (see ``hf_config``)."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    context_length: int = 2048
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rope_dims: int | None = None  # rotated dims per head (partial rotary); None: all
    rope_interleaved: bool = False
    rope_theta_local: float | None = None  # sliding layers' RoPE base (Gemma 3)
    norm: str = "rms"  # or "layer" (with biases)
    norm_eps: float = 1e-6
    norm_offset: float = 0.0  # Gemma scales by (offset + w)
    qk_norm: bool = False
    act: str = "silu"
    gated: bool = True  # down(act(gate) * up) vs down(act(up))
    sandwich_norms: bool = False  # Gemma 2/3: norms after attention and after the MLP too
    parallel_residual: bool = False  # GPT-NeoX: x + attn(ln1 x) + mlp(ln2 x)
    sliding_window: int | None = None
    layer_types: list[str] = field(default_factory=list)  # "full" / "sliding" per layer
    attn_scale: float | None = None  # None: head_dim ** -0.5
    attn_softcap: float | None = None
    final_softcap: float | None = None
    embed_scale: float | None = None
    n_experts: int = 0
    top_k: int = 0
    norm_topk: bool = True
    moe_intermediate_size: int = 0
    shared_expert_size: int = 0
    dense_layers: list[int] = field(default_factory=list)  # MLP-only layers of an MoE model

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.arch}: {self.n_heads} query heads are not a multiple of "
                f"{self.n_kv_heads} kv heads"
            )
        if self.act not in _ACTS:
            raise ValueError(f"{self.arch}: activation {self.act!r} (supported: {_ACTS})")
        if self.norm not in ("rms", "layer"):
            raise ValueError(f"{self.arch}: norm must be 'rms' or 'layer', got {self.norm!r}")
        if not self.layer_types:
            self.layer_types = ["full"] * self.n_layers
        if len(self.layer_types) != self.n_layers:
            raise ValueError(
                f"{self.arch}: {len(self.layer_types)} layer types for {self.n_layers} layers"
            )
        if "sliding" in self.layer_types and not self.sliding_window:
            raise ValueError(f"{self.arch}: sliding layers need a sliding_window")

    def is_moe(self, layer: int) -> bool:
        return self.n_experts > 0 and layer not in self.dense_layers


class F32Weights:
    """A ``WeightSource`` whose float weights enter the graph as f32 (f16 / bf16 arrays stay
    mapped in their dtype and are cast in the graph); everything else is the wrapped
    source's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def has(self, name: str) -> bool:
        return bool(self.inner.has(name))

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.inner.shape(name))

    def get(self, g: Graph, name: str) -> Tensor:
        return _f32(self.inner.get(g, self._need(name)))

    def rows(self, g: Graph, name: str, idx: Tensor) -> Tensor:
        return _f32(self.inner.rows(g, self._need(name), idx))

    def _need(self, name: str) -> str:
        if not self.inner.has(name):
            raise KeyError(
                f"weight {name!r} is missing: the checkpoint does not have the layout its "
                "config declares (or a converter named it differently)"
            )
        return name


def _f32(t: Tensor) -> Tensor:
    return t.cast(dt.f32) if t.dtype.is_float and t.dtype is not dt.f32 else t


class Decoder:
    """A decoder over a ``WeightSource`` with GGUF tensor names."""

    def __init__(
        self, config: DecoderConfig, weights: WeightSource, max_context: int | None = None
    ) -> None:
        self.config = config
        self.weights = weights if isinstance(weights, F32Weights) else F32Weights(weights)
        self.ctx = min(max_context or config.context_length, config.context_length)
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
        """What determines the plan of ``build()`` / ``build_prefill`` without building it
        (``LlamaSession`` looks plans up in the plan cache by it): the definition, its config,
        the context, the options and the weights' identity (None when the source has none)."""
        identity = getattr(self.weights, "identity", None)
        if identity is None:
            return None
        return {"model": type(self).__name__, "config": asdict(self.config), "ctx": self.ctx,
                "graph": graph, "options": {**options, **self._key_extra()},
                "weights": identity()}  # fmt: skip

    def _key_extra(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ graph
    def build(
        self, logits: str = "last", name: str | None = None, min_seq: int = 1, images: bool = False
    ) -> Graph:
        """Inputs ``tokens`` i32 (seq,) and the caches; dims ``seq`` (``min_seq`` .. ctx) and
        ``pos``; outputs ``logits`` ((1 or seq), vocab) and ``<cache>_new``. ``images`` adds
        image embeddings (``_image_inputs``) and image blocks that attend bidirectionally."""
        if logits not in ("last", "all"):
            raise ValueError(f"logits must be 'last' or 'all', got {logits!r}")
        if not 1 <= min_seq <= self.ctx:
            raise ValueError(f"min_seq must be in [1, {self.ctx}] (the context), got {min_seq}")
        c, w = self.config, self.weights
        g = Graph(name or c.arch)
        seq = sym.dim("seq", min_seq, self.ctx)
        pos = sym.dim("pos", 0, self.ctx - 1)
        tokens = g.input("tokens", (seq,), dt.i32)
        x = w.rows(g, "token_embd.weight", tokens)
        if c.embed_scale is not None:
            x = x.mul(c.embed_scale)
        blocks = None
        if images:
            x, blocks = self._image_inputs(g, x, seq)
        positions = rope_positions(g, seq, pos)
        total = sym.add(pos, seq)
        tables = {kind: self._rope_table(positions, total, kind, theta)
                  for kind, theta in self._rope_bases().items()}  # fmt: skip
        masks = {kind: self._mask(g, kind, seq, pos, total, blocks)
                 for kind in set(c.layer_types)}  # fmt: skip
        for i in range(c.n_layers):
            kind = c.layer_types[i]
            cos, sin = tables[kind if kind in tables else "full"]
            x = self._block(g, i, x, seq, pos, total, cos, sin, masks[kind])
        x = self._norm(g, x, "output_norm", c.hidden_size)
        if logits == "last":
            x = x.slice(0, sym.add(seq, -1), 1)
        out = linear(x, w.get(g, "token_embd.weight" if self.tied else "output.weight"))
        if c.final_softcap:
            out = tanh(out.mul(1.0 / c.final_softcap)).mul(c.final_softcap)
        g.output("logits", out)
        return g

    def build_prefill(self, min_seq: int, name: str | None = None, progress: Any = None) -> Graph:
        """The prefill graph (``Llama.build_prefill``): weight-only expressions folded to f32
        weights at build time; the output head stays as it is (read for one row)."""
        from ..compiler.fold import fold_weights

        graph = self.build(name=name or f"{self.config.arch}_prefill", min_seq=min_seq)
        head = "token_embd.weight" if self.tied else "output.weight"
        return fold_weights(graph, progress, keep=[head])

    def _rope_table(
        self, positions: Tensor, total: Any, kind: str, theta: float
    ) -> tuple[Tensor, Tensor]:
        """cos/sin (seq, rotated dims) for a step reaching ``total`` tokens; Gemma 3's local
        layers have no scaling."""
        c = self.config
        scaling = c.rope_scaling if kind == "full" else None
        return rope_tables(positions, total, c.rope_dims or c.head_dim, theta,
                           c.rope_interleaved, scaling)  # fmt: skip

    def _rope_bases(self) -> dict[str, float]:
        c = self.config
        bases = {"full": c.rope_theta}
        if c.rope_theta_local is not None:
            bases["sliding"] = c.rope_theta_local
        return bases

    def _image_inputs(self, g: Graph, x: Tensor, seq: Any) -> tuple[Tensor, Tensor]:
        """Inputs ``image_features`` f32 (img_rows, hidden), ``image_index`` i32 (seq,): the
        feature row each position takes instead of its token embedding (-1: keep it), and
        ``blocks`` i32 (seq,): the image block of each position (-1: text)."""
        c = self.config
        rows = sym.dim("img_rows", 1, self.ctx)
        feats = g.input("image_features", (rows, c.hidden_size), dt.f32)
        index = g.input("image_index", (seq,), dt.i32)
        blocks = g.input("blocks", (seq,), dt.i32)
        picked = embedding(maximum(index, 0), feats)
        is_img = ge(index, 0).unsqueeze(-1).expand(seq, c.hidden_size)
        return where(is_img, picked, x), blocks

    def _mask(
        self, g: Graph, kind: str, seq: Any, pos: Any, total: Any, blocks: Tensor | None = None
    ) -> Tensor:
        """Query i (absolute position pos + i) sees key j when j <= pos + i and, in a sliding
        layer, pos + i - j < window. With ``blocks`` (this step's image block per position),
        positions of one image block also see each other (later ones too)."""
        i, j = sym.index_var(0, seq), sym.index_var(1, total)
        at = sym.add(pos, i)
        causal = sym.lt(j, sym.add(at, 1))
        window = None
        if kind == "sliding":
            assert self.config.sliding_window is not None
            window = sym.lt(sym.add(at, -self.config.sliding_window), j)
        if blocks is None:
            expr = causal if window is None else sym.logical_and(causal, window)
            return iota(g, (seq, total), expr).cast(dt.bool_)
        b1 = blocks.add(1)  # 0: text; the cached keys (padding) read 0 too
        q = b1.unsqueeze(1).expand(seq, total)
        k = b1.pad_dim(0, pos, 0).unsqueeze(0).expand(seq, total)
        same = logical_and(eq(q, k), gt(q, 0))
        m = logical_or(iota(g, (seq, total), causal).cast(dt.bool_), same)
        if window is not None:
            m = logical_and(m, iota(g, (seq, total), window).cast(dt.bool_))
        return m

    def _norm(self, g: Graph, x: Tensor, name: str, dim: int) -> Tensor:
        c, w = self.config, self.weights
        wt = w.get(g, name + ".weight")
        if c.norm_offset:
            wt = wt.add(c.norm_offset)
        if c.norm == "layer":
            bias = w.get(g, name + ".bias") if w.has(name + ".bias") else None
            return layer_norm(x, dim, wt, bias, c.norm_eps)
        return rms_norm(x, dim, wt, c.norm_eps)

    def _proj(self, g: Graph, x: Tensor, name: str) -> Tensor:
        w = self.weights
        bias = w.get(g, name + ".bias") if w.has(name + ".bias") else None
        return linear(x, w.get(g, name + ".weight"), bias)

    def _act(self, x: Tensor) -> Tensor:
        a = self.config.act
        return silu(x) if a == "silu" else gelu(x, "tanh" if a == "gelu_tanh" else "none")

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """RoPE on the first ``rope_dims`` of each head of x (seq, heads, hd)."""
        c = self.config
        hd, rd = c.head_dim, c.rope_dims or c.head_dim
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        if rd == hd:
            return apply_rotary_emb(x, cos, sin, c.rope_interleaved)
        rot = apply_rotary_emb(x.slice(-1, 0, rd), cos, sin, c.rope_interleaved)
        return rot.pad_dim(-1, 0, hd - rd).add(x.slice(-1, rd, hd - rd).pad_dim(-1, rd, 0))

    def _qkv(self, g: Graph, h: Tensor, p: str) -> tuple[Tensor, Tensor, Tensor]:
        c = self.config
        q_w, kv_w = c.n_heads * c.head_dim, self.kv_width
        if self.weights.has(p + "attn_qkv.weight"):  # Phi-3 (and GGUF files) fuse q, k and v
            qkv = self._proj(g, h, p + "attn_qkv")
            return qkv.slice(1, 0, q_w), qkv.slice(1, q_w, kv_w), qkv.slice(1, q_w + kv_w, kv_w)
        return (self._proj(g, h, p + "attn_q"), self._proj(g, h, p + "attn_k"),
                self._proj(g, h, p + "attn_v"))  # fmt: skip

    def _block(
        self, g: Graph, i: int, x: Tensor, seq: Any, pos: Any, total: Any,
        cos: Tensor, sin: Tensor, mask: Tensor,
    ) -> Tensor:  # fmt: skip
        c, p = self.config, f"blk.{i}."
        hd, nh, nkv = c.head_dim, c.n_heads, c.n_kv_heads
        h = self._norm(g, x, p + "attn_norm", c.hidden_size)
        q, k, v = self._qkv(g, h, p)
        q, k = q.reshape(seq, nh, hd), k.reshape(seq, nkv, hd)
        if c.qk_norm:
            q = self._norm(g, q, p + "attn_q_norm", hd)
            k = self._norm(g, k, p + "attn_k_norm", hd)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        ks = self._cache(g, f"k_cache_{i}", k.reshape(seq, nkv * hd), seq, pos, total)
        vs = self._cache(g, f"v_cache_{i}", v, seq, pos, total)
        kh = ks.reshape(total, nkv, hd).permute(1, 0, 2)
        vh = vs.reshape(total, nkv, hd).permute(1, 0, 2)
        qh = q.permute(1, 0, 2)
        scale = c.attn_scale if c.attn_scale is not None else hd**-0.5
        o = self._attention(g, i, qh, kh, vh, mask, scale)
        a = self._proj(g, o.permute(1, 0, 2).reshape(seq, nh * hd), p + "attn_output")
        if c.sandwich_norms:
            a = self._norm(g, a, p + "post_attention_norm", c.hidden_size)
        if c.parallel_residual:
            return x.add(a).add(self._mlp(g, i, self._norm(g, x, p + "ffn_norm", c.hidden_size)))
        x = x.add(a)
        m = self._mlp(g, i, self._norm(g, x, p + "ffn_norm", c.hidden_size))
        if c.sandwich_norms:
            m = self._norm(g, m, p + "post_ffw_norm", c.hidden_size)
        return x.add(m)

    def _attention(
        self, g: Graph, i: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float
    ) -> Tensor:
        """q (heads, seq, hd), k/v (kv heads, total, hd) -> (heads, seq, hd)."""
        cap = self.config.attn_softcap
        if cap:
            return _softcap_attention(q, k, v, mask, scale, cap)
        return sdpa(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)

    def _mlp(self, g: Graph, i: int, h: Tensor) -> Tensor:
        p = f"blk.{i}."
        if self.config.is_moe(i):
            return self._moe(g, p, h)
        return self._dense_mlp(g, h, p, "")

    def _dense_mlp(self, g: Graph, h: Tensor, p: str, suffix: str) -> Tensor:
        c, w = self.config, self.weights
        up = self._proj(g, h, p + "ffn_up" + suffix)
        if not c.gated:
            return self._proj(g, self._act(up), p + "ffn_down" + suffix)
        if w.has(p + "ffn_gate" + suffix + ".weight"):
            gate = self._proj(g, h, p + "ffn_gate" + suffix)
        else:  # fused gate-up (Phi-3): the gate is the first half
            n = up.shape[-1] // 2
            gate, up = up.slice(-1, 0, n), up.slice(-1, n, n)
        return self._proj(g, self._act(gate).mul(up), p + "ffn_down" + suffix)

    def _moe(self, g: Graph, p: str, h: Tensor) -> Tensor:
        c, w = self.config, self.weights
        seq = h.shape[0]
        probs = softmax(linear(h, w.get(g, p + "ffn_gate_inp.weight")), -1)  # (seq, experts)
        weights, experts = _topk(probs, c.top_k)
        if c.norm_topk:
            tot = weights[0]
            for t in weights[1:]:
                tot = tot.add(t)
            weights = [t.mul(tot.reciprocal()) for t in weights]
        hc = h.unsqueeze(-1)  # (seq, hidden, 1)
        out: Tensor | None = None
        fused = w.has(p + "ffn_gate_up_exps.weight")  # transformers 5 stacks gate and up
        for wt, e in zip(weights, experts, strict=True):
            if fused:
                gu = matmul(self._expert(g, p + "ffn_gate_up_exps.weight", e), hc)
                n = gu.shape[1] // 2
                gate, up = gu.slice(1, 0, n), gu.slice(1, n, n)
            else:
                gate = matmul(self._expert(g, p + "ffn_gate_exps.weight", e), hc)
                up = matmul(self._expert(g, p + "ffn_up_exps.weight", e), hc)
            act = self._act(gate).mul(up)  # (seq, inter, 1)
            y = matmul(self._expert(g, p + "ffn_down_exps.weight", e), act).reshape(
                seq, c.hidden_size
            )
            y = y.mul(wt.unsqueeze(-1))
            out = y if out is None else out.add(y)
        assert out is not None
        if w.has(p + "ffn_up_shexp.weight"):
            shared = self._dense_mlp(g, h, p, "_shexp")
            if w.has(p + "ffn_gate_inp_shexp.weight"):  # (1, hidden), or (hidden,) in GGUF
                gw = w.get(g, p + "ffn_gate_inp_shexp.weight").reshape(1, c.hidden_size)
                shared = shared.mul(sigmoid(linear(h, gw)))
            out = out.add(shared)
        return out

    def _expert(self, g: Graph, name: str, e: Tensor) -> Tensor:
        """The (seq, rows, cols) weights of expert ``e[t]`` for each token t: a GATHER of one
        row of the (experts, rows * cols) view, so only routed experts are read."""
        w = self.weights
        n, rows, cols = w.shape(name)
        packed = self._packed(name)
        if packed is not None:  # block-quantized: the packed blocks are gathered as rows
            from ..loaders import quants

            kind, raw = packed
            picked = quants.quantized_rows(g, name, kind, raw, (n, rows * cols), e)
            return picked.reshape(e.shape[0], rows, cols)
        return embedding(e, w.get(g, name).reshape(n, rows * cols)).reshape(e.shape[0], rows, cols)

    def _packed(self, name: str) -> tuple[str, np.ndarray] | None:
        """(format, bytes) of a block-quantized weight that enters the graph packed: a GGUF
        tensor of a block format, or one the source holds packed (``packed``)."""
        from ..loaders import quants

        w = self.weights
        own = getattr(w, "packed", None)
        if own is not None and name in own:
            return own[name]
        f = getattr(w, "file", None)
        if f is not None and getattr(w, "dequant", "") == "graph":
            kind = f.type_name(name)
            if kind in quants.FORMATS:
                return kind, f.raw(name)
        return None

    def _cache(self, g: Graph, name: str, new: Tensor, seq: Any, pos: Any, total: Any) -> Tensor:
        """Write ``new`` (seq, width) at rows pos.. of the cache; rows 0 .. pos+seq-1 after."""
        cache = g.input(name, (self.ctx, self.kv_width), dt.f32)
        rows = Tensor(
            g.add_op(Op.IOTA, [], arg=sym.add(pos, idx_vars((seq,))[0]), shape=(seq,), dtype=dt.i32)
        )
        updated = Tensor(g.add_op(Op.SCATTER, [cache.edge, rows.edge, new.edge]))
        g.output(name + "_new", updated, updates=name)
        return updated.slice(0, 0, total)


def _topk(probs: Tensor, k: int, floor: float = -1.0) -> tuple[list[Tensor], list[Tensor]]:
    """The k largest values along the last dim, largest first, and their indices (i32): k
    rounds of argmax, each replacing the winner by ``floor`` (below every value: -1 for
    probabilities)."""
    ids = iota(probs.graph, probs.shape, idx_vars(probs.shape)[-1])
    vals, idxs = [], []
    cur = probs
    for _ in range(k):
        best = argmax(cur, -1).cast(dt.i32)
        hit = eq(ids, best.unsqueeze(-1).expand(probs.shape))
        vals.append(cur.max_reduce(-1))
        idxs.append(best)
        cur = where(hit, floor, cur)
    return vals, idxs


def _softcap_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, cap: float
) -> Tensor:
    """Attention with Gemma 2's score soft-capping: cap * tanh(q k^T * scale / cap), then the
    mask and softmax. q (Hq, L, E), k/v (Hk, S, E); query heads grouped over kv heads."""
    hq, lq, e = q.shape
    hk = k.shape[0]
    assert isinstance(hq, int) and isinstance(hk, int)
    grp = hq // hk
    qg = q.reshape(hk, grp, lq, e)
    scores = matmul(qg, k.unsqueeze(1).permute(0, 1, 3, 2)).mul(scale)
    scores = tanh(scores.mul(1.0 / cap)).mul(cap).add(bool_to_bias(mask, scores.dtype))
    out = matmul(softmax(scores, -1), v.unsqueeze(1))  # (Hk, G, L, E)
    return out.reshape(hq, lq, v.shape[-1])
