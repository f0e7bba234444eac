"""The plan cache (luminal.plan_cache): a hit loads what a miss compiled; every key part,
changed, misses; damaged entries are dropped and rebuilt, never run; concurrent builders of one
key build it once; the size limit evicts the least recently used; the off switch and the
``luminal cache`` command; weights of mapped files are stored as references to the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import luminal
from luminal import plan_cache as pc
from luminal.loaders.safetensors import SafetensorsFile, save_safetensors
from luminal.models.base import CachedPlan, Runner
from luminal.plan import FileWeight, InlineWeight, Plan


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "plans"
    monkeypatch.setenv("LUMINAL_PLAN_CACHE_DIR", str(d))
    monkeypatch.delenv("LUMINAL_PLAN_CACHE", raising=False)
    return d


def _graph(
    w: np.ndarray, hi: int = 64, scale: float = 2.0, name: str = "t", rows: bool = False
) -> luminal.Graph:
    """``scale * x @ w``; ``rows``: ``w`` is stored (out, in), read contiguously along the sum
    (the compiler keeps such a weight as it is, where it stores an (in, out) one transposed)."""
    g = luminal.Graph(name)
    x = g.input("x", (luminal.dim("seq", 1, hi), w.shape[1] if rows else w.shape[0]))
    wt = g.weight("w", data=w)
    g.output("y", x.matmul(wt.permute(1, 0) if rows else wt).mul(scale))
    return g


def _w(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((7, 5)).astype(np.float32)


def _key(g: luminal.Graph, backend: str = "cpu", **options: object) -> pc.Key:
    return pc.make_key(pc.graph_fingerprint(g), backend, {"search": False, **options})


def _build(g: luminal.Graph, log: list[str]) -> object:
    def build() -> tuple[Plan, dict[str, np.ndarray]]:
        log.append(g.name)
        return luminal.compile(g, search=False, cache=False).plan, dict(g.weights)

    return build


def test_hit_loads_what_the_miss_compiled() -> None:
    w, log = _w(), []
    cache = pc.PlanCache()
    path, built = cache.get_or_build(_key(_graph(w)), _build(_graph(w), log))
    assert built is not None and path.is_file() and log == ["t"]
    # a graph built again the same way has the same key: no compile
    again, built2 = cache.get_or_build(_key(_graph(w)), _build(_graph(w), log))
    assert again == path and built2 is None and log == ["t"]
    x = np.random.default_rng(1).standard_normal((3, 7)).astype(np.float32)
    y = luminal.load(str(path)).run({"x": x})["y"]
    np.testing.assert_allclose(y, 2 * x @ w, rtol=1e-5, atol=1e-5)
    (e,) = cache.entries()
    assert e.digest == path.stem and e.name == "t" and e.size == path.stat().st_size


def test_every_key_part_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _w()
    base = _key(_graph(w)).digest
    assert _key(_graph(w)).digest == base  # deterministic
    w2 = w.copy()
    w2[3, 4] += 1e-3
    changed = {
        "graph structure": _key(_graph(w, scale=3.0)),
        "graph name": _key(_graph(w, name="u")),
        "dim bounds": _key(_graph(w, hi=65)),
        "weight bytes": _key(_graph(w2)),
        "compile options": _key(_graph(w), search=True),
        "target": _key(_graph(w), backend="cuda"),
    }
    with monkeypatch.context() as m:
        m.setenv("LUMINAL_SEARCH_SCHEDULES", "0")
        changed["compiler flag"] = _key(_graph(w))
    with monkeypatch.context() as m:
        m.setattr(pc, "__version__", "9.9.9")
        changed["luminal version"] = _key(_graph(w))
    with monkeypatch.context() as m:
        m.setattr(pc, "_CODE_ID", "edited-compiler")
        changed["luminal code"] = _key(_graph(w))
    with monkeypatch.context() as m:
        m.setattr(pc, "_CPU_ID", "another-cpu")
        changed["cpu features"] = _key(_graph(w))
    with monkeypatch.context() as m:
        m.setenv("LUMINAL_DEBUG", "1")  # says more, compiles the same
        assert _key(_graph(w)).digest == base
    for part, k in changed.items():
        assert k.digest != base, part
    assert len({k.digest for k in changed.values()}) == len(changed)


def test_weight_file_identity_is_the_key(tmp_path: Path) -> None:
    """A weight mapped from a safetensors file is named by the file (not hashed); rewriting
    the file misses, and a plan referring to it is dropped when the file changes."""
    f = tmp_path / "w.safetensors"
    save_safetensors(f, {"w": _w()})
    st = SafetensorsFile(f)
    ident = pc.weight_identity(st["w"])
    assert ident[2] == "file" and ident[3] == os.path.realpath(f)
    k1 = _key(_graph(st["w"], rows=True))
    cache, log = pc.PlanCache(), []
    path, _ = cache.get_or_build(k1, _build(_graph(st["w"], rows=True), log))
    plan = Plan.load(path)
    assert [type(x) for x in plan.weights] == [FileWeight]  # referred to, not copied
    x = np.ones((2, 5), np.float32)
    got = luminal.load(str(path)).run({"x": x})["y"]
    np.testing.assert_allclose(got, 2 * x @ _w().T, rtol=1e-5)
    del st, plan
    time.sleep(0.01)
    save_safetensors(f, {"w": _w(1)})  # same size, new bytes and mtime
    st = SafetensorsFile(f)
    k2 = _key(_graph(st["w"], rows=True))
    assert k2.digest != k1.digest
    assert cache.lookup(k1) is None and not path.exists()  # its file changed: dropped


@pytest.mark.parametrize(
    "damage", ["truncate", "flip", "flip-old-mtime", "bad-json", "no-plan", "other-key"]
)
def test_damaged_entries_are_rebuilt_never_run(damage: str) -> None:
    w, log = _w(), []
    cache = pc.PlanCache()
    key = _key(_graph(w))
    path, _ = cache.get_or_build(key, _build(_graph(w), log))
    meta = path.with_suffix(".json")
    data = bytearray(path.read_bytes())
    time.sleep(0.02)  # past the file clock's tick: a change shows in the file's times
    if damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif damage.startswith("flip"):
        st = path.stat()
        data[len(data) - 3] ^= 0x40  # inside the weight bytes: only the checksum sees it
        path.write_bytes(bytes(data))
        if damage == "flip-old-mtime":  # the ctime still moves
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif damage == "bad-json":
        meta.write_text("{not json")
    elif damage == "no-plan":
        path.unlink()
    else:
        m = json.loads(meta.read_text())
        m["key"]["backend"] = "metal"
        meta.write_text(json.dumps(m))
    assert cache.lookup(key) is None
    assert not meta.exists()  # dropped
    again, built = cache.get_or_build(key, _build(_graph(w), log))
    assert built is not None and log == ["t", "t"] and cache.lookup(key) == again
    x = np.ones((1, 7), np.float32)
    np.testing.assert_allclose(luminal.load(str(again)).run({"x": x})["y"], 2 * x @ w, rtol=1e-5)


def test_large_made_weights_go_to_a_mapped_weights_file() -> None:
    """A weight the plan holds itself (here: in memory, not from a file) and 64 KiB or more is
    stored once in the entry's weights file, which the runtime maps; damage to that file
    drops the entry."""
    w = np.random.default_rng(4).standard_normal((7, 3000)).astype(np.float32)  # 84 KB
    g, log = _graph(w), []
    cache = pc.PlanCache()
    path, _ = cache.get_or_build(_key(g), _build(g, log))
    wfile = path.with_suffix(".weights")
    assert wfile.stat().st_size == w.nbytes and path.stat().st_size < w.nbytes
    (fw,) = Plan.load(path).weights
    assert isinstance(fw, FileWeight) and fw.path == wfile.name  # relative: the cache may move
    x = np.random.default_rng(5).standard_normal((2, 7)).astype(np.float32)
    ref = 2 * x @ w
    np.testing.assert_allclose(
        luminal.load(str(path)).run({"x": x})["y"], ref, rtol=1e-4, atol=1e-5
    )
    cg = luminal.compile(_graph(w), search=False)
    cg2 = luminal.compile(_graph(w), search=False)  # from the cache, via CompiledGraph.from_file
    assert cg2.path is not None and os.path.isabs(cg2.plan.weights[0].path)
    np.testing.assert_allclose(cg2.run({"x": x})["y"], cg.run({"x": x})["y"], rtol=1e-5, atol=1e-5)
    saved = path.parent.parent / "saved.lmp"
    cg2.save(saved)  # self-contained: the cache's files may go
    assert [type(x) for x in Plan.load(saved).weights] == [InlineWeight]
    sizes = [e.size for e in cache.entries() if e.path == path]
    assert sizes == [path.stat().st_size + wfile.stat().st_size]
    time.sleep(0.02)
    data = bytearray(wfile.read_bytes())
    data[100] ^= 1
    wfile.write_bytes(bytes(data))
    assert cache.lookup(_key(g)) is None and not wfile.exists() and not path.exists()
    _, built = cache.get_or_build(_key(g), _build(g, log))
    assert built is not None and log == ["t", "t"]
    cache.clear()
    np.testing.assert_allclose(
        luminal.load(str(saved)).run({"x": x})["y"], ref, rtol=1e-4, atol=1e-5
    )


def test_touched_entry_is_checksummed_once() -> None:
    """A plan whose file times changed but whose bytes did not is still a hit; its new
    times are recorded, so the next lookup reads nothing."""
    g, log = _graph(_w()), []
    cache = pc.PlanCache()
    path, _ = cache.get_or_build(_key(g), _build(g, log))
    time.sleep(0.02)
    os.utime(path)
    calls = []
    real = pc._crc32_file
    pc._crc32_file = lambda *a: calls.append(1) or real(*a)  # type: ignore[assignment]
    try:
        assert cache.lookup(_key(g)) == path and calls == [1]
        assert cache.lookup(_key(g)) == path and calls == [1]
    finally:
        pc._crc32_file = real
    assert log == ["t"]


def test_size_limit_evicts_least_recently_used() -> None:
    cache = pc.PlanCache()
    paths = []
    for i in range(3):
        g = _graph(_w(i))
        p, _ = cache.get_or_build(_key(g), _build(g, []))
        os.utime(p.with_suffix(".json"), (time.time() - 100 + i, time.time() - 100 + i))
        paths.append(p)
    assert cache.lookup(_key(_graph(_w(0)))) == paths[0]  # used now: the newest
    size = paths[0].stat().st_size
    small = pc.PlanCache(limit_bytes=2 * size)
    removed = small.evict()
    assert removed == [paths[1].stem]  # the least recently used one
    assert paths[0].exists() and not paths[1].exists() and paths[2].exists()
    g = _graph(_w(5))
    p5, _ = pc.PlanCache(limit_bytes=0).get_or_build(_key(g), _build(g, []))
    assert [e.path for e in cache.entries()] == [p5]  # a new entry is never its own victim
    with pytest.raises(ValueError, match=">= 0"):
        pc.PlanCache(limit_bytes=-1)


def test_concurrent_processes_build_once(tmp_path: Path) -> None:
    """Two processes miss the same key at once: one compiles, the other waits and loads."""
    log = tmp_path / "builds.txt"
    script = textwrap.dedent(f"""
        import sys, time, numpy as np, luminal
        from luminal import plan_cache as pc
        g = luminal.Graph("race")
        x = g.input("x", (luminal.dim("seq", 1, 8), 3))
        g.output("y", x.mul(g.weight("w", data=np.arange(3, dtype=np.float32))))
        key = pc.make_key(pc.graph_fingerprint(g), "cpu", {{}})
        def build():
            with open({str(log)!r}, "a") as f:
                f.write("built\\n")
            time.sleep(1.0)
            return luminal.compile(g, search=False, cache=False).plan
        path, _ = pc.PlanCache().get_or_build(key, build)
        y = luminal.load(str(path)).run({{"x": np.ones((2, 3), np.float32)}})["y"]
        assert y.tolist() == [[0, 1, 2], [0, 1, 2]], y
        print(path)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert outs[0][0] == outs[1][0]
    assert log.read_text() == "built\n"
    assert not list(Path(os.environ["LUMINAL_PLAN_CACHE_DIR"]).glob("*.tmp"))


