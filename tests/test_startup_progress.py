"""The live progress line of long compiles (luminal.progress): shown on a terminal or with
LUMINAL_PROGRESS=1, never with LUMINAL_PROGRESS=0 or on a pipe, and out of the way of lines
that stay."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

import luminal
from luminal import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "REDRAW_S", 0.01)
    monkeypatch.delenv("LUMINAL_DEBUG", raising=False)


def _wait_for(out: io.StringIO, text: str) -> None:
    for _ in range(500):
        if text in out.getvalue():
            return
        time.sleep(0.01)
    raise AssertionError(f"{text!r} never shown; got {out.getvalue()!r}")


def test_status_line_on_a_terminal(fast, monkeypatch) -> None:
    monkeypatch.delenv("LUMINAL_PROGRESS", raising=False)
    out = _Tty()
    with progress.task("compiling 'm'", out):
        progress.update("schedules", 7, 9, lambda: "3 kernels decided")
        _wait_for(out, "schedules (7/9) · 3 kernels decided")
        with progress.task("inner"):  # a nested task names itself while it runs
            _wait_for(out, "luminal: inner")
        progress.echo("luminal:   1.0 s  lowering", out)
    text = out.getvalue()
    assert "luminal: compiling 'm' schedules (7/9)" in text
    # a kept line starts on a cleared line and ends with a newline; the status is cleared last
    assert "\r\033[Kluminal:   1.0 s  lowering\n" in text
    assert text.endswith("\r\033[K")


def test_no_status_on_a_pipe_or_when_off(fast, monkeypatch) -> None:
    monkeypatch.delenv("LUMINAL_PROGRESS", raising=False)
    pipe = io.StringIO()
    with progress.task("x", pipe):
        progress.update("lower", 1, 2)
        time.sleep(0.05)
        progress.echo("kept", pipe)
    assert pipe.getvalue() == "kept\n"
    monkeypatch.setenv("LUMINAL_PROGRESS", "0")
    tty = _Tty()
    with progress.task("x", tty):
        progress.update("lower", 1, 2)
        time.sleep(0.05)
    assert tty.getvalue() == ""
    monkeypatch.setenv("LUMINAL_PROGRESS", "1")
    assert progress.enabled(io.StringIO())
    monkeypatch.setenv("LUMINAL_PROGRESS", "yes")
    with pytest.raises(ValueError, match="LUMINAL_PROGRESS must be 0 or 1"):
        progress.enabled()


def test_a_compile_reports_its_stages(fast, monkeypatch, capsys) -> None:
    monkeypatch.setenv("LUMINAL_PROGRESS", "1")
    g = luminal.Graph("progress_demo")
    x = g.input("x", (3, 50))
    g.output("y", (x.sin() * 2.0).sum_reduce(1))
    cg = luminal.compile(g, search=False, cache=False)
    err = capsys.readouterr().err
    assert "luminal: compiling 'progress_demo'" in err and err.endswith("\r\033[K")
    xv = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    np.testing.assert_allclose(cg.run({"x": xv})["y"], (np.sin(xv) * 2).sum(1), rtol=1e-5)
