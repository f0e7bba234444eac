"""``python -m luminal.plan show FILE.lmp``: print a plan."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from . import Plan, PlanError


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "show":
        print("usage: python -m luminal.plan show FILE.lmp", file=sys.stderr)
        return 2
    try:
        print(Plan.load(args[1]).describe())
    except (OSError, PlanError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
