"""The package's structure (DESIGN.md §1): imports follow the layer order, no module imports
itself back through others, and nothing in ``graph/`` or ``compiler/`` names a backend.

Imports are read from the source (module level and inside functions; ``if TYPE_CHECKING``
blocks are annotations, not dependencies)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import luminal

ROOT = Path(luminal.__file__).parent

# Layers in the order data flows; a module imports only from its own layer or earlier ones.
# The last layer is the products built on the compiler (models, loaders, the torch backend,
# the CLI, training): they may use everything.
LAYERS: list[tuple[str, ...]] = [
    ("flags", "_version", "progress", "graph"),
    ("tensor", "functional", "nn", "loaders"),
    ("compiler",),
    ("codegen",),
    ("plan",),
    ("_rt", "runtime", "cuda", "metal"),
    ("targets", "plan_cache"),
    ("compile",),
]
APPLICATION = len(LAYERS)

# backends and CPU/GPU concepts, as words (comments and docstrings included)
BACKEND_WORDS = re.compile(
    r"\b(cpu|cuda|metal|gpu|avx[\w-]*|sse\d*|neon|openblas|blas|cublas\w*|nvrtc|gcc|clang|"
    r"x86\w*|sm_\d+\w*|warp|simdgroup|threadgroup)\b",
    re.IGNORECASE,
)


def _modname(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_modname(p): p for p in ROOT.rglob("*.py")}
KNOWN = set(MODULES) | {"luminal._rt"}


def _layer(mod: str) -> int:
    parts = mod.split(".")
    top = parts[1] if len(parts) > 1 else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return APPLICATION


def _imports(mod: str) -> set[str]:
    path = MODULES[mod]
    tree = ast.parse(path.read_text())
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    typing_only = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING":
            typing_only |= {id(x) for b in n.body for x in ast.walk(b)}
    out = set()
    for n in ast.walk(tree):
        if id(n) in typing_only:
            continue
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.split(".")[0] == "luminal"}
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                src = ".".join(base + ([n.module] if n.module else []))
            else:
                src = n.module or ""
            if src.split(".")[0] != "luminal":
                continue
            for a in n.names:
                out.add(f"{src}.{a.name}" if f"{src}.{a.name}" in KNOWN else src)
    return {m for m in out if m in KNOWN and m != mod}


GRAPH = {m: _imports(m) for m in MODULES}


def test_imports_follow_the_layer_order() -> None:
    wrong = [
        f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
        for m, deps in sorted(GRAPH.items())
        for d in sorted(deps)
        if _layer(d) > _layer(m)
    ]
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("luminal.compiler.lower") < _layer("luminal.codegen.cstyle")


def test_graph_and_compiler_name_no_backend() -> None:
    hits = []
    for mod, path in sorted(MODULES.items()):
        if _layer(mod) > 2 or _layer(mod) == 1 or mod == "luminal.flags":
            continue  # graph/ and compiler/ only
        for i, line in enumerate(path.read_text().splitlines(), 1):
            m = BACKEND_WORDS.search(line)
            if m:
                hits.append(f"{path.relative_to(ROOT)}:{i}: {m.group(0)!r}: {line.strip()}")
    assert not hits, "backend names in graph/ or compiler/:\n" + "\n".join(hits)
