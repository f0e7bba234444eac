"""torch.compile backends on the same models: luminal vs eager vs inductor, in one run.

    python bench/torch_backend.py [--models mlp,cnn,block,llama,gpt2,bert] [--repeat 10]
    python bench/torch_backend.py --models zoo --generate 0   # untuned families (torch_zoo.py)
                                  [--backends eager,inductor,luminal]
                                  [--cache fresh|existing] [--json-out FILE]

For each model: compile time (first call, which includes tracing and building kernels), then
the median latency of calls at two shapes (the second shape checks that no recompile happens:
``recompiles`` counts luminal graph compiles after the first call), the backends timed in turns
of a few calls each so that load drifting over the run hits all of them alike. ``glue_us`` is
luminal's own cost per partition call beyond its plan's run (arguments in, outputs out),
measured around the plan.
``generate`` is greedy ``model.generate()`` of a small Llama with the forward compiled
(DynamicCache, default arguments, eager attention: the SDPA decode plan is slow to build
today): tokens/s of the second call (the first compiles).

Compile times are measured cold and warm for both compilers: with ``--cache fresh`` (the
default) every model and backend gets empty cache folders (``LUMINAL_CACHE_DIR``,
``TORCHINDUCTOR_CACHE_DIR``), so ``compile_s`` is a first compile on a new machine;
``warm_compile_s`` is the first call of a second ``torch.compile`` of the same model after
``torch._dynamo.reset()``, which finds what the first left in those folders (dynamo traces
again; luminal loads its cached plans, inductor its cached graphs). ``--cache existing`` keeps
the user's cache folders, so ``compile_s`` depends on earlier runs.

Prints a table; the last line is JSON, with ``min_latency_vs_inductor`` (the worst
inductor/luminal latency ratio over models and shapes: > 1 means luminal is faster
everywhere), ``max_compile_vs_inductor`` and ``max_warm_compile_vs_inductor`` (the worst
luminal/inductor ratio of cold and of warm compile times).
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for every contender.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

for _k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # before any BLAS is loaded
    os.environ.pop(_k, None)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from turns import time_turns  # noqa: E402 - this folder: python puts a script's folder first

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
# this folder last: its kernels.py would stand in for the `kernels` package transformers imports
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

import luminal.torch_backend as lt  # noqa: E402


def _block() -> tuple[nn.Module, Callable[[int, int], dict[str, Any]]]:
    from torch_models import Block

    d = 256
    return Block(d, 8).eval(), lambda b, s: dict(x=torch.randn(b, s, d))


def _models() -> dict[str, Callable[[], tuple[nn.Module, Callable[[int, int], dict]]]]:
    from torch_models import SmallCNN

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

    from torch_zoo import zoo

    return {"mlp": mlp, "cnn": cnn, "block": _block, "llama": hf("llama"), "gpt2": hf("gpt2"),
            "bert": hf("bert"), **zoo()}  # fmt: skip


def _first(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "keys"):
        return next(iter(out.values()))
    return out[0]


_CACHE_VARS = ("LUMINAL_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def _fresh_caches(root: str, name: str, backend: str) -> None:
    """Empty cache folders for one model and backend (under ``root``, removed at exit)."""
    for var in _CACHE_VARS:
        os.environ[var] = tempfile.mkdtemp(prefix=f"{name}-{backend}-{var.split('_')[0]}-",
                                           dir=root)  # fmt: skip


Timed = tuple[Callable[..., Any], list[dict], dict[str, str]]
# untimed calls per turn (bench/turns.py): PyTorch's OpenMP threads spin about 10 ms after
# each parallel region, and on 2 cores they halved the speed of luminal's next 4 calls of 2 ms
# (the mlp at batch 4 x seq 32, eager call first)
_SETTLE_S, _PER_TURN = 0.02, 3


def bench_one(name: str, backend: str, make: Callable, shapes: list[tuple[int, int]],
              repeat: int) -> tuple[dict[str, Any], Callable[..., Any], list[dict]]:  # fmt: skip
    """Compile times, error, recompiles and glue of one backend on one model; returns the
    row, the compiled model (the model itself for eager) and the calls, which
    ``_interleaved_ms`` times against the other backends'."""
    torch._dynamo.reset()
    lt.reset_stats()
    torch.manual_seed(0)
    model, inputs = make()
    calls = [inputs(b, s) for b, s in shapes]
    row: dict[str, Any] = {"model": name, "backend": backend}

    def compiled() -> Any:
        be = lt.luminal_backend if backend == "luminal" else backend
        return torch.compile(model, backend=be, dynamic=True)

    with torch.no_grad():
        ref = [_first(model(**c)) for c in calls]
        f = model if backend == "eager" else compiled()
        t = time.perf_counter()
        out = f(**calls[0])
        row["compile_s"] = round(time.perf_counter() - t, 3) if backend != "eager" else 0.0
        if backend != "eager":  # a second compile of the same model finds the caches full
            torch._dynamo.reset()
            g = compiled()
            t = time.perf_counter()
            g(**calls[0])
            row["warm_compile_s"] = round(time.perf_counter() - t, 3)
            del g
        compiles = lt.stats.compiles
        err = 0.0
        for c, r in zip(calls, ref, strict=False):
            err = max(err, float((_first(f(**c)) - r).abs().max()))
        row["max_abs_err"] = err
        if backend == "luminal":
            row["recompiles"] = lt.stats.compiles - compiles
            row["eager_ops"] = sorted(lt.stats.eager_ops)
            row["glue_us"] = _glue_us(lambda: f(**calls[-1]), repeat)
    del out
    return row, f, calls


