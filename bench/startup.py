"""Startup benchmark: how long a user waits before the first token, cold and warm.

    python bench/startup.py                     # ~5-10 minutes on 2 cores (cold compiles)
    python bench/startup.py --warm-runs 3 --skip torch_compile
    python tools/ab.py OLD NEW --bench startup.py -- --cold-all   # commits that take --json-out

Every measurement is a fresh process, as a user runs it (``python -m luminal ...``), timed
from spawn to exit with its peak RSS from ``wait4``:

- cold: ``luminal generate -n 1 "hi"`` (SmolLM2-135M-Instruct, Q4_1 GGUF) with an empty plan
  cache (a temporary ``LUMINAL_PLAN_CACHE_DIR``; the C compiler's object cache and the
  search's measurements are left as they are unless ``--cold-all``). ``cold_compile_s`` is
  the sum of its compile stages as the command reports them: the decode plan, and the
  prefill plan when the prompt reaches ``PREFILL_MIN`` tokens (the chat-templated "hi" is 31
  tokens, below it: the decode plan runs it).
- warm: the same command again, ``--warm-runs`` times: wall (median), peak RSS (max) and
  ``first_token_s``, the prefill that yields the first token (the command's own timing,
  plans already loaded from the cache).
- MiniLM: ``luminal embed "x"`` cold and warm.
- llama.cpp (llama-cpp-python): a process that loads the same GGUF and evaluates the same
  prompt tokens (luminal's tokenizer and chat template) to the first token;
  ``llamacpp_first_token_s`` runs from before the load to that token.
- torch.compile: SmolLM2's architecture in transformers (random weights: compile time does
  not depend on them), ``torch.compile`` and one forward of the prompt; ``torch_compile_s``
  is that first forward minus an eager one.

Every contender gets ``--threads`` threads; OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed
from every child's environment. Prints a table, then one JSON line (the last line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

PROMPT = "hi"
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def _env(threads: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in BLAS_OVERRIDES}
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LUMINAL_NUM_THREADS"):
        env[k] = str(threads)
    env.update(extra)
    return env


def _spawn(cmd: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Runs ``cmd``; wall seconds, peak RSS (MB), exit status, stdout and stderr."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        deadline = t0 + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        rss_kb = ru.ru_maxrss if sys.platform != "darwin" else ru.ru_maxrss // 1024
        return {"wall": wall, "rss_mb": rss_kb / 1024, "rc": p.returncode,
                "out": out.read(), "err": err.read()}  # fmt: skip


def _stage_seconds(err: str, stage: str) -> float | None:
    """Seconds of a ``luminal: <stage> ...`` line of the CLI (``... 1.2 s`` or ``done in``)."""
    for line in err.splitlines():
        if stage in line:
            m = re.search(r"(?:done in|\.\.\.) ([0-9.]+) s\s*$", line)
            if m:
                return float(m.group(1))
    return None


def _prefill_seconds(err: str) -> float | None:
    m = re.search(r"prefill (\d+) tokens in ([0-9.]+) s", err)
    return float(m.group(2)) if m else None


PYTHON = [sys.executable]  # --python: the interpreter (and flags) that runs luminal


def _luminal(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    r = _spawn([*PYTHON, "-m", "luminal", *args], env, timeout)
    if r["rc"] != 0:
        raise RuntimeError(f"luminal {' '.join(args)} failed ({r['rc']}):\n{r['err'][-2000:]}")
    return r


_LLAMACPP = r"""
import json, sys, time
ids = json.loads(sys.argv[2])
t0 = time.perf_counter()
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=1024, n_threads=int(sys.argv[3]),
            n_threads_batch=int(sys.argv[3]), verbose=False)
t1 = time.perf_counter()
llm.eval(ids)
tok = int(llm.scores[llm.n_tokens - 1].argmax())
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "first_token_s": t2 - t0, "token": tok}))
"""

_TORCH = r"""
import json, sys, time
import torch, transformers
cfg = json.loads(sys.argv[1]); ids = json.loads(sys.argv[2])
torch.set_num_threads(int(sys.argv[3])); torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
x = torch.tensor([ids])
with torch.no_grad():
    t = time.perf_counter(); model(x); eager = time.perf_counter() - t
    compiled = torch.compile(model)
    t = time.perf_counter(); compiled(x); first = time.perf_counter() - t
