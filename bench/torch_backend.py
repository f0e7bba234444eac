"""torch.compile backends on the same models: luminal vs eager vs inductor, in one run.

    python bench/torch_backend.py [--models mlp,cnn,block,llama,gpt2,bert] [--repeat 10]
                                  [--backends eager,inductor,luminal]

For each model: compile time (first call, which includes tracing and building kernels; the
luminal kernel cache on disk makes a second run of the script faster), then the median latency
of calls at two shapes (the second shape checks that no recompile happens: ``recompiles``
counts luminal graph compiles after the first call). Prints a table; the last line is JSON.
Matmul-heavy models are slow in luminal until its plans call a BLAS.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import luminal.torch_backend as lt  # noqa: E402


def _block() -> tuple[nn.Module, Callable[[int, int], dict[str, Any]]]:
    from test_torch_backend import Block

    d = 256
    return Block(d, 8).eval(), lambda b, s: dict(x=torch.randn(b, s, d))


def _models() -> dict[str, Callable[[], tuple[nn.Module, Callable[[int, int], dict]]]]:
    from test_torch_backend import SmallCNN

    def mlp():
        m = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512)).eval()
        return m, lambda b, s: dict(input=torch.randn(b * s, 512))

    def cnn():
        return SmallCNN().eval(), lambda b, s: dict(x=torch.randn(b, 3, 32, 32))

    def hf(kind: str):
        import transformers as tf

        def make():
            common = dict(vocab_size=1000, attn_implementation="sdpa")
            if kind == "llama":
                cfg = tf.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=512, **common)  # fmt: skip
                m, extra = tf.LlamaForCausalLM(cfg), {"use_cache": False}
            elif kind == "gpt2":
                cfg = tf.GPT2Config(n_embd=128, n_layer=2, n_head=4, n_positions=512,
                                    bos_token_id=0, eos_token_id=0, **common)  # fmt: skip
                m, extra = tf.GPT2LMHeadModel(cfg), {"use_cache": False}
            else:
                cfg = tf.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=256, max_position_embeddings=512,
                                    **common)  # fmt: skip
                m, extra = tf.BertModel(cfg), {}
            return m.eval(), lambda b, s: dict(input_ids=torch.randint(0, 1000, (b, s)), **extra)

        return make

    return {"mlp": mlp, "cnn": cnn, "block": _block, "llama": hf("llama"), "gpt2": hf("gpt2"),
            "bert": hf("bert")}  # fmt: skip


def _median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def _first(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "keys"):
        return next(iter(out.values()))
    return out[0]


def bench_one(name: str, backend: str, make: Callable, shapes: list[tuple[int, int]],
              repeat: int) -> dict[str, Any]:  # fmt: skip
    torch._dynamo.reset()
    lt.reset_stats()
    torch.manual_seed(0)
    model, inputs = make()
    calls = [inputs(b, s) for b, s in shapes]
    row: dict[str, Any] = {"model": name, "backend": backend}
    with torch.no_grad():
        ref = [_first(model(**c)) for c in calls]
        f = model if backend == "eager" else torch.compile(
            model, backend=lt.luminal_backend if backend == "luminal" else backend, dynamic=True
        )  # fmt: skip
        t = time.perf_counter()
        out = f(**calls[0])
        row["compile_s"] = round(time.perf_counter() - t, 3) if backend != "eager" else 0.0
        compiles = lt.stats.compiles
        err = 0.0
        for c, r in zip(calls, ref, strict=False):
            err = max(err, float((_first(f(**c)) - r).abs().max()))
        row["max_abs_err"] = err
        for (b, s), c in zip(shapes, calls, strict=False):
            row[f"ms_b{b}s{s}"] = round(_median_ms(lambda c=c: f(**c), repeat), 3)
        if backend == "luminal":
            row["recompiles"] = lt.stats.compiles - compiles
            row["eager_ops"] = sorted(lt.stats.eager_ops)
    del out
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,block,llama,gpt2,bert")
    ap.add_argument("--backends", default="eager,inductor,luminal")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    shapes = [(2, 16), (4, 32)]  # sizes 0 and 1 are specialized by dynamo: avoid them
    models = _models()
    rows = []
    for name in args.models.split(","):
        for backend in args.backends.split(","):
            try:
                rows.append(bench_one(name, backend, models[name], shapes, args.repeat))
            except Exception as e:  # one failing backend must not hide the others' numbers
                rows.append({"model": name, "backend": backend, "error": f"{type(e).__name__}: "
                             f"{str(e).splitlines()[0][:120]}"})  # fmt: skip
    keys = ["compile_s"] + [f"ms_b{b}s{s}" for b, s in shapes] + ["max_abs_err", "recompiles"]
    print(f"{'model':<7} {'backend':<9} " + " ".join(f"{k:>12}" for k in keys) + "  vs eager")
    eager = {r["model"]: r for r in rows if r["backend"] == "eager" and "error" not in r}
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<7} {r['backend']:<9} error: {r['error']}")
            continue
        base = eager.get(r["model"], {}).get(keys[2])
        ratio = f"{base / r[keys[2]]:.2f}x" if base and r.get(keys[2]) else ""
        cells = " ".join(f"{_fmt(r.get(k)):>12}" for k in keys)
        print(f"{r['model']:<7} {r['backend']:<9} {cells}  {ratio}")
    summary = {
        "bench": "torch_backend",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },  # fmt: skip
        "shapes": shapes,
        "rows": rows,
    }
    print(json.dumps(summary))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if v and (abs(v) < 1e-2 or math.isinf(v)) else f"{v:.3f}"
    return str(v)


if __name__ == "__main__":
    main()