def test_luminal_compile_loads_a_cached_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """``luminal.compile`` of a graph built again (same structure and weights) runs no
    pipeline: the plan comes from the cache and computes the same; ``cache=False`` compiles."""
    mod = sys.modules["luminal.compile"]
    runs: list[str] = []
    real = mod._compile
    monkeypatch.setattr(mod, "_compile", lambda g, *a: runs.append(g.name) or real(g, *a))
    w = _w()
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(np.float32)
    first = luminal.compile(_graph(w), search=False)
    again = luminal.compile(_graph(w), search=False)
    assert runs == ["t"] and first.path is None and again.path is not None
    np.testing.assert_array_equal(again.run({"x": x})["y"], first.run({"x": x})["y"])
    assert again.kernels == first.kernels
    luminal.compile(_graph(w), search=True)  # other options: compiled
    luminal.compile(_graph(w), search=False, cache=False)
    assert runs == ["t", "t", "t"]


def test_runner_skips_building_on_a_hit() -> None:
    w = _w()
    built: list[int] = []

    def build() -> luminal.Graph:
        built.append(1)
        return _graph(w)

    key = {"model": "test", "w": pc.weight_identity(w)}
    r1 = Runner(build, "compiled", key=key, name="t")
    r2 = Runner(build, "compiled", key=key, name="t")
    assert built == [1] and r1.compiles == 1 and r2.compiles == 0 and r2.cached
    assert r2.graph is None and isinstance(r2._plan, CachedPlan)
    x = np.random.default_rng(3).standard_normal((4, 7)).astype(np.float32)
    np.testing.assert_allclose(r2({"x": x})["y"], r1({"x": x})["y"], rtol=1e-6)
    np.testing.assert_allclose(r2({"x": x})["y"], 2 * x @ w, rtol=1e-5, atol=1e-5)
    r3 = Runner(build, "interp", key=key)  # the interpreter needs the graph
    assert built == [1, 1] and r3.graph is not None


