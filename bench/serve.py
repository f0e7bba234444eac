"""Serving benchmark: 1, 4 and 16 concurrent streaming clients (the ``openai`` package) on
loopback against ``luminal serve`` and against llama.cpp's OpenAI-compatible server
(``llama-cpp-python[server]``) on the same GGUF with the same threads, in the same run.

    python bench/serve.py [--model FILE.gguf] [--threads 2] [--max-tokens 48]

Each level runs ``--requests`` rounds per client (bounded by ``--level-timeout`` seconds):
every client sends one streaming chat completion at a time (temperature 0, distinct
prompts). Reported per contender and level: aggregate output tok/s (tokens received by all
clients / wall time of the level), p50/p99 time to first token, p50 inter-token latency
and errors. Each client is made inside its level, and making one costs about 0.1 s under
the GIL, so the level's first requests are sent over an interval (``first_sent_max_s_16``:
when the last one went, a second or more at 16 clients). ``cold_start_s`` is luminal's
reload after an idle unload (plans from the plan cache, after the levels), read from its
``luminal_cold_start_seconds`` metric; ``first_start_s`` is the server process until it
answers (``plans_cached``: whether its plans came from the plan cache or were compiled);
RSS is taken loaded and unloaded.

Fairness: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from every server's
environment and the thread count is pinned for both (LUMINAL_NUM_THREADS,
OPENBLAS_NUM_THREADS, OMP_NUM_THREADS; llama.cpp n_threads). llama.cpp's server runs
requests one at a time (``--interrupt_requests False``: by default a new request cuts the
running one short). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LUMINAL_NUM_THREADS")
TOPICS = [
    "compilers",
    "the sea",
    "mountains",
    "a lighthouse",
    "autumn",
    "trains",
    "bees",
    "a library",
    "the moon",
    "rain",
    "a garden",
    "deserts",
    "snow",
    "rivers",
    "cities",
    "clocks",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in BLAS_OVERRIDES}
    env.update({k: str(threads) for k in THREAD_VARS})
    return env


class Proc:
    """A server subprocess; ``ready`` waits until ``probe`` answers."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: str) -> None:
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.t0 = time.perf_counter()
        self.p = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self, url: str, timeout: float) -> float:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"the server exited ({self.p.returncode}); see {self.log.name}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return time.perf_counter() - self.t0
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"no answer from {url} in {timeout:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


@dataclass
class Level:
    clients: int
    tokens: int = 0
    wall: float = 0.0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    errors: int = 0
    requests: int = 0
    # seconds into the level at which each client sent its first request: the clients are
    # made inside the level (openai.OpenAI() loads an SSL context, ~0.1 s of GIL each), so
    # at 16 clients the first requests arrive spread over a second or more
    first_sent: list[float] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall if self.wall > 0 else 0.0


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def run_level(
    base_url: str, model: str, clients: int, rounds: int, max_tokens: int, timeout: float
) -> Level:
    import openai

    lv = Level(clients)
    lock = threading.Lock()
    stop_at = time.monotonic() + timeout

    def client(k: int) -> None:
        c = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=timeout)
        with lock:
            lv.first_sent.append(time.perf_counter() - began)
        for r in range(rounds):
            if time.monotonic() > stop_at:
                return
            topic = TOPICS[(k + r * clients) % len(TOPICS)]
            msgs = [{"role": "user", "content": f"Write a long story about {topic}."}]
            t0 = time.perf_counter()
            first, last, n = None, t0, 0
            gaps: list[float] = []
            try:
                stream = c.chat.completions.create(
                    model=model, messages=msgs, stream=True, max_tokens=max_tokens, temperature=0
                )
                for chunk in stream:
                    if not chunk.choices or not chunk.choices[0].delta.content:
                        continue
                    now = time.perf_counter()
                    if first is None:
                        first = now - t0
                    else:
                        gaps.append(now - last)
                    last, n = now, n + 1
            except Exception:  # counted, not raised: the level goes on
                with lock:
                    lv.errors += 1
                continue
            with lock:
                lv.requests += 1
                lv.tokens += n
                if first is not None:
                    lv.ttft.append(first)
                lv.itl.extend(gaps)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    began = time.perf_counter()  # before the clients are made: their making is in the level
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lv.wall = time.perf_counter() - began
    return lv