def _interleaved_ms(timed: dict[str, Timed], shapes: list[tuple[int, int]],
                    repeat: int) -> dict[str, dict[str, float]]:  # fmt: skip
    """Median latency per backend and shape, the backends timed in turns (``time_turns``),
    ``repeat`` turns each. A backend's first call after another backend's compile may trace
    again (``torch._dynamo.reset`` between compiles), with the cache folders it compiled
    with: that call is not timed. A backend that fails has its error instead of times."""
    out: dict[str, dict[str, Any]] = {b: {} for b in timed}
    with torch.no_grad():
        for k, (b, s) in enumerate(shapes):
            fns: dict[str, Callable[[], object]] = {}
            for n, (f, calls, env) in timed.items():
                if "error" in out[n]:
                    continue
                os.environ.update(env)
                try:
                    f(**calls[k])
                except Exception as e:  # one failing backend must not hide the others
                    out[n]["error"] = f"timing: {type(e).__name__}: {e}"[:160]
                    continue
                fns[n] = lambda f=f, c=calls[k]: f(**c)
            err: dict[str, str] = {}
            for n, (med, _, _) in time_turns(fns, repeat * _PER_TURN, err, _SETTLE_S,
                                             _PER_TURN).items():  # fmt: skip
                out[n][f"ms_b{b}s{s}"] = round(med * 1e3, 3)
            for n, e in err.items():
                out[n]["error"] = f"timing: {e}"[:160]
    return out


def _glue_us(call: Callable[[], Any], repeat: int) -> float | None:
    """Median per-partition-call time spent in a LuminalPartition call outside the native
    plan run (taking the arguments, binding dims, allocating and wrapping outputs, checking
    the weights), in microseconds."""
    from luminal.torch_backend.partition import LuminalPartition

    fwd = LuminalPartition.__call__
    spans: list[float] = []
    inner: list[float] = []

    def timed_call(self: Any, *args: Any) -> Any:
        prepared = self.call
        if prepared is None:
            return fwd(self, *args)
        rt = prepared.rt

        def timed_rt(*a: Any) -> Any:
            t = time.perf_counter()
            try:
                return rt(*a)
            finally:
                inner.append(time.perf_counter() - t)

        prepared.rt = timed_rt
        t = time.perf_counter()
        try:
            return fwd(self, *args)
        finally:
            spans.append(time.perf_counter() - t)
            prepared.rt = rt

    LuminalPartition.__call__ = timed_call  # type: ignore[method-assign]
    try:
        for _ in range(repeat):
            call()
    finally:
        LuminalPartition.__call__ = fwd  # type: ignore[method-assign]
    if not spans or len(spans) != len(inner):
        return None
    return round(statistics.median(a - b for a, b in zip(spans, inner, strict=True)) * 1e6, 1)


