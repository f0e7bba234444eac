"""``python -m luminal.serve``: the ``luminal serve`` command on its own."""

from __future__ import annotations

import argparse
import sys

from .cli import add_arguments, main


def _run() -> int:
    p = argparse.ArgumentParser(
        prog="luminal serve", description="An OpenAI-compatible server (docs/serving.md)"
    )
    add_arguments(p)
    args = p.parse_args()
    try:
        return main(args)
    except (FileNotFoundError, ValueError, NotImplementedError, RuntimeError) as e:
        print(f"luminal serve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(_run())
