"""Old against new main in one sitting: each commit installed as pip installs it (its own venv,
its own caches), its own benchmark scripts run alternately, the JSON lines compared.

    python tools/ab.py 54b00c2 HEAD                       # bench/llm.py and bench/kernels.py
    python tools/ab.py OLD NEW --bench llm.py --runs 2 -- --skip torch_compile

Every benchmark compares luminal with its contenders in the same process run, so the ratios
(``*_vs_*``) are what to compare between commits; absolute numbers move with the machine's
load. Runs alternate (old, new, then new, old, ...) so that load drifting over the sitting hits
both alike. Arguments after ``--`` go to every benchmark run (the script names must accept
them in both commits). The work folder keeps the builds, so a second call reuses them.

Each venv gets the commit with its ``bench`` extras plus this checkout's ``bench`` extras (an
old commit may list fewer contenders) and ``--torch`` (pinned by default: an unpinned torch can
pull a multi-GB CUDA build). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def _bench_extras() -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise SystemExit("tools/ab.py needs Python 3.11 or later (tomllib)") from None
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"].get("bench", []))


def build(rev: str, work: Path, torch_spec: str) -> tuple[str, Path, Path]:
    """The commit's sources and a venv with it installed: (short sha, source dir, python)."""
    sha = _git("rev-parse", "--short=10", f"{rev}^{{commit}}")
    src, venv = work / f"src-{sha}", work / f"venv-{sha}"
    py = venv / "bin" / "python"
    if not (src / "pyproject.toml").exists():
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha], check=True,
                                 capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    if not (venv / "installed").exists():
        print(f"ab: building {rev} ({sha}) into {venv} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, torch_spec], check=True)
        subprocess.run([*pip, f"{src}[bench]", *_bench_extras()], check=True)
        (venv / "installed").write_text(sha + "\n")
    return sha, src, py


def run_one(sha: str, src: Path, py: Path, bench: str, work: Path, extra: list[str],
            i: int) -> dict[str, object]:  # fmt: skip
    out = work / f"{Path(bench).stem}-{sha}-{i}.json"
    log = out.with_suffix(".log")
    env = {**os.environ, "LUMINAL_CACHE_DIR": str(work / f"cache-{sha}")}
    env.pop("PYTHONPATH", None)
    cmd = [str(py), str(src / "bench" / bench), "--json-out", str(out), *extra]
    print(f"ab: {sha} {bench} run {i + 1} (load {os.getloadavg()[0]:.1f}) ...", file=sys.stderr,
          flush=True)  # fmt: skip
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=src, env=env, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0 or not out.exists():
        raise SystemExit(f"ab: {' '.join(cmd)} failed (exit {r.returncode}); see {log}")
    # the summary is the file's last line (bench/quant.py writes its details on a line above)
    return json.loads(out.read_text().strip().splitlines()[-1])


def _numbers(d: dict[str, object], prefix: str = "") -> dict[str, float]:
    """The JSON's numbers, nested objects' as dotted keys (``kernels.softmax.vs_best``)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + k] = float(v)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--bench", action="append", help="script under bench/ (default: llm.py, "
                   "kernels.py)")  # fmt: skip
    p.add_argument("--runs", type=int, default=1, help="runs per commit and script")
    p.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                  "luminal-ab"))  # fmt: skip
    p.add_argument("--torch", default="torch==2.13.0", help="pip spec of torch")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = p.parse_args(argv[:cut])
    a.extra = argv[cut + 1 :]
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    sides = [build(rev, work, a.torch) for rev in (a.old, a.new)]
    summary: dict[str, object] = {"old": sides[0][0], "new": sides[1][0], "runs": a.runs}
    for bench in a.bench or ["llm.py", "kernels.py"]:
        got: list[list[dict[str, float]]] = [[], []]
        for i in range(a.runs):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for s in order:
                got[s].append(_numbers(run_one(*sides[s], bench, work, a.extra, i)))
        keys = [k for k in got[1][0] if all(k in r for side in got for r in side)]
        print(
            f"\n{bench}: {sides[0][0]} (old) vs {sides[1][0]} (new), {a.runs} run(s) each; "
            "medians; ratios (*_vs_*) are luminal against contenders in the same run"
        )
        print(f"{'key':<48} {'old':>12} {'new':>12} {'new/old':>8}")
        rows = {}
        for k in keys:
            o = statistics.median(r[k] for r in got[0])
            n = statistics.median(r[k] for r in got[1])
            rel = n / o if o else None
            rows[k] = {"old": o, "new": n, "new_over_old": rel}
            print(f"{k:<48} {o:>12.4g} {n:>12.4g} {rel if rel is not None else '-':>8.3}")
        summary[Path(bench).stem] = rows
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