def rss_mb(pid: int) -> float:
    """Resident memory of a process (Linux), MiB."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def metric(url: str, name: str) -> float | None:
    import httpx

    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.split()[-1])
    return None


ENGINE_HISTOGRAMS = {
    "luminal_decode_step_seconds": "step",
    "luminal_step_host_seconds": "host",
    "luminal_prefill_seconds": "prefill",
    "luminal_batch_size": "batch",
    "luminal_step_tokens": "rows",
}


def engine_stats(url: str) -> dict[str, float]:
    """The sums and counts of luminal's engine histograms (``<short>_sum``, ``<short>_count``)."""
    import httpx

    got: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        for full, short in ENGINE_HISTOGRAMS.items():
            for part in ("sum", "count"):
                if line.startswith(f"{full}_{part} "):
                    got[f"{short}_{part}"] = float(line.split()[-1])
    return got


def describe_level(before: dict[str, float], after: dict[str, float], wall: float) -> str:
    """Where a level's engine time went: plan steps, serial prefills and the engine thread's
    own work (means per step), and the mean sequences and rows per step."""

    def d(k: str) -> float:
        return after.get(k, 0.0) - before.get(k, 0.0)

    steps = d("step_count") or float("nan")
    return (
        f"{d('step_count'):.0f} steps: step {1e3 * d('step_sum') / steps:.1f} ms, host "
        f"{1e3 * d('host_sum') / max(d('host_count'), 1):.2f} ms per iteration, "
        f"{d('batch_sum') / steps:.1f} sequences and {d('rows_sum') / steps:.1f} rows per "
        f"step; of the {wall:.1f} s: steps {d('step_sum'):.1f} s, "
        f"{d('prefill_count'):.0f} prefills {d('prefill_sum'):.1f} s, host {d('host_sum'):.2f} s"
    )


