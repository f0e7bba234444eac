"""A live status line on stderr for long work (compiling a model): what runs now, counts,
time so far.

    with progress.task("decode plan"):
        progress.update("schedules", step=7, steps=9, detail=lambda: "12 measured")

The line appears once a task has run ``SHOW_AFTER_S`` and is redrawn by a thread a few times
a second, so a stage that never reports still shows its time. It is shown when stderr is a
terminal (or ``LUMINAL_PROGRESS=1``) and never with ``LUMINAL_PROGRESS=0``, nor by default
under ``LUMINAL_DEBUG`` (whose lines it would cut). Lines that must stay (the CLI's stage
lines) go through ``echo``, which clears the status line first and draws it again after.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from . import flags

__all__ = ["PROGRESS", "echo", "enabled", "task", "update"]

PROGRESS = flags.PROGRESS

SHOW_AFTER_S = 1.0  # work shorter than this shows no status line
REDRAW_S = 0.25


def enabled(stream: TextIO | None = None) -> bool:
    v = PROGRESS.get()
    if v not in ("", "0", "1"):
        raise ValueError(f"LUMINAL_PROGRESS must be 0 or 1, got {v!r}")
    if v:
        return v == "1"
    stream = stream or sys.stderr
    return flags.debug() == 0 and bool(getattr(stream, "isatty", lambda: False)())


class _Status:
    def __init__(self, title: str, stream: TextIO) -> None:
        self.title = title
        self.stream = stream
        self.t0 = time.perf_counter()
        self.stage = ""
        self.step: int | None = None
        self.steps: int | None = None
        self.detail: Callable[[], str] | None = None
        self.shown = False  # the status line is on screen (the cursor is at its end)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="luminal-progress", daemon=True)

    def text(self) -> str:
        parts = ["luminal:" + (f" {self.title}" if self.title else "")]
        if self.stage:
            where = f" ({self.step}/{self.steps})" if self.step and self.steps else ""
            parts.append(f"{self.stage}{where}")
        if self.detail is not None:
            try:
                d = self.detail()
            except Exception:  # a count that cannot be read now is left out, not fatal
                d = ""
            if d:
                parts.append(d)
        parts.append(f"{time.perf_counter() - self.t0:.1f} s")
        return parts[0] + " " + " · ".join(parts[1:])

    def draw(self) -> None:  # holds self.lock
        width = 200
        try:
            import shutil

            width = shutil.get_terminal_size((200, 24)).columns
        except (OSError, ValueError):
            pass
        self.stream.write("\r\033[K" + self.text()[: max(20, width - 1)])
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:  # holds self.lock
        if self.shown:
            self.stream.write("\r\033[K")
            self.shown = False

    def _run(self) -> None:
        if self.done.wait(SHOW_AFTER_S):
            return
        while not self.done.is_set():
            with self.lock:
                if not self.done.is_set():
                    self.draw()
            self.done.wait(REDRAW_S)

    def close(self) -> None:
        self.done.set()
        with self.lock:
            self.clear()
            self.stream.flush()
        self.thread.join()


_ACTIVE: list[_Status] = []  # the outermost task's status, which draws the line
_LOCK = threading.Lock()


@contextmanager
def task(title: str, stream: TextIO | None = None) -> Iterator[None]:
    """A status line for the work inside; a nested task shows its title in the outer one's
    line while it runs (an empty title keeps the outer one's)."""
    with _LOCK:
        outer = _ACTIVE[0] if _ACTIVE else None
    if outer is not None:
        with outer.lock:
            saved = (outer.title, outer.stage, outer.step, outer.steps, outer.detail)
            if title:
                outer.title = title
        try:
            yield
        finally:
            with outer.lock:
                outer.title, outer.stage, outer.step, outer.steps, outer.detail = saved
        return
    if not enabled(stream):
        yield
        return
    st = _Status(title, stream or sys.stderr)
    with _LOCK:
        _ACTIVE.append(st)
    st.thread.start()
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE.remove(st)
        st.close()


def update(
    stage: str,
    step: int | None = None,
    steps: int | None = None,
    detail: Callable[[], str] | None = None,
) -> None:
    """What the current task does now: a stage name, its place in a count of stages, and a
    function the redraw calls for a live count (e.g. measurements so far)."""
    with _LOCK:
        st = _ACTIVE[0] if _ACTIVE else None
    if st is None:
        return
    with st.lock:
        st.stage, st.step, st.steps, st.detail = stage, step, steps, detail


def echo(line: str, stream: TextIO | None = None) -> None:
    """Prints ``line`` on stderr above the status line (plain print when there is none)."""
    with _LOCK:
        st = _ACTIVE[0] if _ACTIVE else None
    out = stream or (st.stream if st else sys.stderr)
    if st is None or out is not st.stream:
        print(line, file=out, flush=True)
        return
    with st.lock:
        was = st.shown
        st.clear()
        out.write(line + "\n")
        if was:
            st.draw()
        else:
            out.flush()
