"""``--f32-batch auto``: which batched plan runs a step is measured once at load and
remembered; concurrent requests (greedy rows sampled together, seeded ones by their own
generators) give what the same requests give one by one; cancelled streams leave no slot
held. Driven by the official ``openai`` client."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from luminal.serve import choose  # noqa: E402
from luminal.serve.engine import LLMEngine  # noqa: E402
from luminal.serve.limits import Limits  # noqa: E402
from luminal.serve.metrics import Metrics  # noqa: E402
from test_serve import (  # noqa: E402, F401
    CTX,
    MODEL,
    STEP,
    Running,
    check_shared_prefixes_are_reused,
    plans,
    reference,
    tiny_dir,
)

SEQS = 4


def test_step_sizes_and_threshold() -> None:
    assert choose.step_sizes(1) == [1]
    assert choose.step_sizes(16) == [1, 2, 4, 8, 16]
    assert choose.step_sizes(12) == [1, 2, 4, 8, 12]
    packed = {1: 1.0, 2: 3.0, 4: 4.0, 8: 6.0}
    assert choose.threshold(packed, {1: 2.0, 2: 2.5, 4: 3.0, 8: 5.0}) == 2
    assert choose.threshold(packed, {1: 0.5, 2: 2.5, 4: 3.0, 8: 5.0}) == 1
    # faster at 2 rows but not at 4: from 8 on
    assert choose.threshold(packed, {1: 2.0, 2: 2.0, 4: 5.0, 8: 5.0}) == 8
    # slower at the largest size: never
    assert choose.threshold(packed, {1: 0.5, 2: 2.0, 4: 3.0, 8: 7.0}) == 0


def test_f32_batch_option() -> None:
    import argparse

    from luminal.serve.cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).f32_batch == "auto"
    assert p.parse_args(["--f32-batch", "3"]).f32_batch == 3
    for bad in ("-1", "fast"):
        with pytest.raises(SystemExit):
            p.parse_args(["--f32-batch", bad])


def test_measure_interleaves_and_keeps_the_fastest() -> None:
    calls: list[tuple[str, int]] = []
    cost = {"a": {1: [0.0], 2: [0.02, 0.004, 0.01]}, "b": {1: [0.0], 2: [0.001, 0.03, 0.03]}}

    def step(r: str, n: int) -> None:
        calls.append((r, n))
        time.sleep(cost[r][n][calls.count((r, n)) - 1])

    got = choose.measure(step, {"a": "a", "b": "b"}, [2], reps=3)
    assert calls == [("a", 1), ("b", 1)] + [("a", 2), ("b", 2)] * 3
    assert 0.004 <= got["a"][2] < 0.01 and 0.001 <= got["b"][2] < 0.02


@pytest.fixture(scope="module")
def auto(tiny_dir: str, plans: str) -> Iterator[Running]:  # noqa: F811
    limits = Limits(max_context=CTX, max_tokens=40, max_seqs=SEQS, max_queue=32)
    s = Running(tiny_dir, None, limits, f32_batch="auto", prefill="serial")  # type: ignore[arg-type]
    yield s
    s.stop()


def test_auto_measures_once_and_remembers(
    auto: Running,
    tiny_dir: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lo = auto.llm.loaded if auto.llm is not None else None
    assert lo is not None
    # a measured row count (from 1 to the engine's rows per step), or 0: the f32 plan never
    assert lo.f32_from in (0, *choose.step_sizes(auto.llm.rows))  # type: ignore[union-attr]
    assert (lo.runner is None) == (lo.f32_from == 1)  # a plan never the faster is not kept
    assert (lo.runner_f32 is None) == (lo.f32_from == 0)
    with open(choose._memo_file()) as fh:
        memo = json.load(fh)
    assert any(v["f32_from"] == lo.f32_from for v in memo.values())
    for v in memo.values():  # measured at the engine's step sizes: 1..step_tokens rows
        assert sorted(int(n) for n in v["ms"]["packed"]) == choose.step_sizes(max(STEP, SEQS))

    def no_measuring(*a: Any, **k: Any) -> Any:
        raise AssertionError("measured again: the remembered choice was not used")

    monkeypatch.setattr(choose, "measure", no_measuring)
    limits = Limits(max_context=CTX, max_tokens=40, max_seqs=SEQS)
    again = LLMEngine(tiny_dir, MODEL, limits, Metrics(), quiet=True, f32_batch="auto",
                      step_tokens=STEP, prefill="serial")  # fmt: skip
    again._load()
    assert again.loaded is not None and again.loaded.f32_from == lo.f32_from
    with pytest.raises(ValueError, match="f32_batch must be"):
        LLMEngine(tiny_dir, MODEL, limits, Metrics(), f32_batch="fast")


def test_concurrent_mixed_sampling_equals_one_by_one(auto: Running, reference: Any) -> None:  # noqa: F811
    # greedy and seeded sampled requests in the same steps, more requests than slots
    reqs = [("word " * k + "end", 0.0 if k % 2 else 0.9, k) for k in (1, 2, 5, 8, 13, 21, 3, 34)]

    def complete(i: int) -> str:
        p, temp, seed = reqs[i]
        r = auto.client.completions.create(
            model=MODEL, prompt=p, max_tokens=10, temperature=temp, seed=seed
        )
        return str(r.choices[0].text)

    alone = [complete(i) for i in range(len(reqs))]
    for (p, temp, _), text in zip(reqs, alone, strict=True):
        if temp == 0:
            assert text == reference(reference.tokenizer.encode(p), 10)
    together: list[str | None] = [None] * len(reqs)

    def run(i: int) -> None:
        together[i] = complete(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert together == alone


def test_shared_prefixes_are_reused_serial(
    auto: Running,
    tiny_dir: str,  # noqa: F811
    reference: Any,  # noqa: F811
) -> None:
    check_shared_prefixes_are_reused(auto, tiny_dir, reference)


def _active(s: Running) -> tuple[int, int]:
    h = s.health()["models"][MODEL]
    assert s.llm is not None
    return int(h["active"]), len(s.llm.pending)


def _completion_tokens(s: Running) -> float:
    m = httpx.get(s.url + "/metrics").text
    line = next(x for x in m.splitlines() if x.startswith("luminal_completion_tokens_total"))
    return float(line.split()[-1])


def test_cancelled_streams_leave_no_slot_held(auto: Running, reference: Any) -> None:  # noqa: F811
    # twice as many streams as slots, each dropped by its client after its first piece while
    # the engine is held between steps (the first ones may have finished by then)
    eng = auto.llm
    assert eng is not None
    before = _completion_tokens(auto)
    got_first = threading.Barrier(2 * SEQS + 1)
    held = threading.Event()

    def drop(i: int) -> None:
        s = auto.client.completions.create(
            model=MODEL, prompt=f"Story {i}:", max_tokens=40, temperature=0, stream=True
        )
        next(iter(s))
        got_first.wait(timeout=60)
        held.wait(timeout=60)
        s.close()

    threads = [threading.Thread(target=drop, args=(i,)) for i in range(2 * SEQS)]
    for t in threads:
        t.start()
    got_first.wait(timeout=60)
    with eng.cv:  # the engine waits for this lock before its next step
        held.set()
        for t in threads:
            t.join(timeout=60)
        time.sleep(0.7)  # the handlers see the disconnects (they look every 0.5 s)
    deadline = time.monotonic() + 20
    while _active(auto) != (0, 0):
        assert time.monotonic() < deadline, f"slots still held: {_active(auto)}"
        time.sleep(0.02)
    assert _completion_tokens(auto) - before < 2 * SEQS * 40  # some stopped early
    # every slot serves again: a full batch of requests completes with the right text
    prompts = [f"Line {i} says" for i in range(SEQS)]
    got: list[str | None] = [None] * SEQS

    def run(i: int) -> None:
        r = auto.client.completions.create(
            model=MODEL, prompt=prompts[i], max_tokens=6, temperature=0
        )
        got[i] = r.choices[0].text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(SEQS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert got == [reference(reference.tokenizer.encode(p), 6) for p in prompts]
    assert _active(auto) == (0, 0)
    m = httpx.get(auto.url + "/metrics").text
    assert "luminal_step_host_seconds_count" in m
    line = next(x for x in m.splitlines() if x.startswith("luminal_prefill_seconds_count"))
    assert float(line.split()[-1]) >= 1  # serial: prompts with no reused rows ran alone
    assert os.path.exists(choose._memo_file())


def test_non_finite_logits_fail_the_request(auto: Running, reference: Any) -> None:  # noqa: F811
    assert auto.llm is not None and auto.llm.loaded is not None
    decoder = auto.llm.loaded.decoder
    step = decoder.step

    def poisoned(*args: Any, **kw: Any) -> Any:
        out = step(*args, **kw)
        out[0, 0] = float("nan")
        return out

    decoder.step = poisoned  # type: ignore[method-assign]
    try:
        with pytest.raises(openai.InternalServerError, match="non-finite"):
            auto.client.completions.create(
                model=MODEL, prompt="Going wrong", max_tokens=5, temperature=0
            )
    finally:
        del decoder.step
    assert _active(auto) == (0, 0)
    r = auto.client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, temperature=0)
    assert r.choices[0].text == reference(reference.tokenizer.encode("Hi"), 5)