def bench_generate(backend: str, new_tokens: int, repeat: int, cache: str = "dynamic"
                   ) -> dict[str, Any]:  # fmt: skip
    """Greedy generate() of a small Llama, the forward compiled as transformers documents;
    ``cache="static"``: a StaticCache (luminal writes its keys and values in place)."""
    import transformers as tf

    torch._dynamo.reset()
    lt.reset_stats()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, attn_implementation="eager")  # fmt: skip
    m = tf.LlamaForCausalLM(cfg).eval()
    m.generation_config.pad_token_id = 0
    ids = torch.randint(1, 1000, (1, 16))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
              min_new_tokens=new_tokens)  # fmt: skip
    if cache == "static":
        kw["cache_implementation"] = "static"
    name = "generate" if cache == "dynamic" else f"generate_{cache}"
    row: dict[str, Any] = {"model": name, "backend": backend}
    with torch.no_grad():
        want = m.generate(ids, **kw)
        if backend != "eager":
            be = lt.luminal_backend if backend == "luminal" else backend
            m.forward = torch.compile(m.forward, backend=be, dynamic=True)
        t = time.perf_counter()
        got = m.generate(ids, **kw)
        row["compile_s"] = round(time.perf_counter() - t, 3) if backend != "eager" else 0.0
        row["same_tokens"] = bool(torch.equal(got, want))
        compiles = lt.stats.compiles
        times = []
        for _ in range(max(1, repeat // 3)):
            t = time.perf_counter()
            m.generate(ids, **kw)
            times.append(time.perf_counter() - t)
        row["tok_s"] = round(new_tokens / statistics.median(times), 1)
        if backend == "luminal":
            row["recompiles"] = lt.stats.compiles - compiles
            row["eager_ops"] = sorted(lt.stats.eager_ops)
    return row


def _ratios(rows: list[dict[str, Any]], shapes: list[tuple[int, int]]) -> dict[str, Any]:
    """Worst luminal-vs-inductor latency and compile-time ratios over models and shapes."""
    by = {(r["model"], r["backend"]): r for r in rows if "error" not in r}
    lat, comp, warm = [], [], []
    for (model, backend), r in by.items():
        ind = by.get((model, "inductor"))
        if backend != "luminal" or ind is None:
            continue
        keys = ["tok_s"] if model.startswith("generate") else [f"ms_b{b}s{s}" for b, s in shapes]
        for k in keys:
            a, b = r.get(k), ind.get(k)
            if a and b:
                lat.append(a / b if k == "tok_s" else b / a)
        if r.get("compile_s") and ind.get("compile_s"):
            comp.append(r["compile_s"] / ind["compile_s"])
        if r.get("warm_compile_s") and ind.get("warm_compile_s"):
            warm.append(r["warm_compile_s"] / ind["warm_compile_s"])
    return {
        "min_latency_vs_inductor": round(min(lat), 3) if lat else None,
        "max_compile_vs_inductor": round(max(comp), 3) if comp else None,
        "max_warm_compile_vs_inductor": round(max(warm), 3) if warm else None,
    }


# ``--models zoo``: the families of bench/torch_zoo.py
ZOO = ("vit", "resnet", "convnext", "mobilenetv2", "swin", "clip", "t5", "distilbert", "whisper",
       "deberta", "mamba", "wav2vec2", "segformer", "mixtral", "fnet", "vae", "unet")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,block,llama,gpt2,bert")
    ap.add_argument("--backends", default="eager,inductor,luminal")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--generate", type=int, default=32, help="new tokens (0 skips generate)")
    ap.add_argument("--generate-cache", default="dynamic", choices=["dynamic", "static"],
                    help="generate()'s KV cache: DynamicCache or StaticCache")  # fmt: skip
    ap.add_argument("--cache", default="fresh", choices=["fresh", "existing"],
                    help="fresh: empty luminal and inductor cache folders per model and "
                    "backend (cold compile times); existing: the user's caches")  # fmt: skip
    ap.add_argument("--json-out", help="also write the summary JSON to this file")
    args = ap.parse_args()
    root = tempfile.TemporaryDirectory(prefix="luminal-bench-") if args.cache == "fresh" else None
    shapes = [(2, 16), (4, 32)]  # sizes 0 and 1 are specialized by dynamo: avoid them
    models = _models()
    names = [n for m in args.models.split(",") for n in (ZOO if m == "zoo" else [m])]
    unknown = [n for n in names if n not in models]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(models)}, zoo")
    rows = []
    for name in names:
        timed: dict[str, Timed] = {}
        model_rows: dict[str, dict[str, Any]] = {}
        for backend in args.backends.split(","):
            if root is not None:
                _fresh_caches(root.name, name, backend)
            try:
                row, f, calls = bench_one(name, backend, models[name], shapes, args.repeat)
                env = {v: os.environ[v] for v in _CACHE_VARS if v in os.environ}
                timed[backend] = (f, calls, env)
            except Exception as e:  # one failing backend must not hide the others' numbers
                row = {"model": name, "backend": backend, "error": f"{type(e).__name__}: "
                       f"{str(e).splitlines()[0][:120]}"}  # fmt: skip
            model_rows[backend] = row
            rows.append(row)
        for backend, ms in _interleaved_ms(timed, shapes, args.repeat).items():
            model_rows[backend].update(ms)
    for backend in args.backends.split(",") if args.generate else []:
        if root is not None:
            _fresh_caches(root.name, "generate", backend)
        try:
            rows.append(bench_generate(backend, args.generate, args.repeat, args.generate_cache))
        except Exception as e:  # noqa: BLE001
            rows.append({"model": "generate", "backend": backend, "error": f"{type(e).__name__}: "
                         f"{str(e).splitlines()[0][:120]}"})  # fmt: skip
    keys = (
        ["compile_s", "warm_compile_s"]
        + [f"ms_b{b}s{s}" for b, s in shapes]
        + ["max_abs_err", "recompiles", "glue_us", "tok_s"]
    )
    print(f"{'model':<15} {'backend':<9} " + " ".join(f"{k:>12}" for k in keys) + "  vs eager")
    eager = {r["model"]: r for r in rows if r["backend"] == "eager" and "error" not in r}
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<15} {r['backend']:<9} error: {r['error']}")
            continue
        k = "tok_s" if r["model"].startswith("generate") else keys[3]
        base = eager.get(r["model"], {}).get(k)
        ratio = ""
        if base and r.get(k):
            ratio = f"{(r[k] / base) if k == 'tok_s' else (base / r[k]):.2f}x"
        cells = " ".join(f"{_fmt(r.get(k)):>12}" for k in keys)
        print(f"{r['model']:<15} {r['backend']:<9} {cells}  {ratio}")
    summary = {
        "bench": "torch_backend",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },  # fmt: skip
        "shapes": shapes,
        "cache": args.cache,
        **_ratios(rows, shapes),
        # the rows' numbers by model and backend, as objects (tools/ab.py compares those)
        "by_model": {
            f"{r['model']}.{r['backend']}": {
                k: v for k, v in r.items() if isinstance(v, (int, float))
            }
            for r in rows
        },  # fmt: skip
        "rows": rows,
    }
    print(json.dumps(summary))
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump(summary, out)
    if root is not None:
        root.cleanup()


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if v and (abs(v) < 1e-2 or math.isinf(v)) else f"{v:.3f}"
    return str(v)


if __name__ == "__main__":
    main()
