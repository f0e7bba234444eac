"""GPU benchmarks for bench/gpu_check.sh: GEMM vs torch.matmul, attention vs torch SDPA, and a
bf16 Llama-shaped (1B-class, random weights) decode step as a fraction of the memory-bandwidth
roofline measured in the same run. Writes ``OUT/bench.json`` and prints a table and one JSON
line. Each benchmark is independent: one failing is recorded and the rest still run.

Times: ``kernel_ms`` is the sum of luminal's GPU kernel time per run, taken from the CUDA
profiler (CUPTI via torch.profiler, which sees launches from any library in the process);
``wall_ms`` is the whole ``run()``, which today also stages inputs/outputs through host memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

TOP_KERNELS = 8  # the kernels listed per benchmark, by time


def _torch_ms(fn: Any, reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def _luminal_ms(
    run: Any, kernel_names: set[str] | None, reps: int = 10
) -> tuple[float, float, list[dict[str, Any]]]:
    """(GPU kernel ms per run from the profiler, wall ms per run, the kernels that took most of
    it). ``kernel_names`` None: every device kernel but copies and memsets (library calls
    launch kernels of their own names)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    run()
    t = time.perf_counter()
    for _ in range(reps):
        run()
    wall = (time.perf_counter() - t) / reps * 1e3
    kernel, top = float("nan"), []
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                run()
            torch.cuda.synchronize()
        per: dict[str, list[float]] = {}
        for ev in prof.events():
            ours = (
                kernel_names is None
                and not ev.name.startswith(("Memcpy", "Memset"))
                and getattr(ev, "device_type", None) is not None
                and "CUDA" in str(ev.device_type)
            ) or (kernel_names and ev.name in kernel_names)
            if ours:
                us = ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
                per.setdefault(ev.name, []).append(us)
        total_us = sum(sum(v) for v in per.values())
        kernel = total_us / reps / 1e3 if total_us > 0 else float("nan")
        ranked = sorted(per.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
        top = [{"kernel": n, "ms": sum(v) / reps / 1e3, "calls": len(v) / reps} for n, v in ranked]
    except Exception as e:  # profiler unavailable: report wall time only
        print(f"profiler failed: {e}", file=sys.stderr)
    return kernel, wall, top


def bandwidth_gbs() -> float:
    """Device-to-device copy bandwidth (read + write bytes per second), 2 GiB."""
    import torch

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint16, device="cuda")
    b = torch.empty_like(a)
    ms = _torch_ms(lambda: b.copy_(a), reps=10)
    return 2 * a.numel() * 2 / (ms * 1e-3) / 1e9


def _compile(g: Any) -> Any:
    import luminal as lm

    return lm.compile(g, backend="cuda")


def _steps(cg: Any) -> list[str]:
    """The plan's steps as launched: kernel, grid, block and the dims it runs under."""
    p = cg.plan
    out = []
    for st in p.steps:
        k = getattr(st, "kernel", None)
        name = p.kernels[k].entry if isinstance(k, int) else type(st).__name__
        out.append(f"{name} grid={getattr(st, 'grid', '')} block={getattr(st, 'block', '')}"
                   f" when={getattr(st, 'when', None)}")  # fmt: skip
    return out


def bench_gemm(m: int = 4096, n: int = 4096, k: int = 4096) -> dict[str, Any]:
    import torch

    import luminal as lm
    import luminal.functional as F

    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), np.float32).astype(np.float16)
    b = rng.standard_normal((k, n), np.float32).astype(np.float16)
    g = lm.Graph("gemm")
    wa = g.weight("a", data=a)
    wb = g.weight("b", data=b)
    g.output("c", F.matmul(wa.to(lm.f32), wb.to(lm.f32)).to(lm.f16))
    cg = _compile(g)
    got = cg.run({})["c"].astype(np.float32)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    want = (ta @ tb).float().cpu().numpy()
    err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-9))
    kernel, wall, top = _luminal_ms(lambda: cg.run({}), None, reps=3)
    torch_ms = _torch_ms(lambda: ta @ tb)
    flops = 2 * m * n * k
    return {"name": f"gemm f16 {m}x{n}x{k}", "kernel_ms": kernel, "wall_ms": wall,
            "torch_ms": torch_ms, "vs_torch": torch_ms / kernel, "tflops": flops / kernel / 1e9,
            "rel_err": err, "top_kernels": top}  # fmt: skip