print(json.dumps({"eager_s": eager, "first_compiled_s": first, "compile_s": first - eager}))
"""


def _prompt_ids(path: str) -> tuple[list[int], dict[str, Any]]:
    from luminal.models import load_gguf

    model, tok = load_gguf(path, max_context=1024)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]))
    c = model.config
    hf = {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
          "intermediate_size": c.intermediate_size, "num_hidden_layers": c.n_layers,
          "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
          "head_dim": c.head_dim, "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_eps,
          "max_position_embeddings": 1024, "tie_word_embeddings": model.tied}  # fmt: skip
    return ids, hf


_EDITABLE = """
import sys, luminal
print(any("editable" in type(f).__module__ for f in sys.meta_path))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm-runs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    ap.add_argument("--cold-all", action="store_true",
                    help="cold also without the kernel object and search caches (a temporary "
                    "LUMINAL_CACHE_DIR): a first run on a new machine")  # fmt: skip
    ap.add_argument("--skip", action="append", default=[],
                    choices=["minilm", "llamacpp", "torch_compile"])  # fmt: skip
    ap.add_argument("--json-out", help="also write the JSON line to this file (tools/ab.py)")
    ap.add_argument("--python", default=sys.executable,
                    help="the command that runs luminal (e.g. another venv's python)")  # fmt: skip
    a = ap.parse_args(argv)
    PYTHON[:] = shlex.split(a.python)
    from luminal.models import smollm2_path

    gguf = smollm2_path()
    res: dict[str, Any] = {"threads": a.threads, "warm_runs": a.warm_runs, "cold_all": a.cold_all}
    # an editable install rebuilds-if-needed on import (scikit-build-core checks with CMake):
    # ~0.6 s per process that a user's `pip install .` does not pay
    r = _spawn([*PYTHON, "-c", _EDITABLE], _env(a.threads), a.timeout)
    res["editable_install"] = r["rc"] == 0 and r["out"].strip().endswith("True")
    with tempfile.TemporaryDirectory(prefix="luminal-startup-") as cache:
        env = _env(a.threads, LUMINAL_PLAN_CACHE_DIR=cache, LUMINAL_PLAN_CACHE="1")
        if a.cold_all:
            env["LUMINAL_CACHE_DIR"] = os.path.join(cache, "objects")
        gen = ["generate", "-n", "1", PROMPT]
        print("cold luminal generate (empty plan cache) ...", file=sys.stderr, flush=True)
        cold = _luminal(gen, env, a.timeout)
        stages = [_stage_seconds(cold["err"], "preparing the decode plan"),
                  _stage_seconds(cold["err"], "preparing the prefill plan")]  # fmt: skip
        res["cold_wall_s"] = cold["wall"]
        res["cold_compile_s"] = sum(s for s in stages if s is not None)
        res["cold_peak_rss_mb"] = cold["rss_mb"]
        warm = [_luminal(gen, env, a.timeout) for _ in range(a.warm_runs)]
        walls = [r["wall"] for r in warm]
        firsts = [f for r in warm if (f := _prefill_seconds(r["err"])) is not None]
        res["warm_wall_s"] = statistics.median(walls)
        res["warm_wall_min_s"], res["warm_wall_max_s"] = min(walls), max(walls)
        res["first_token_s"] = statistics.median(firsts) if firsts else None
        res["peak_rss_mb"] = max(r["rss_mb"] for r in warm)
        res["output"] = warm[-1]["out"].strip()
        if "minilm" not in a.skip:
            emb = ["embed", "x"]
            res["embed_cold_wall_s"] = _luminal(emb, env, a.timeout)["wall"]
            ew = [_luminal(emb, env, a.timeout) for _ in range(a.warm_runs)]
            res["embed_warm_wall_s"] = statistics.median(r["wall"] for r in ew)
            res["embed_peak_rss_mb"] = max(r["rss_mb"] for r in ew)
    ids, hf = _prompt_ids(gguf)
    res["prompt_tokens"] = len(ids)
    res["llamacpp_first_token_s"] = res["llamacpp_wall_s"] = res["torch_compile_s"] = None
    skipped: dict[str, str] = {}
    if "llamacpp" not in a.skip:
        r = _spawn([sys.executable, "-c", _LLAMACPP, gguf, json.dumps(ids), str(a.threads)],
                   _env(a.threads), a.timeout)  # fmt: skip
        if r["rc"] == 0:
            info = json.loads(r["out"].strip().splitlines()[-1])
            res["llamacpp_first_token_s"] = info["first_token_s"]
            res["llamacpp_wall_s"], res["llamacpp_peak_rss_mb"] = r["wall"], r["rss_mb"]
        else:
            skipped["llamacpp"] = r["err"].strip().splitlines()[-1:] or ["failed"]
    if "torch_compile" not in a.skip:
        r = _spawn([sys.executable, "-c", _TORCH, json.dumps(hf), json.dumps(ids),
                    str(a.threads)], _env(a.threads), a.timeout)  # fmt: skip
        if r["rc"] == 0:
            info = json.loads(r["out"].strip().splitlines()[-1])
            res["torch_compile_s"] = info["compile_s"]
            res["torch_eager_first_forward_s"] = info["eager_s"]
        else:
            skipped["torch_compile"] = r["err"].strip().splitlines()[-1:] or ["failed"]
    res["skipped"] = skipped

    def f(v: Any, unit: str = "s") -> str:
        return "—" if v is None else f"{v:.2f} {unit}"

    rows = [
        ("luminal cold: compile (the plans generate needs)", f(res["cold_compile_s"])),
        ("luminal cold: generate -n 1 wall", f(res["cold_wall_s"])),
        ("luminal warm: generate -n 1 wall (median)",
         f"{f(res['warm_wall_s'])} ({res['warm_wall_min_s']:.2f}-{res['warm_wall_max_s']:.2f})"),
        ("luminal warm: first token after load", f(res["first_token_s"])),
        ("luminal warm: peak RSS", f(res["peak_rss_mb"], "MB")),
        ("luminal embed 'x' cold / warm wall",
         f"{f(res.get('embed_cold_wall_s'))} / {f(res.get('embed_warm_wall_s'))}"),
        ("llama.cpp: load + first token", f(res["llamacpp_first_token_s"])),
        ("llama.cpp: process wall", f(res["llamacpp_wall_s"])),
        ("torch.compile: compile time", f(res["torch_compile_s"])),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    print(f"startup, SmolLM2-135M-Instruct Q4_1, prompt {len(ids)} tokens, {a.threads} threads")
    for name, v in rows:
        print(f"  {name:<{width}}  {v}")
    for k, why in skipped.items():
        print(f"  skipped {k}: {why}")
    if res["editable_install"]:
        print("  note: luminal is an editable install here; each process pays its rebuild "
              "check (~0.6 s). --python with a `pip install .` venv's python measures what "
              "users get")  # fmt: skip
    print(json.dumps(res))
    if a.json_out:
        with open(a.json_out, "w") as fh:
            fh.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
