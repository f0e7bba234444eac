"""Attention and transformer blocks.

``MultiheadAttention`` matches ``torch.nn.MultiheadAttention`` (state dict, masks, returned
weights). ``Attention``, ``MLP`` and ``TransformerBlock`` are the Llama-family layers with
Hugging Face names (``self_attn.q_proj``, ``mlp.gate_proj``, ``input_layernorm``, ...): grouped
query attention, rotary embeddings from caller-supplied cos/sin tables, a causal mask, and an
optional ``KVCache`` whose past keys/values are graph tensors of a symbolic length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import functional as F
from ..functional._base import same, shape_str
from ..functional._nnbase import bool_to_bias, fmax
from ..functional.attention import attention_weights
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.symbolic import sint
from ..tensor import Tensor
from .layers import LayerNorm, Linear, RMSNorm, _uniform
from .module import Module, Parameter


def _heads(x: Tensor, n: int, hd: int) -> Tensor:
    """(B, L, n*hd) -> (B, n, L, hd)."""
    return x.reshape([*x.shape[:-1], n, hd]).permute(
        [*range(x.ndim - 2), x.ndim - 1, x.ndim - 2, x.ndim]
    )


def _merge(x: Tensor) -> Tensor:
    """(B, n, L, hd) -> (B, L, n*hd)."""
    nd = x.ndim
    x = x.permute([*range(nd - 3), nd - 2, nd - 3, nd - 1])
    return x.reshape([*x.shape[:-2], sym.mul(x.shape[-2], x.shape[-1])])


def _cat_seq(a: Tensor, b: Tensor) -> Tensor:
    """Concatenate along dim -2 as two padded views and an ADD (exact, no copy op)."""
    la, lb = a.shape[-2], b.shape[-2]
    return a.pad_dim(-2, 0, lb).add(b.pad_dim(-2, la, 0))


@dataclass
class KVCache:
    """Past keys/values (B, kv_heads, P, head_dim) of one attention layer, P possibly a dim
    such as ``pos``. ``Attention`` appends the new ones; read ``k``/``v`` after the call
    (e.g. to make them graph outputs for the next step)."""

    k: Tensor | None = None
    v: Tensor | None = None

    @property
    def length(self) -> sint:
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.k is not None and self.v is not None:
            k, v = _cat_seq(self.k, k), _cat_seq(self.v, v)
        self.k, self.v = k, v
        return k, v


class MultiheadAttention(Module):
    """``torch.nn.MultiheadAttention`` (inference; kdim = vdim = embed_dim)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(
                f"MultiheadAttention: embed_dim {embed_dim} is not divisible by num_heads "
                f"{num_heads}"
            )
        if (
            add_bias_kv
            or add_zero_attn
            or (kdim or embed_dim) != embed_dim
            or (vdim or embed_dim) != embed_dim
        ):
            raise NotImplementedError(
                "MultiheadAttention: add_bias_kv, add_zero_attn and kdim/vdim != embed_dim"
            )
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.batch_first, self.dropout = batch_first, dropout
        self.in_proj_weight = Parameter((3 * embed_dim, embed_dim), dtype, _uniform(embed_dim))
        self.in_proj_bias = Parameter((3 * embed_dim,), dtype, ("const", 0.0)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias, dtype)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        e, h, hd = self.embed_dim, self.num_heads, self.head_dim
        name = "MultiheadAttention"
        for what, t in (("query", query), ("key", key), ("value", value)):
            if t.ndim not in (2, 3) or not same(t.shape[-1], e):
                raise ValueError(
                    f"{name}: {what} shape {shape_str(t.shape)} must be (L, N, {e}), "
                    f"(N, L, {e}) with batch_first, or (L, {e})"
                )
        batched = query.ndim == 3
        if batched and not self.batch_first:  # (L, N, E) -> (N, L, E)
            query, key, value = (t.permute(1, 0, 2) for t in (query, key, value))
        g = query.graph
        w = self.in_proj_weight.bind(g)
        b = self.in_proj_bias.bind(g) if self.in_proj_bias is not None else None

        def proj(i: int, t: Tensor) -> Tensor:  # rows [i*E, (i+1)*E) of the packed in_proj
            bi = None if b is None else b.slice(0, i * e, e)
            return _heads(F.linear(t, w.slice(0, i * e, e), bi), h, hd)

        q, k, v = proj(0, query), proj(1, key), proj(2, value)
        lq, s = q.shape[-2], k.shape[-2]
        bias: Tensor | None = None
        if attn_mask is not None:  # MHA's bool masks are True where attention is *not* allowed
            bias = (
                attn_mask.cast(dt.f32).mul(-fmax(dt.f32))
                if attn_mask.dtype is dt.bool_
                else attn_mask
            )
            if bias.ndim == 3:  # (N*H, L, S) -> (N, H, L, S)
                bias = bias.reshape([sym.floordiv(bias.shape[0], h), h, lq, s])
        elif is_causal:
            bias = bool_to_bias(F.causal_mask(g, lq, s), dt.f32)
        if key_padding_mask is not None:
            kp = key_padding_mask
            kp = kp.cast(dt.f32).mul(-fmax(dt.f32)) if kp.dtype is dt.bool_ else kp
            # (N, S) -> (N, 1, 1, S); unbatched (S,) -> (1, S)
            kp = kp.unsqueeze(-2).unsqueeze(-3) if batched else kp.unsqueeze(-2)
            bias = kp if bias is None else F.maximum(bias.add(kp), -fmax(dt.f32))  # stay finite
        p, _ = attention_weights(q, k, bias, name=name)
        out = _merge(F.matmul(p.cast(v.dtype), v))
        out = self.out_proj(out)
        if batched and not self.batch_first:
            out = out.permute(1, 0, 2)
        if not need_weights:
            return out, None
        return out, (F.mean(p, -3) if average_attn_weights else p)