def test_off_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUMINAL_PLAN_CACHE", "0")
    assert pc.default_cache() is None
    w = _w()
    key = {"model": "test", "w": pc.weight_identity(w)}
    runners = [Runner(lambda: _graph(w), "compiled", key=key) for _ in range(2)]
    assert [r.compiles for r in runners] == [1, 1]
    assert not Path(os.environ["LUMINAL_PLAN_CACHE_DIR"]).exists()
    monkeypatch.setenv("LUMINAL_PLAN_CACHE", "maybe")
    with pytest.raises(ValueError, match="LUMINAL_PLAN_CACHE"):
        pc.enabled()


def test_cache_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from luminal.cli import main

    monkeypatch.setenv("LUMINAL_CACHE_DIR", str(tmp_path / "kernels"))  # clear empties it

    g = _graph(_w())
    path, _ = pc.PlanCache().get_or_build(_key(g), _build(g, []))
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "1 plans" in out and path.stem in out and " t" in out
    assert "compiled kernels" in out
    # compiled kernels and search decisions beside the plans go with them
    base = tmp_path / "kernels"
    (base / "search").mkdir(parents=True, exist_ok=True)
    (base / "cpu-0123.so").write_bytes(b"x")
    (base / "search" / "d.json").write_text("{}")
    from luminal.models import crossing  # measured choices between plans: measured again

    crossing.write_memo("measured/prefill_split.json", "k", {"from": 40})
    assert crossing.read_memo("measured/prefill_split.json")
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 cached plan " in out and "compiled-kernel and search-decision files" in out
    assert not path.exists() and pc.PlanCache().entries() == []
    assert not (base / "cpu-0123.so").exists() and not (base / "search" / "d.json").exists()
    assert crossing.read_memo("measured/prefill_split.json") == {}
    assert main(["cache"]) == 0 and "0 plans" in capsys.readouterr().out