def bench_contender(
    name: str,
    start: Callable[[], tuple[Proc, str, str]],
    a: argparse.Namespace,
    levels: list[int],
    after: Callable[[Proc, str, str], None] | None = None,
) -> dict[int, Level]:
    proc, url, model = start()
    out: dict[int, Level] = {}
    try:
        run_level(url + "/v1", model, 1, 1, 8, a.level_timeout)  # warm-up
        for c in levels:
            rounds = max(1, a.requests * 4 // c) if c < 4 else a.requests
            before = engine_stats(url) if name == "luminal" else {}
            out[c] = run_level(url + "/v1", model, c, rounds, a.max_tokens, a.level_timeout)
            lv = out[c]
            sent = f"{min(lv.first_sent):.2f}-{max(lv.first_sent):.2f}" if lv.first_sent else "-"
            print(
                f"  {name:9s} {c:3d} clients: {lv.tok_s:7.1f} tok/s ({lv.tokens} tokens, "
                f"{lv.requests} requests, {lv.errors} errors, {lv.wall:.1f} s; first "
                f"requests sent {sent} s into the level)",
                file=sys.stderr,
                flush=True,
            )
            if name == "luminal":
                print(f"    {describe_level(before, engine_stats(url), lv.wall)}", file=sys.stderr)
        if after is not None:
            after(proc, url, model)
    finally:
        proc.stop()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--requests", type=int, default=2, help="rounds per client at 4+ clients")
    p.add_argument("--levels", default="1,4,16")
    p.add_argument("--level-timeout", type=float, default=120.0)
    p.add_argument(
        "--start-timeout",
        type=float,
        default=900.0,
        help="seconds luminal may take to start (a first start compiles its plans)",
    )
    p.add_argument(
        "--f32-batch",
        default="auto",
        help="luminal serve --f32-batch (steps of N+ rows on the f32 plan; auto: measured)",
    )
    p.add_argument(
        "--step-tokens",
        type=int,
        default=64,
        help="luminal serve --step-tokens (tokens per batched step: chunked prefill)",
    )
    p.add_argument(
        "--prefill",
        choices=["chunked", "serial"],
        default="chunked",
        help="luminal serve --prefill",
    )
    p.add_argument("--no-prefix-reuse", action="store_true", help="luminal serve --no-prefix-reuse")
    p.add_argument(
        "--act-quant",
        choices=["f32", "q8"],
        default="f32",
        help="luminal serve --act-quant: activations of products by quantized weights in f32, "
        "or q8 (int8 per block of 32: llama.cpp's numerics, which its server uses too)",
    )
    p.add_argument("--idle", type=float, default=3.0, help="luminal serve --idle-unload")
    p.add_argument("--no-llamacpp", action="store_true")
    a = p.parse_args()
    from luminal.models import smollm2_path

    path = a.model or smollm2_path()
    levels = [int(x) for x in a.levels.split(",")]
    env = server_env(a.threads)
    logs = os.environ.get("TMPDIR", "/tmp")
    cold: dict[str, Any] = {}

    def luminal_cmd(port: int, idle: float) -> list[str]:
        return [
            sys.executable,
            "-m",
            "luminal.serve",
            "--model",
            path,
            "--no-embed",
            "--port",
            str(port),
            "--ctx",
            str(a.ctx),
            "--max-seqs",
            str(max(levels)),
            "--max-tokens",
            str(max(a.max_tokens, 8)),
            "--idle-unload",
            str(idle),
            "--quiet",
            "--f32-batch",
            str(a.f32_batch),
            "--step-tokens",
            str(a.step_tokens),
            "--prefill",
            a.prefill,
            *(["--no-prefix-reuse"] if a.no_prefix_reuse else []),
        ]

    # one luminal process: its first start compiles the plans unless cached (the cache key
    # holds luminal's code, so a second process would compile again after any edit); it
    # idles out only after the levels (their traffic is continuous)
    import httpx

    def start_luminal() -> tuple[Proc, str, str]:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = os.path.join(logs, "bench_serve_luminal.log")
        # what `luminal serve --act-quant` sets (python -m luminal.serve reads the variable)
        lum_env = dict(env, LUMINAL_ACT_QUANT="" if a.act_quant == "f32" else a.act_quant)
        pr = Proc(luminal_cmd(port, a.idle), lum_env, log)
        cold["first_start_s"] = pr.ready(url + "/health", a.start_timeout)
        with open(log) as fh:
            text = fh.read()
        cold["plans_cached"] = "from the plan cache" in text
        choice = [ln for ln in text.splitlines() if "f32 plan from" in ln]
        cold["f32_choice"] = choice[-1].split(": ", 2)[-1] if choice else None
        if choice:
            print(f"luminal: {cold['f32_choice']}", file=sys.stderr)
        return pr, url, httpx.get(url + "/v1/models").json()["data"][0]["id"]

    def scale_to_zero(proc: Proc, url: str, name: str) -> None:
        cold["rss_loaded_mb"] = rss_mb(proc.p.pid)
        deadline = time.monotonic() + 10 * a.idle + 30
        while httpx.get(url + "/health").json()["models"][name]["loaded"]:
            if time.monotonic() > deadline:
                raise TimeoutError("luminal did not unload after --idle-unload")
            time.sleep(0.1)
        time.sleep(0.5)
        cold["rss_unloaded_mb"] = rss_mb(proc.p.pid)
        t0 = time.perf_counter()
        run_level(url + "/v1", name, 1, 1, 4, 60)
        cold["reload_request_s"] = time.perf_counter() - t0
        cold["cold_start_s"] = metric(url, "luminal_cold_start_seconds") or float("nan")
        print(
            f"luminal: first start {cold['first_start_s']:.1f} s (plans cached: "
            f"{cold['plans_cached']}); RSS {cold['rss_loaded_mb']:.0f} MiB loaded, "
            f"{cold['rss_unloaded_mb']:.0f} MiB after the idle unload; reload "
            f"{cold['cold_start_s']:.2f} s",
            file=sys.stderr,
        )

    def start_llamacpp() -> tuple[Proc, str, str]:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            path,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--n_threads",
            str(a.threads),
            "--n_threads_batch",
            str(a.threads),
            "--n_ctx",
            str(a.ctx),
            "--model_alias",
            "smol",
            # its default interrupts the running request when another arrives: serve in turn
            "--interrupt_requests",
            "False",
        ]
        pr = Proc(cmd, env, os.path.join(logs, "bench_serve_llamacpp.log"))
        pr.ready(url + "/v1/models", 120)
        return pr, url, "smol"

    results = {"luminal": bench_contender("luminal", start_luminal, a, levels, scale_to_zero)}
    if not a.no_llamacpp:
        results["llamacpp"] = bench_contender("llama.cpp", start_llamacpp, a, levels)

    print(
        f"\nluminal serve benchmark: {os.path.basename(path)}, {a.threads} threads, "
        f"{a.max_tokens} tokens per request, loopback (a shared, loaded machine)"
    )
    print(
        f"{'server':10s} {'clients':>7s} {'tok/s':>8s} {'ttft p50':>9s} {'ttft p99':>9s} "
        f"{'itl p50':>8s} {'errors':>6s}"
    )
    for who, res in results.items():
        for c, lv in res.items():
            print(
                f"{who:10s} {c:7d} {lv.tok_s:8.1f} {1e3 * _pct(lv.ttft, 0.5):7.0f}ms "
                f"{1e3 * _pct(lv.ttft, 0.99):7.0f}ms {1e3 * _pct(lv.itl, 0.5):6.1f}ms "
                f"{lv.errors:6d}"
            )
    lum = results["luminal"]
    hi, lo = max(levels), min(levels)
    summary: dict[str, Any] = {
        "bench": "serve",
        "model": os.path.basename(path),
        "threads": a.threads,
        "max_tokens": a.max_tokens,
        "f32_batch": a.f32_batch,
        "step_tokens": a.step_tokens,
        "prefill": a.prefill,
        "prefix_reuse": not a.no_prefix_reuse,
        "act_quant": a.act_quant,
        f"agg_tok_s_{hi}": round(lum[hi].tok_s, 1),
        f"agg_tok_s_{lo}": round(lum[lo].tok_s, 1),
        f"ttft_p50_ms_{hi}": round(1e3 * _pct(lum[hi].ttft, 0.5), 1),
        f"ttft_p99_ms_{hi}": round(1e3 * _pct(lum[hi].ttft, 0.99), 1),
        f"itl_p50_ms_{hi}": round(1e3 * _pct(lum[hi].itl, 0.5), 2),
        f"first_sent_max_s_{hi}": round(max(lum[hi].first_sent, default=float("nan")), 2),
        "errors": sum(lv.errors for res in results.values() for lv in res.values()),
        "cold_start_s": round(cold["cold_start_s"], 3),
        "reload_request_s": round(cold["reload_request_s"], 2),
        "first_start_s": round(cold["first_start_s"], 1),
        "plans_cached": cold["plans_cached"],
        "f32_choice": cold["f32_choice"],
        "rss_loaded_mb": round(cold["rss_loaded_mb"], 1),
        "rss_unloaded_mb": round(cold["rss_unloaded_mb"], 1),
    }
    for c in levels:
        summary[f"agg_tok_s_{c}"] = round(lum[c].tok_s, 1)
    if "llamacpp" in results:
        ll = results["llamacpp"]
        for c in levels:
            summary[f"llamacpp_agg_tok_s_{c}"] = round(ll[c].tok_s, 1)
        summary[f"llamacpp_ttft_p50_ms_{hi}"] = round(1e3 * _pct(ll[hi].ttft, 0.5), 1)
        summary[f"ratio_vs_llamacpp_{hi}"] = round(lum[hi].tok_s / max(ll[hi].tok_s, 1e-9), 2)
    summary[f"scaling_{hi}_over_{lo}"] = round(lum[hi].tok_s / max(lum[lo].tok_s, 1e-9), 2)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