def bench_gemm_impls(m: int = 4096, n: int = 4096, k: int = 4096) -> list[dict[str, Any]]:
    """The gemm library call both ways (generated tensor-core kernel, cuBLASLt) on f16 and f32
    operands with f32 output, vs torch.matmul on the same dtypes."""
    import torch

    from luminal.compile import CompiledGraph, build_plan
    from luminal.compiler import kernel_ir as K
    from luminal.compiler.lower import BufferInfo, Lowered
    from luminal.graph import dtypes as dt

    rows = []
    rng = np.random.default_rng(0)
    for op, npd in ((dt.f16, np.float16), (dt.f32, np.float32)):
        a = rng.standard_normal((m, k), np.float32).astype(npd)
        b = rng.standard_normal((k, n), np.float32).astype(npd)
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        want = (ta.float() @ tb.float()).cpu().numpy()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch_ms = _torch_ms(lambda ta=ta, tb=tb: ta @ tb)
        for impl in ("kernel", "cublaslt"):
            bufs = [BufferInfo(0, "a", op, (m, k), "input"),
                    BufferInfo(1, "b", op, (k, n), "input"),
                    BufferInfo(2, "c", dt.f32, (m, n), "output")]  # fmt: skip
            call = K.LibCall("g_gemm", "gemm", {"m": m, "n": n, "k": k}, [0, 1, 2], 2)
            low = Lowered(bufs, [call], {}, {})
            name = f"gemm-call {op.name}->f32 {m}x{n}x{k} {impl}"
            try:
                cg = CompiledGraph(build_plan(low, "gemm", "cuda", gemm_impl=impl), "cuda")
                ins = {"a": a, "b": b}
                got = cg.run(ins)["c"]
                err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-9))
                kernel, wall, _ = _luminal_ms(lambda cg=cg, ins=ins: cg.run(ins), None, reps=3)
                rows.append({"name": name, "kernel_ms": kernel, "wall_ms": wall,
                             "torch_ms": torch_ms, "vs_torch": torch_ms / kernel,
                             "tflops": 2 * m * n * k / kernel / 1e9, "rel_err": err})  # fmt: skip
            except Exception as e:
                traceback.print_exc()
                rows.append({"name": name, "error": f"{type(e).__name__}: {e}"[:500]})
    return rows


def bench_attention(b: int = 1, h: int = 16, s: int = 1024, d: int = 64) -> dict[str, Any]:
    import torch

    import luminal as lm
    import luminal.functional as F

    rng = np.random.default_rng(0)
    qkv = {n: rng.standard_normal((b, h, s, d), np.float32).astype(np.float16) for n in "qkv"}
    g = lm.Graph("attention")
    ts = {n: g.weight(n, data=v).to(lm.f32) for n, v in qkv.items()}
    o = F.scaled_dot_product_attention(ts["q"], ts["k"], ts["v"], is_causal=True)
    g.output("o", o.to(lm.f16))
    cg = _compile(g)
    got = cg.run({})["o"].astype(np.float32)
    tq, tk, tv = (torch.from_numpy(qkv[n]).cuda() for n in "qkv")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    want = sdpa(tq, tk, tv, is_causal=True).float().cpu().numpy()
    err = float(np.max(np.abs(got - want)))
    kernel, wall, top = _luminal_ms(lambda: cg.run({}), None, reps=3)
    torch_ms = _torch_ms(lambda: sdpa(tq, tk, tv, is_causal=True))
    return {"name": f"attention f16 b{b} h{h} s{s} d{d} causal", "kernel_ms": kernel,
            "wall_ms": wall, "torch_ms": torch_ms, "vs_torch": torch_ms / kernel,
            "max_abs_err": err, "top_kernels": top}  # fmt: skip


