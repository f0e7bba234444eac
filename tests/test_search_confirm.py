"""Close calls of the measured search are measured again, in turns, before one is kept.

The measure functions here stand in for a shared machine: a candidate's first measurement
can land in a burst of another process's work and read slower than the candidate runs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import luminal as lm
from luminal.compiler.lower import lower
from luminal.compiler.search import tuner as T


def _low():
    g = lm.Graph("confirm")
    x = g.input("x", (5, 7))
    g.output("y", x.exp())
    return lower(g)


def _search(monkeypatch, tmp_path, confirm, times, costs=(1.0, 1.0)):
    """The label kept among "a" and "b" (the reference) and the labels measured in turn;
    ``times[label]`` lists its successive timings, the last one repeating."""
    # each search its own cache: a decision cached on disk would be answered unmeasured
    monkeypatch.setenv("LUMINAL_CACHE_DIR", str(tmp_path / f"c{len(list(tmp_path.iterdir()))}"))
    monkeypatch.setenv("LUMINAL_SEARCH_CONFIRM", str(confirm))
    T.clear_memory_cache()
    low = _low()
    subs = {"a": replace(low), "b": replace(low)}
    seen: list[str] = []

    def measure(sub, dims):
        label = "a" if sub is subs["a"] else "b"
        seen.append(label)
        runs = times[label]
        return runs[min(seen.count(label) - 1, len(runs) - 1)]

    tuner = T.Tuner(measure, "confirm-test")
    cands = [T.Candidate("b", subs["b"], costs[1]), T.Candidate("a", subs["a"], costs[0])]
    return tuner.choose("k", "test", {}, subs["b"], cands).label, seen


def test_a_candidate_measured_in_a_burst_is_measured_again(monkeypatch, tmp_path):
    # "a" runs in 1.0 ms but its first measurement read 1.3 ms; "b" runs in 1.1 ms
    times = {"a": [1.3e-3, 1.0e-3], "b": [1.1e-3]}
    kept, seen = _search(monkeypatch, tmp_path, 0, times)
    assert kept == "b" and len(seen) == 2
    kept, seen = _search(monkeypatch, tmp_path, 2, times)
    assert kept == "a"
    # in turns: the rounds alternate their order
    assert seen[2:] in (["a", "b", "b", "a"], ["b", "a", "a", "b"])


def test_candidates_far_apart_are_measured_once(monkeypatch, tmp_path):
    kept, seen = _search(monkeypatch, tmp_path, 2, {"a": [3e-3], "b": [1e-3]})
    assert kept == "b" and sorted(seen) == ["a", "b"]


@pytest.mark.parametrize("first", ["a", "b"])
def test_scores_the_measurement_cannot_tell_apart_go_to_the_cost_models_first(
    first, monkeypatch, tmp_path
):
    # 1% apart, either way round: the candidate the cost model ranks first is kept
    costs = (1.0, 2.0) if first == "a" else (2.0, 1.0)
    for fast in ("a", "b"):
        times = {"a": [1.0e-3], "b": [1.0e-3]}
        times[fast] = [0.99e-3]
        kept, _ = _search(monkeypatch, tmp_path, 2, times, costs)
        assert kept == first