def test_kernel_cache_evicts_the_longest_unused(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:  # fmt: skip
    """Past the kernel cache's limit the libraries unused longest go, never one used within
    the last hour (a process may be about to load it); other files stay."""
    monkeypatch.setenv("LUMINAL_CACHE_DIR", str(tmp_path))
    now = time.time()
    ages = {"cpu-a.so": 3, "cpu-b.ref": 2, "cpu-group-c.so": 5, "cpu-d.so": 0.1}
    for name, hours in ages.items():
        (tmp_path / name).write_bytes(b"x" * 1000)
        os.utime(tmp_path / name, (now - hours * 3600, now - hours * 3600))
    (tmp_path / "pch-1.h").write_bytes(b"x" * 5000)  # the prelude: not a kernel
    (tmp_path / "search").mkdir()
    assert pc.evict_kernels(limit_bytes=10_000) == []  # under the limit
    gone = pc.evict_kernels(limit_bytes=1500)
    assert [Path(p).name for p in gone] == ["cpu-group-c.so", "cpu-a.so", "cpu-b.ref"]
    kept = ["cpu-d.so", "kernels-checked", "pch-1.h", "search"]
    assert sorted(p.name for p in tmp_path.iterdir()) == kept
    assert pc.evict_kernels(limit_bytes=0) == []  # used within the hour: kept
    monkeypatch.setenv("LUMINAL_KERNEL_CACHE_MB", "0")
    os.utime(tmp_path / "cpu-d.so", (now - 7200, now - 7200))
    g = _graph(_w())
    store = pc.PlanCache(tmp_path / "plans")
    store.get_or_build(_key(g), _build(g, []))  # looked at the kernels a moment ago: not again
    assert (tmp_path / "cpu-d.so").exists()
    os.utime(tmp_path / "kernels-checked", (now - 7200, now - 7200))
    store.evict()  # as each store does
    assert not (tmp_path / "cpu-d.so").exists()


def test_search_decisions_are_keyed_by_the_renderer(tmp_path: Path) -> None:
    # the tuner's decisions compare kernel IR; the same IR rendered by edited code is another
    # program, so each target's cache id names the renderer's files
    (tmp_path / "codegen").mkdir()
    src = tmp_path / "codegen" / "kernel.py"
    src.write_text("A = 1\n")
    before = pc._digest([str(tmp_path / "codegen")])
    assert pc._digest([str(tmp_path / "codegen")]) == before
    src.write_text("A = 12\n")
    assert pc._digest([str(tmp_path / "codegen")]) != before
    for name in ("cpu", "cuda", "metal"):
        assert luminal.targets.get(name).cache_id().endswith(pc.render_id()), name