def bench_decode(bw_gbs: float, layers: int = 16, ctx: int = 256) -> dict[str, Any]:
    """Llama-3.2-1B shapes (hidden 2048, 32 q / 8 kv heads, ffn 8192, vocab 128256), bf16."""
    import ml_dtypes

    from luminal.models.base import DictWeights
    from luminal.models.llama import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                      n_layers=layers, n_heads=32, n_kv_heads=8, head_dim=64,
                      rope_theta=500000.0, context_length=ctx)  # fmt: skip
    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, np.float32) * 0.02).astype(bf16)

    hd, kv = cfg.hidden_size, cfg.n_kv_heads * cfg.head_dim
    ws: dict[str, np.ndarray] = {"token_embd.weight": w(cfg.vocab_size, hd),
                                 "output_norm.weight": np.ones(hd, bf16)}  # fmt: skip
    for i in range(layers):
        p = f"blk.{i}."
        ws |= {p + "attn_norm.weight": np.ones(hd, bf16), p + "ffn_norm.weight": np.ones(hd, bf16),
               p + "attn_q.weight": w(hd, hd), p + "attn_k.weight": w(kv, hd),
               p + "attn_v.weight": w(kv, hd), p + "attn_output.weight": w(hd, hd),
               p + "ffn_gate.weight": w(cfg.intermediate_size, hd),
               p + "ffn_up.weight": w(cfg.intermediate_size, hd),
               p + "ffn_down.weight": w(hd, cfg.intermediate_size)}  # fmt: skip
    weight_bytes = sum(a.nbytes for a in ws.values())
    t = time.perf_counter()
    model = Llama(cfg, DictWeights(ws), ctx)
    cg = _compile(model.build())
    build_s = time.perf_counter() - t
    cache = model.new_cache()
    out = cg.run({"tokens": np.arange(8, dtype=np.int32), **cache}, pos=0)  # prefill 8 tokens
    cache = {n: out[n + "_new"] for n in cache}
    assert np.isfinite(out["logits"]).all(), "prefill logits are not finite"

    def step() -> None:
        cg.run({"tokens": np.array([42], np.int32), **cache}, pos=8)

    kernel, wall, top = _luminal_ms(step, None, reps=5)
    roofline_ms = weight_bytes / (bw_gbs * 1e9) * 1e3
    return {"name": f"decode llama-1B-shape bf16 ({layers} layers)", "kernel_ms": kernel,
            "wall_ms": wall, "roofline_ms": roofline_ms, "of_roofline": roofline_ms / kernel,
            "weight_gb": weight_bytes / 1e9, "build_s": build_s, "top_kernels": top,
            "steps": _steps(cg)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", default="gemm,gemm_impls,attention,decode")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    import luminal

    results: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                               "cuda_status": luminal.cuda_status()}  # fmt: skip
    results["bandwidth_gbs"] = bw = bandwidth_gbs()
    rows = []
    for name in args.only.split(","):
        fn: Any = {"gemm": bench_gemm, "gemm_impls": bench_gemm_impls, "attention": bench_attention,
              "decode": lambda: bench_decode(bw)}[name]  # fmt: skip
        t = time.perf_counter()
        try:
            got = fn()
        except Exception as e:
            traceback.print_exc()
            got = {"name": name, "error": f"{type(e).__name__}: {e}"[:500]}
        for r in got if isinstance(got, list) else [got]:
            r["seconds"] = time.perf_counter() - t
            rows.append(r)
            print(json.dumps(r), flush=True)
    results["benchmarks"] = rows
    (args.out / "bench.json").write_text(json.dumps(results, indent=1))
    print(f"\n{results['device']}: copy bandwidth {bw:.0f} GB/s")
    print(f"{'benchmark':44} {'kernel ms':>10} {'wall ms':>9} {'ref ms':>8} {'ratio':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:44} ERROR {r['error'][:60]}")
            continue
        ref = r.get("torch_ms", r.get("roofline_ms", float("nan")))
        ratio = r.get("vs_torch", r.get("of_roofline", float("nan")))
        print(f"{r['name']:44} {r['kernel_ms']:10.3f} {r['wall_ms']:9.2f} {ref:8.3f} {ratio:7.1%}")
    for r in rows:
        for t in r.get("top_kernels", []):
            print(f"  {r['name'][:30]:30} {t['kernel'][:60]:60} {t['ms']:8.3f} ms x{t['calls']:g}")
    print(json.dumps({"gpu_bench": rows, "bandwidth_gbs": bw}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
