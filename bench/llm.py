"""LLM and embedding benchmark: luminal against llama.cpp, PyTorch and ONNX Runtime.

    python bench/llm.py                      # SmolLM2 prefill 128 / decode 128, MiniLM b1 / b32
    python bench/llm.py --decode 32 --skip-torch-compile

Every engine runs on the same machine in the same run with the same thread count (default 2).
SmolLM2: luminal and llama.cpp (llama-cpp-python) read the same Q4_1 GGUF; PyTorch runs the
same weights dequantized to fp32 (transformers' GGUF loader). MiniLM: luminal vs PyTorch eager
(transformers BertModel + mean pooling) and ONNX Runtime (the same model exported). Memory
bandwidth is measured here too, so decode and batch-1 embedding speeds are also given as a
fraction of the bandwidth roofline (weight bytes read once per token / per batch).

Prints a table, then one JSON line (the last line). Ratios > 1 mean luminal is faster.
A measurement that would run past --max-seconds stops early and reports the steps it did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

SENT = "The quick brown fox jumps over the lazy dog while the compiler searches for a faster plan."


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bandwidth_gbs(threads: int) -> float:
    """Streaming copy bandwidth (read + write bytes) of a 256 MiB buffer, best of 5."""
    a = np.ones(64 * 1024 * 1024, np.float32)
    b = np.empty_like(a)
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best / 1e9


def timed_steps(step: Callable[[int], None], n: int, budget: float) -> tuple[int, float]:
    """Run step(i) for i < n or until ``budget`` seconds pass; (steps done, seconds)."""
    t0 = time.perf_counter()
    done = 0
    while done < n:
        step(done)
        done += 1
        if time.perf_counter() - t0 > budget:
            break
    return done, time.perf_counter() - t0


# ----------------------------------------------------------------------------- SmolLM2
def bench_luminal_llm(
    path: str, prompt: list[int], n_decode: int, a: argparse.Namespace
) -> dict[str, Any]:
    from luminal.models import LlamaSession, load_gguf

    backend = a.backend
    dequant = "graph" if backend == "compiled" else "load"
    model, _ = load_gguf(path, dequant=dequant, max_context=len(prompt) + n_decode + 8)
    t = time.perf_counter()
    s = LlamaSession(model, backend)
    compile_s = time.perf_counter() - t
    s.forward(prompt[:4])  # warm-up (kernel loading, first-touch of weights)
    s.reset()
    t = time.perf_counter()
    lg = s.forward(prompt)
    prefill = time.perf_counter() - t
    tok = int(np.argmax(lg))
    done, secs = timed_steps(lambda i: s.forward([tok]), n_decode, a.max_seconds)
    return {
        "prefill_tok_s": len(prompt) / prefill,
        "decode_tok_s": done / secs,
        "decode_steps": done,
        "backend": s.backend,
        "compile_s": compile_s,
    }


def bench_llamacpp(
    path: str, prompt: list[int], n_decode: int, a: argparse.Namespace
) -> dict[str, Any]:
    from llama_cpp import Llama

    llm = Llama(
        model_path=path,
        n_ctx=len(prompt) + n_decode + 8,
        n_threads=a.threads,
        n_threads_batch=a.threads,
        n_batch=len(prompt),
        verbose=False,
    )
    llm.eval(prompt[:4])
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - t
    done, secs = timed_steps(lambda i: llm.eval([prompt[i % len(prompt)]]), n_decode, a.max_seconds)
    return {"prefill_tok_s": len(prompt) / prefill, "decode_tok_s": done / secs}


def bench_torch_llm(
    path: str, prompt: list[int], n_decode: int, a: argparse.Namespace, compiled: bool
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    fwd: Any = hf
    if compiled:
        fwd = torch.compile(hf, dynamic=True)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        fwd(ids[:, :8])  # warm-up / compile
        t = time.perf_counter()
        out = fwd(ids, use_cache=True)
        prefill = time.perf_counter() - t
        state = {"past": out.past_key_values, "tok": out.logits[:, -1:].argmax(-1)}

        def step(i: int) -> None:
            o = fwd(state["tok"], past_key_values=state["past"], use_cache=True)
            state["past"], state["tok"] = o.past_key_values, o.logits[:, -1:].argmax(-1)

        step(0)  # warm-up of the decode shape
        done, secs = timed_steps(step, n_decode, a.max_seconds)
    return {"prefill_tok_s": len(prompt) / prefill, "decode_tok_s": done / secs}


# ----------------------------------------------------------------------------- MiniLM
def bench_minilm(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from luminal.models import Bert, Embedder, minilm_dir
    from luminal.tokenizer import Tokenizer

    d = minilm_dir()
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    emb = Embedder(Bert.from_dir(d), tok, a.backend)
    res: dict[str, Any] = {"backend": emb.backend}
    from transformers import BertModel

    hf = BertModel.from_pretrained(d).eval()
    for b in (1, 32):
        texts = [SENT] * b
        ids, mask = emb.encode_ids(texts)
        if emb.backend == "interp" and b > 1:
            res[f"luminal_b{b}"] = (
                None  # the interpreter materializes (batch, seq, out, in) products
            )
        else:
            emb(texts)
            n, secs = timed_steps(lambda i, t=texts: emb(t), a.reps, a.max_seconds)
            res[f"luminal_b{b}"] = b * n / secs
        ti, tm = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))

        def torch_run(i: int, ti: Any = ti, tm: Any = tm) -> None:
            with torch.no_grad():
                h = hf(input_ids=ti, attention_mask=tm).last_hidden_state
                m = tm.unsqueeze(-1).float()
                torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)

        torch_run(0)
        n, secs = timed_steps(torch_run, a.reps, a.max_seconds)
        res[f"torch_b{b}"] = b * n / secs
        res[f"onnxruntime_b{b}"] = bench_ort(hf, ids, mask, a)
    return res


def bench_ort(hf: Any, ids: np.ndarray, mask: np.ndarray, a: argparse.Namespace) -> float | None:
    try:
        import onnxruntime as ort
        import torch
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "minilm.onnx")
        ti, tm = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
        try:

            class Wrap(
                torch.nn.Module
            ):  # positional inputs, one tensor out: what the exporter wants
                def __init__(self) -> None:
                    super().__init__()
                    self.m = hf

                def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                    return self.m(
                        input_ids=input_ids, attention_mask=attention_mask
                    ).last_hidden_state

            torch.onnx.export(
                Wrap(),
                (ti, tm),
                p,
                input_names=["input_ids", "attention_mask"],
                output_names=["h"],
                dynamo=False,
            )
        except Exception as e:  # exporter missing or failing: report, don't abort the bench
            log(f"onnx export failed: {type(e).__name__}: {e}")
            return None
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        sess = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
        feed = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}

        def run(i: int) -> None:
            h = sess.run(None, feed)[0]
            m = mask[..., None].astype(np.float32)
            e = (h * m).sum(1) / m.sum(1)
            e / np.linalg.norm(e, axis=-1, keepdims=True)

        run(0)
        n, secs = timed_steps(run, a.reps, a.max_seconds)
        return ids.shape[0] * n / secs


# ----------------------------------------------------------------------------- main
def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill", type=int, default=128)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--reps", type=int, default=20, help="MiniLM repetitions")
    p.add_argument("--max-seconds", type=float, default=120.0, help="time cap per measurement")
    p.add_argument("--backend", choices=["compiled", "interp"], default="compiled")
    p.add_argument("--skip-torch-compile", action="store_true")
    p.add_argument("--skip-minilm", action="store_true")
    p.add_argument("--skip-llm", action="store_true")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    import torch

    torch.set_num_threads(a.threads)
    from luminal.loaders.gguf import GGUFFile
    from luminal.models import smollm2_path
    from luminal.tokenizer import Tokenizer

    path = smollm2_path()
    tok = Tokenizer.from_gguf(GGUFFile(path))
    text = " ".join([SENT] * 20)
    prompt = tok.encode(text)[: a.prefill]
    bw = bandwidth_gbs(a.threads)
    weight_bytes = os.path.getsize(path)  # every weight is read once per decoded token
    rows: dict[str, dict[str, Any]] = {}
    engines: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("luminal", lambda: bench_luminal_llm(path, prompt, a.decode, a)),
        ("llama.cpp", lambda: bench_llamacpp(path, prompt, a.decode, a)),
        ("torch eager", lambda: bench_torch_llm(path, prompt, a.decode, a, False)),
    ]
    if not a.skip_torch_compile:
        engines.append(("torch.compile", lambda: bench_torch_llm(path, prompt, a.decode, a, True)))
    for name, fn in engines if not a.skip_llm else []:
        log(f"SmolLM2 on {name} ...")
        try:
            rows[name] = fn()
        except Exception as e:  # one engine failing must not hide the others
            log(f"  {name} failed: {type(e).__name__}: {e}")
            rows[name] = {}
    print(
        f"\nSmolLM2-135M-Instruct Q4_1, {a.threads} threads, "
        f"prefill {len(prompt)} / decode {a.decode} tokens; "
        f"bandwidth {bw:.1f} GB/s, roofline decode {bw * 1e9 / weight_bytes:.0f} tok/s"
    )
    print(f"{'engine':<15}{'prefill tok/s':>15}{'decode tok/s':>15}")
    for name, r in rows.items():
        print(
            f"{name:<15}{r.get('prefill_tok_s', float('nan')):>15.1f}"
            f"{r.get('decode_tok_s', float('nan')):>15.1f}"
        )
    mini: dict[str, Any] = {}
    if not a.skip_minilm:
        log("MiniLM ...")
        try:
            mini = bench_minilm(a)
        except Exception as e:
            log(f"  MiniLM failed: {type(e).__name__}: {e}")
        print("\nall-MiniLM-L6-v2 embeddings/s")
        for b in (1, 32):
            vals = [mini.get(f"{e}_b{b}") for e in ("luminal", "torch", "onnxruntime")]
            print(
                f"batch {b:<3}"
                + "".join(
                    f"{k:>14}: {v:.1f}" if v else f"{k:>14}: n/a"
                    for k, v in zip(("luminal", "torch", "onnxruntime"), vals, strict=True)
                )
            )
    lum = rows.get("luminal", {})
    minilm_bytes = 90.9e6  # f32 weights, read once per batch
    summary = {
        "backend": lum.get("backend"),
        "threads": a.threads,
        "bandwidth_gbs": round(bw, 2),
        "prefill_tok_s": lum.get("prefill_tok_s"),
        "decode_tok_s": lum.get("decode_tok_s"),
        "decode_steps": lum.get("decode_steps"),
        "llamacpp_prefill_tok_s": rows.get("llama.cpp", {}).get("prefill_tok_s"),
        "llamacpp_decode_tok_s": rows.get("llama.cpp", {}).get("decode_tok_s"),
        "torch_eager_prefill_tok_s": rows.get("torch eager", {}).get("prefill_tok_s"),
        "torch_eager_decode_tok_s": rows.get("torch eager", {}).get("decode_tok_s"),
        "decode_vs_llamacpp": _ratio(
            lum.get("decode_tok_s"), rows.get("llama.cpp", {}).get("decode_tok_s")
        ),
        "prefill_vs_torch_eager": _ratio(
            lum.get("prefill_tok_s"), rows.get("torch eager", {}).get("prefill_tok_s")
        ),
        "decode_vs_torch_compile": _ratio(
            lum.get("decode_tok_s"), rows.get("torch.compile", {}).get("decode_tok_s")
        ),
        "decode_frac_roofline": round(lum["decode_tok_s"] * weight_bytes / (bw * 1e9), 4)
        if lum
        else None,
        "minilm_b1_emb_s": mini.get("luminal_b1"),
        "minilm_b32_emb_s": mini.get("luminal_b32"),
        "minilm_b1_vs_torch": _ratio(mini.get("luminal_b1"), mini.get("torch_b1")),
        "minilm_b32_vs_torch": _ratio(mini.get("luminal_b32"), mini.get("torch_b32")),
        "minilm_b32_vs_onnxruntime": _ratio(mini.get("luminal_b32"), mini.get("onnxruntime_b32")),
        "minilm_b1_frac_roofline": round(mini["luminal_b1"] * minilm_bytes / (bw * 1e9), 4)
        if mini
        else None,
    }
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in summary.items()}))


if __name__ == "__main__":
    main()
