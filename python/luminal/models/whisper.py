"""Whisper (speech to text) from a transformers folder, as two graphs.

The encoder graph takes the raw audio (``chunk_length`` seconds at ``sampling_rate``, zero
padded like the feature extractor does) and computes the log-mel spectrogram with graph
ops: reflect padding, the short-time Fourier transform as a strided conv1d whose kernels are
the Hann-windowed cosines and sines, power, the Slaney mel filter bank as a matmul, log10,
the clamp to 8 below the maximum and the (x + 4) / 4 scaling. Then the conv stem (two conv1d
+ GELU), the positions and the pre-LayerNorm encoder; its outputs are each decoder layer's
cross-attention keys and values (the cross-attention cache), computed once per clip.

The decoder graph runs like ``llama.py``'s: tokens at symbolic ``seq``/``pos``, self-attention
KV caches updated in place by SCATTER, cross-attention over the cached encoder keys/values,
tied output embedding. ``WhisperSession.transcribe(audio)`` decodes greedily.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..functional import causal_mask, conv1d, gelu, layer_norm, linear, maximum, pad
from ..functional import scaled_dot_product_attention as sdpa
from ..graph import dtypes as dt
from ..graph import symbolic as sym
from ..graph.ops import Op
from ..graph.view import idx_vars
from ..tensor import Graph, Tensor
from .base import DictWeights, Runner
from .decoder import F32Weights


@dataclass
class WhisperConfig:
    vocab_size: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    num_mel_bins: int = 80
    max_source_positions: int = 1500
    max_target_positions: int = 448
    decoder_start_token_id: int = 50258
    eos_token_id: int = 50257
    scale_embedding: bool = False
    sampling_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160

    @staticmethod
    def from_hf(c: dict[str, Any], pre: dict[str, Any] | None = None) -> WhisperConfig:
        if c.get("activation_function", "gelu") != "gelu":
            raise NotImplementedError(f"Whisper activation {c['activation_function']!r}")
        p = pre or {}
        return WhisperConfig(
            c["vocab_size"], c["d_model"], c["encoder_layers"], c["decoder_layers"],
            c["encoder_attention_heads"], c["decoder_attention_heads"],
            c.get("num_mel_bins", 80), c.get("max_source_positions", 1500),
            c.get("max_target_positions", 448), c.get("decoder_start_token_id", 50258),
            int(c.get("eos_token_id") or 50257), bool(c.get("scale_embedding", False)),
            int(p.get("sampling_rate", 16000)), int(p.get("n_fft", 400)),
            int(p.get("hop_length", 160)),
        )  # fmt: skip

    @property
    def frames(self) -> int:
        """Mel frames per clip: the conv stem halves them to max_source_positions."""
        return 2 * self.max_source_positions

    @property
    def n_samples(self) -> int:
        return self.frames * self.hop_length


def mel_filters(n_freqs: int, n_mels: int, sampling_rate: int) -> np.ndarray:
    """Slaney-scale triangular filters with Slaney area normalization, (n_freqs, n_mels),
    0 Hz .. Nyquist (librosa's and Whisper's defaults)."""
    step, knee = 200.0 / 3, 1000.0
    log_step = math.log(6.4) / 27.0

    def to_mel(f: np.ndarray) -> np.ndarray:
        return np.where(f >= knee, knee / step + np.log(np.maximum(f, 1e-10) / knee) / log_step,
                        f / step)  # fmt: skip

    def to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m >= knee / step, knee * np.exp(log_step * (m - knee / step)), m * step)

    top = sampling_rate / 2
    fft = np.linspace(0, top, n_freqs)
    edges = to_hz(np.linspace(to_mel(np.array(0.0)), to_mel(np.array(top)), n_mels + 2))
    width = np.diff(edges)
    rel = edges[None, :] - fft[:, None]
    tri = np.maximum(0.0, np.minimum(-rel[:, :-2] / width[:-1], rel[:, 2:] / width[1:]))
    return tri * (2.0 / (edges[2:] - edges[:-2]))[None, :]


class Whisper:
    def __init__(self, config: WhisperConfig, weights: Any, max_context: int | None = None):
        self.config = config
        self.weights = weights if isinstance(weights, F32Weights) else F32Weights(weights)
        self.ctx = min(max_context or config.max_target_positions, config.max_target_positions)

    def _w(self, g: Graph, name: str) -> Tensor:
        return self.weights.get(g, name)

    def _lin(self, g: Graph, x: Tensor, name: str) -> Tensor:
        b = self._w(g, name + ".bias") if self.weights.has(name + ".bias") else None
        return linear(x, self._w(g, name + ".weight"), b)

    def _ln(self, g: Graph, x: Tensor, name: str) -> Tensor:
        return layer_norm(x, self.config.d_model, self._w(g, name + ".weight"),
                          self._w(g, name + ".bias"))  # fmt: skip

    def _heads(self, t: Tensor, n: Any, h: int) -> Tensor:
        return t.reshape(n, h, self.config.d_model // h).permute(1, 0, 2)

    # ------------------------------------------------------------------ encoder
    def log_mel(self, g: Graph, audio: Tensor) -> Tensor:
        """(n_samples,) audio -> (mels, frames) log-mel features, as the feature extractor."""
        c = self.config
        nfft, hop = c.n_fft, c.hop_length
        n_freqs = nfft // 2 + 1
        x = pad(audio.reshape(1, 1, c.n_samples), [nfft // 2, nfft // 2], mode="reflect")
        t = np.arange(nfft)
        window = 0.5 - 0.5 * np.cos(2 * np.pi * t / nfft)  # periodic Hann
        ang = 2 * np.pi * np.outer(np.arange(n_freqs), t) / nfft
        basis = np.concatenate([np.cos(ang), -np.sin(ang)]) * window  # (2F, nfft)
        kern = g.tensor(basis.astype(np.float32).reshape(2 * n_freqs, 1, nfft))
        spec = conv1d(x, kern, None, hop).reshape(2 * n_freqs, c.frames + 1)
        spec = spec.slice(1, 0, c.frames)  # the feature extractor drops the last frame
        re, im = spec.slice(0, 0, n_freqs), spec.slice(0, n_freqs, n_freqs)
        power = re.mul(re).add(im.mul(im))  # (F, frames)
        fb = mel_filters(n_freqs, c.num_mel_bins, c.sampling_rate).T.astype(np.float32)
        mel = g.tensor(fb).matmul(power)  # (mels, frames)
        logm = maximum(mel, 1e-10).log2().mul(math.log10(2.0))
        top = logm.max_reduce([0, 1], keepdim=True).add(-8.0).expand(logm.shape)
        return maximum(logm, top).add(4.0).mul(0.25)

    def build_encoder(self, name: str = "whisper_encoder") -> Graph:
        """Input ``audio`` f32 (n_samples,); outputs ``features`` (mels, frames) and
        ``cross_k_<l>`` / ``cross_v_<l>`` (max_source_positions, d_model) per decoder layer."""
        c = self.config
        g = Graph(name)
        audio = g.input("audio", (c.n_samples,))
        feats = self.log_mel(g, audio)
        g.output("features", feats)
        p = "model.encoder."
        x = gelu(conv1d(feats.unsqueeze(0), self._w(g, p + "conv1.weight"),
                        self._w(g, p + "conv1.bias"), 1, 1))  # fmt: skip
        x = gelu(conv1d(x, self._w(g, p + "conv2.weight"), self._w(g, p + "conv2.bias"), 2, 1))
        t = c.max_source_positions
        x = x.reshape(c.d_model, t).permute(1, 0).add(self._w(g, p + "embed_positions.weight"))
        h = c.encoder_heads
        for i in range(c.encoder_layers):
            q = f"{p}layers.{i}."
            a = self._ln(g, x, q + "self_attn_layer_norm")
            qh, kh, vh = (self._heads(self._lin(g, a, q + f"self_attn.{k}_proj"), t, h)
                          for k in "qkv")  # fmt: skip
            o = sdpa(qh, kh, vh).permute(1, 0, 2).reshape(t, c.d_model)
            x = x.add(self._lin(g, o, q + "self_attn.out_proj"))
            m = gelu(self._lin(g, self._ln(g, x, q + "final_layer_norm"), q + "fc1"))
            x = x.add(self._lin(g, m, q + "fc2"))
        x = self._ln(g, x, p + "layer_norm")
        for i in range(c.decoder_layers):
            q = f"model.decoder.layers.{i}.encoder_attn."
            g.output(f"cross_k_{i}", self._lin(g, x, q + "k_proj"))
            g.output(f"cross_v_{i}", self._lin(g, x, q + "v_proj"))
        return g

    # ------------------------------------------------------------------ decoder
    def cache_names(self) -> list[str]:
        return [f"{kv}_cache_{i}" for i in range(self.config.decoder_layers) for kv in ("k", "v")]

    def new_cache(self) -> dict[str, np.ndarray]:
        return {
            n: np.zeros((self.ctx, self.config.d_model), np.float32) for n in self.cache_names()
        }

    def build(self, logits: str = "last", name: str = "whisper_decoder") -> Graph:
        """Inputs ``tokens`` i32 (seq,), the self-attention caches and ``cross_k/v_<l>``;
        dims ``seq`` and ``pos``; outputs ``logits`` and ``<cache>_new``."""
        c = self.config
        g = Graph(name)
        seq, pos = sym.dim("seq", 1, self.ctx), sym.dim("pos", 0, self.ctx - 1)
        total = sym.add(pos, seq)
        tokens = g.input("tokens", (seq,), dt.i32)
        p = "model.decoder."
        emb = self._w(g, p + "embed_tokens.weight")
        x = self.weights.rows(g, p + "embed_tokens.weight", tokens)
        if c.scale_embedding:
            x = x.mul(math.sqrt(c.d_model))
        x = x.add(self._w(g, p + "embed_positions.weight").slice(0, pos, seq))
        mask = causal_mask(g, seq, total, pos)
        h, t = c.decoder_heads, c.max_source_positions
        for i in range(c.decoder_layers):
            q = f"{p}layers.{i}."
            a = self._ln(g, x, q + "self_attn_layer_norm")
            qh = self._heads(self._lin(g, a, q + "self_attn.q_proj"), seq, h)
            ks = self._cache(g, f"k_cache_{i}", self._lin(g, a, q + "self_attn.k_proj"), seq, pos)
            vs = self._cache(g, f"v_cache_{i}", self._lin(g, a, q + "self_attn.v_proj"), seq, pos)
            o = sdpa(qh, self._heads(ks.slice(0, 0, total), total, h),
                     self._heads(vs.slice(0, 0, total), total, h), attn_mask=mask)  # fmt: skip
            x = x.add(self._lin(g, o.permute(1, 0, 2).reshape(seq, c.d_model),
                                q + "self_attn.out_proj"))  # fmt: skip
            a = self._ln(g, x, q + "encoder_attn_layer_norm")
            qh = self._heads(self._lin(g, a, q + "encoder_attn.q_proj"), seq, h)
            ck = g.input(f"cross_k_{i}", (t, c.d_model))
            cv = g.input(f"cross_v_{i}", (t, c.d_model))
            o = sdpa(qh, self._heads(ck, t, h), self._heads(cv, t, h))
            x = x.add(self._lin(g, o.permute(1, 0, 2).reshape(seq, c.d_model),
                                q + "encoder_attn.out_proj"))  # fmt: skip
            m = gelu(self._lin(g, self._ln(g, x, q + "final_layer_norm"), q + "fc1"))
            x = x.add(self._lin(g, m, q + "fc2"))
        x = self._ln(g, x, p + "layer_norm")
        if logits == "last":
            x = x.slice(0, sym.add(seq, -1), 1)
        head = "proj_out.weight"
        g.output("logits", linear(x, self._w(g, head) if self.weights.has(head) else emb))
        return g

    def _cache(self, g: Graph, name: str, new: Tensor, seq: Any, pos: Any) -> Tensor:
        cache = g.input(name, (self.ctx, self.config.d_model), dt.f32)
        rows = Tensor(
            g.add_op(Op.IOTA, [], arg=sym.add(pos, idx_vars((seq,))[0]), shape=(seq,), dtype=dt.i32)
        )
        updated = Tensor(g.add_op(Op.SCATTER, [cache.edge, rows.edge, new.edge]))
        g.output(name + "_new", updated, updates=name)
        return updated


class WhisperSession:
    """A Whisper model ready to transcribe: ``encode(audio)`` runs the encoder once per clip
    (log-mel features and the cross-attention cache), ``transcribe(audio)`` decodes
    greedily from ``decoder_start_token_id`` (or ``prompt``) until EOS."""

    def __init__(self, model: Whisper, tokenizer: Any = None, backend: str = "auto",
                 quiet: bool = True) -> None:  # fmt: skip
        self.model = model
        self.config = model.config
        self.tokenizer = tokenizer
        ident = getattr(model.weights, "identity", None)

        def key(graph: str) -> dict[str, Any] | None:
            if ident is None:
                return None
            return {"model": "whisper", "config": asdict(model.config), "ctx": model.ctx,
                    "graph": graph, "weights": ident()}  # fmt: skip

        self.encoder = Runner(model.build_encoder, backend, quiet, key=key("encoder"),
                              name="whisper_encoder")  # fmt: skip
        self.decoder = Runner(model.build, backend, quiet, key=key("decoder"),
                              name="whisper_decoder")  # fmt: skip

    @property
    def backend(self) -> str:
        return self.decoder.backend

    def encode(self, audio: np.ndarray) -> dict[str, np.ndarray]:
        a = np.asarray(audio, np.float32).reshape(-1)
        n = self.config.n_samples
        if a.size > n:
            raise ValueError(
                f"audio has {a.size} samples; this model takes clips of at most {n} "
                f"({n / self.config.sampling_rate:g} s at {self.config.sampling_rate} Hz)"
            )
        return self.encoder({"audio": np.pad(a, (0, n - a.size))})

    def transcribe(
        self, audio: np.ndarray, max_new_tokens: int = 64, prompt: list[int] | None = None,
        stop: list[int] | None = None,
    ) -> list[int]:  # fmt: skip
        """The generated token ids (after the prompt), greedy."""
        enc = self.encode(audio)
        cross = {k: v for k, v in enc.items() if k.startswith("cross_")}
        toks = list(prompt) if prompt is not None else [self.config.decoder_start_token_id]
        stops = set([self.config.eos_token_id] if stop is None else stop)
        budget = min(max_new_tokens, self.model.ctx - len(toks))
        cache, pos, step, out = self.model.new_cache(), 0, toks, []
        for _ in range(budget):
            res = self.decoder({"tokens": np.asarray(step, np.int32), **cache, **cross}, pos=pos)
            cache = {n: res[n + "_new"] for n in cache}
            pos += len(step)
            nxt = int(np.argmax(res["logits"][-1]))
            if nxt in stops:
                break
            out.append(nxt)
            step = [nxt]
        return out


def whisper_from_hf(config: dict[str, Any], arrays: dict[str, np.ndarray],
                    preprocessor: dict[str, Any] | None = None) -> Whisper:  # fmt: skip
    return Whisper(WhisperConfig.from_hf(config, preprocessor), DictWeights(arrays))