class Attention(Module):
    """Llama-style self-attention: q/k/v/o projections, grouped-query heads, RoPE, causal."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = False,
        o_bias: bool = False,
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        head_dim = head_dim or dim // n_heads
        if n_heads % n_kv_heads:
            raise ValueError(
                f"Attention: n_heads {n_heads} is not divisible by n_kv_heads {n_kv_heads}"
            )
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = Linear(dim, n_heads * head_dim, bias, dtype)
        self.k_proj = Linear(dim, n_kv_heads * head_dim, bias, dtype)
        self.v_proj = Linear(dim, n_kv_heads * head_dim, bias, dtype)
        self.o_proj = Linear(n_heads * head_dim, dim, o_bias, dtype)

    def forward(
        self,
        x: Tensor,
        cos: Tensor | None = None,
        sin: Tensor | None = None,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        causal: bool = True,
    ) -> Tensor:
        """x (B, L, dim); cos/sin (L, head_dim) or (B, L, head_dim) from ``rope_cos_sin`` (None:
        no RoPE); ``mask`` (bool: True attends, or additive) replaces the causal mask."""
        q = _heads(self.q_proj(x), self.n_heads, self.head_dim)
        k = _heads(self.k_proj(x), self.n_kv_heads, self.head_dim)
        v = _heads(self.v_proj(x), self.n_kv_heads, self.head_dim)
        if cos is not None and sin is not None:
            if cos.ndim >= 3:  # per-batch tables: add the heads dim
                cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
            q, k = F.apply_rotary_emb(q, cos, sin), F.apply_rotary_emb(k, cos, sin)
        past: sint = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(k, v)
        if mask is None and causal:  # bottom-right aligned: query i sees keys up to past + i
            mask = F.causal_mask(x.graph, q.shape[-2], k.shape[-2], offset=past)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(_merge(out))


class MLP(Module):
    """``kind='swiglu'``: down(silu(gate(x)) * up(x)) with Llama names; ``kind='gelu'``:
    fc2(gelu(fc1(x)))."""

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        kind: str = "swiglu",
        bias: bool = False,
        approximate: str = "none",
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__()
        self.kind, self.approximate = kind, approximate
        if kind == "swiglu":
            self.gate_proj = Linear(dim, hidden_dim, bias, dtype)
            self.up_proj = Linear(dim, hidden_dim, bias, dtype)
            self.down_proj = Linear(hidden_dim, dim, bias, dtype)
        elif kind == "gelu":
            self.fc1 = Linear(dim, hidden_dim, bias, dtype)
            self.fc2 = Linear(hidden_dim, dim, bias, dtype)
        else:
            raise ValueError(f"MLP: kind must be 'swiglu' or 'gelu', got {kind!r}")

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "swiglu":
            return self.down_proj(F.silu(self.gate_proj(x)).mul(self.up_proj(x)))
        return self.fc2(F.gelu(self.fc1(x), self.approximate))


class TransformerBlock(Module):
    """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        hidden_dim: int | None = None,
        mlp: str = "swiglu",
        norm: str = "rms",
        eps: float = 1e-5,
        bias: bool = False,
        head_dim: int | None = None,
        dtype: Any = dt.f32,
    ) -> None:
        super().__init__()
        if norm not in ("rms", "layer"):
            raise ValueError(f"TransformerBlock: norm must be 'rms' or 'layer', got {norm!r}")

        def make_norm() -> Module:
            return (
                RMSNorm(dim, eps, dtype=dtype)
                if norm == "rms"
                else LayerNorm(dim, eps, dtype=dtype)
            )

        self.input_layernorm = make_norm()
        self.self_attn = Attention(dim, n_heads, n_kv_heads, head_dim, bias, bias, dtype)
        self.post_attention_layernorm = make_norm()
        self.mlp = MLP(dim, hidden_dim or 4 * dim, mlp, bias, dtype=dtype)

    def forward(
        self,
        x: Tensor,
        cos: Tensor | None = None,
        sin: Tensor | None = None,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        h = x.add(self.self_attn(self.input_layernorm(x), cos, sin, mask, cache))
        return h.add(self.mlp(self.post_attention_layernorm(h)))
