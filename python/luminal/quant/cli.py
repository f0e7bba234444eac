"""``luminal quantize IN.gguf|DIR -o OUT.gguf --type TYPE``: the command line of ``quant.api``.

The input is a GGUF file or a transformers folder (config.json, *.safetensors, tokenizer.json;
model types llama, mistral, qwen2), which is converted as llama.cpp's converter does first.

``add_arguments(parser)`` fills an argparse (sub)parser; ``main(args)`` runs it and returns
the exit status. Bad input raises ValueError / FileNotFoundError / RuntimeError with a message
naming what was wrong (the luminal CLI prints those as errors).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from . import api


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "input",
        help="a GGUF model file (any type luminal reads) or a transformers folder "
        f"(config.json, *.safetensors, tokenizer.json; model_type {', '.join(api.hf.ARCHS)})",
    )
    p.add_argument("-o", "--output", required=True, help="the GGUF file to write")
    p.add_argument(
        "--type",
        required=True,
        choices=api.TYPES,
        metavar="TYPE",
        help="target weight type: " + ", ".join(api.TYPES),
    )
    p.add_argument(
        "--embed-type",
        choices=[t for t in api.TYPES if api.llama_cpp_reads(t) or t in api.lowp.FORMATS],
        metavar="TYPE",
        help="another type for the token embedding and output head (e.g. q8_0 with a 4-bit "
        "--type, as llama.cpp's mixes do)",
    )
    p.add_argument(
        "--scales",
        choices=api.lowp.SCALES,
        default="mse",
        help="how luminal's formats (and mxfp4) choose their scales: mse, the least squared "
        "error among candidates around the amax rule's (default); amax, the format's own rule",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="a text file: calibrate luminal's quantizers on the model's activations over it "
        "(GPTQ: each matrix's output error, not its weight error, is minimised; llama-family "
        "models)",
    )
    p.add_argument(
        "--calib-tokens",
        type=int,
        default=api.calibrate.CALIB_TOKENS,
        metavar="N",
        help=f"calibrate on the first N tokens of the text (default {api.calibrate.CALIB_TOKENS})",
    )
    p.add_argument(
        "--calib-damp",
        type=float,
        default=api.calibrate.DAMP,
        metavar="D",
        help=f"damping added to X^T X's diagonal, relative to its mean (default "
        f"{api.calibrate.DAMP}; more: closer to round to nearest, less fitted to the text)",
    )
    p.add_argument(
        "--calib-method",
        choices=api.calibrate.METHODS,
        default=api.calibrate.METHOD,
        help="with --calibration: gptq (error feedback), awq (activation-aware input scales "
        "folded into the norms / v / up rows, then round to nearest) or awq+gptq (both, the "
        "default)",
    )
    p.add_argument(
        "--calib-act-order",
        action="store_true",
        help="GPTQ quantizes each matrix's columns loudest input first (group scales fixed "
        "beforehand)",
    )
    p.add_argument(
        "--no-calib-importance",
        dest="calib_importance",
        action="store_false",
        help="with --calibration: choose mse scales by the plain squared weight error instead "
        "of weighing each column by its inputs",
    )
    p.add_argument(
        "--keep-sensitive",
        type=float,
        default=0.0,
        metavar="FRAC",
        help="with --calibration: store this fraction of the matrices' weights as --keep-type, "
        "the matrices whose rounding alone costs the most (KL per weight, measured on the "
        "calibration text)",
    )
    p.add_argument(
        "--keep-type",
        default="q8_0",
        choices=[t for t in api.TYPES if t not in api._LLAMA_CPP],
        metavar="TYPE",
        help="the type of the matrices --keep-sensitive keeps (default q8_0)",
    )
    p.add_argument(
        "--rotate",
        nargs="?",
        const=api.rotate.KIND,
        choices=api.rotate.KINDS,
        metavar="KIND",
        help="first rotate the residual stream by an orthogonal matrix (llama-family models; "
        "the norm weights folded into the linears; the same model in f32, fewer outlier "
        f"channels for the formats): {' or '.join(api.rotate.KINDS)} "
        f"(default {api.rotate.KIND})",
    )
    p.add_argument(
        "--rotate-loud",
        type=float,
        default=api.rotate.LOUD,
        metavar="R",
        help="with --rotate: leave out of the rotation the residual channels whose mean square "
        "(over the calibration text, or luminal's shipped one) is above R times the median "
        f"channel's (default {api.rotate.LOUD:g}; 0: rotate every channel)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def main(args: argparse.Namespace) -> int:
    if os.path.exists(args.output) and not args.force:
        raise ValueError(f"{args.output} exists (--force overwrites it)")
    calibration = None if args.calibration is None else pathlib.Path(args.calibration)  # a file
    res = api.quantize(args.input, args.output, args.type, args.embed_type, quiet=args.quiet,
                       scales=args.scales, calibration=calibration,
                       calib_tokens=args.calib_tokens, calib_damp=args.calib_damp,
                       calib_method=args.calib_method,
                       calib_act_order=args.calib_act_order,
                       calib_importance=args.calib_importance,
                       keep_sensitive=args.keep_sensitive,
                       keep_type=args.keep_type,
                       rotate=args.rotate or False,
                       rotate_loud=args.rotate_loud)  # fmt: skip
    info = api.describe(res)
    if args.json:
        print(json.dumps(info))
    else:
        counts = ", ".join(f"{n} {t}" for t, n in sorted(info["tensors"].items()))
        err = "" if res.error is None else f", weight error {100 * res.error:.2f}% (relative RMS)"
        print(f"{res.path}: {res.qtype}, {res.size / 2**20:.1f} MiB, {counts}{err} "
              f"({res.seconds:.1f} s)")  # fmt: skip
        if res.calibration is not None:
            c = res.calibration
            print(f"  calibrated {c['matrices']} matrices on {c['tokens']} tokens ({c['method']})")
            if "keep" in c:
                k = c["keep"]
                print(f"  kept {len(k['matrices'])} sensitive matrices as {k['type']}")
        if res.rotation is not None:
            r = res.rotation
            heads = ", value heads too" if r["heads"] else ""
            print(
                f"  rotated the residual stream ({r['kind']}, seed {r['seed']}{heads}); "
                f"{len(r['kept'])} loud channels left alone: {r['kept']}"
            )
            if r["untied_head"]:
                out = api.GGUFFile(res.path)
                extra = sum(t.n_bytes for n, t in out.tensors.items()
                            if n == "output.weight" or n.startswith("output.weight."))  # fmt: skip
                print(f"  output head untied from the embedding (the final norm's weight folded "
                      f"into it): +{extra / 2**20:.1f} MiB")  # fmt: skip
        if res.kept_f32:
            print(f"  kept f32 (row length not a multiple of the block): {res.kept_f32}")
        if not api.llama_cpp_reads(res.qtype, res.embed_type):
            print("  a luminal-format file: luminal runs it, llama.cpp does not", file=sys.stderr)
    return 0


def run(argv: list[str] | None = None) -> int:
    """``python -m luminal.quant.cli ...`` (the same as ``luminal quantize ...``)."""
    p = argparse.ArgumentParser(prog="luminal quantize", description=__doc__)
    add_arguments(p)
    try:
        return main(p.parse_args(argv))
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"luminal quantize: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(run())
