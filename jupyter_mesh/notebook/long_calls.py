"""The cell of a long call: which ranks have not answered yet, and where each is, updated while it waits.

A cell waiting on ``.get()`` longer than ``slow_call_after`` seconds (``jupyter_mesh.config``) shows one
output, updated every couple of seconds: for each mesh with calls out, how many ranks answered and,
for each rank left, its stack's top frame of user code or *paused at file:line*
(:mod:`jupyter_mesh.ui.slow_calls`, shared with the widget and the sidebar). When the call returns the
output says how long it took. It runs on the cell's own thread — the one waiting — through the hook
``get()`` already has for debugger prompts (it wraps that hook): a timer wakes the wait, the view is
updated, the wait goes on, and the time spent counts for nothing against the call's timeout. An
``await``ed call shows nothing here (the widget and the sidebar still do).
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

from .._core import future as _future
from ..lowlevel import mesh_states
from ..ui.slow_calls import REFRESH, slow_after, waits

__all__ = ["LongCallView", "LongCalls", "install", "uninstall"]


class LongCallView:
    """What the cell shows (plain text and HTML)."""

    def __init__(
        self, lines: list[tuple[str, list[tuple[str, str]]]], waited: float, done: bool = False, returned: bool = True
    ):
        self.lines, self.waited, self.done, self.returned = lines, waited, done, returned

    def _head(self) -> str:
        if self.done and not self.returned:
            return f"jupyter_mesh: stopped waiting after {self.waited:.0f} s (the call had not returned)"
        if self.done:
            return f"jupyter_mesh: the call returned after {self.waited:.0f} s"
        return f"jupyter_mesh: still waiting after {self.waited:.0f} s"

    def __repr__(self) -> str:
        out = [self._head()]
        for mesh, left in [] if self.done else self.lines:
            out.append(f"  {mesh}")
            out += [f"    {who} not answered: {where}" for who, where in left]
        return "\n".join(out)

    def _repr_html_(self) -> str:
        esc = html.escape
        rows = []
        for mesh, left in [] if self.done else self.lines:
            rows.append(f"<div>{esc(mesh)}</div>")
            rows += [
                f"<div class='jm-wait' style='padding-left:1.5em;font-family:monospace'>{esc(who)} not answered: "
                f"{esc(where)}</div>"
                for who, where in left
            ]
        state = "done" if self.done else "waiting"
        return f"<div data-long-call='{state}'><b>{esc(self._head())}</b>{''.join(rows)}</div>"


class LongCalls:
    """``get()``'s pause hook in the notebook: the debugger prompts (``inner``) and the long-call view."""

    def __init__(self, inner: Any):
        self.inner = inner
        self._fut: Any = None
        self._began = 0.0
        self._handle: Any = None  # the cell's display of the current long call
        self._due = False
        self._showing = False
        self._alarm = _Alarm()
        self._cell: object = None  # the cell whose output shows the view (its execution count)

    def watch(self, fut: Any) -> Any:
        stop_inner = self.inner.watch(fut) if self.inner is not None else None
        if self._showing or threading.current_thread() is not threading.main_thread():
            return stop_inner  # another thread's wait, or the view's own (the stacks it asks for)
        cell = _cell()
        if fut is not self._fut or cell != self._cell:  # a new call, or the same one waited on by a new cell
            if self._handle is not None:  # the last wait ended without the call returning (a timeout, Ctrl-C)
                self._finish(returned=False)
            self._fut, self._began, self._handle, self._due, self._cell = fut, time.monotonic(), None, False, cell
        after = slow_after()
        if after > 0:
            delay = REFRESH if self._handle is not None else max(0.0, self._began + after - time.monotonic())
            self._alarm.set(delay, lambda: self._tick(fut))

        def stop() -> None:
            self._alarm.cancel()
            if stop_inner is not None:
                stop_inner()
            if fut._done() and self._fut is fut:
                self._finish()

        return stop

    def _tick(self, fut: Any) -> None:  # timer thread
        self._due = True
        fut._poke()

    def serve(self) -> None:
        if self._due:
            self._due, self._showing = False, True
            try:
                self._show()
            except Exception as e:  # noqa: BLE001 - a view must never break the wait it describes
                print(f"jupyter_mesh: could not show where the call waits: {type(e).__name__}: {e}")
            finally:
                self._showing = False
        if self.inner is not None:
            self.inner.serve()

    def _show(self) -> None:
        from IPython.display import display

        lines = []
        w = waits()
        for state in mesh_states():
            if not w.slow(state):
                continue
            assert state.progress is not None
            found = w.look(state) or []
            done, left = len(state.progress.done), len(state.progress.left)
            more = f" (and {left - len(found)} more)" if left > len(found) else ""
            lines.append(
                (
                    f"'{state.name}': {done} of {done + left} answered{more}",
                    [(f"rank {x['rank']} [{x['label']}]", x["where"]) for x in found],
                )
            )
        if not lines and self._handle is None:
            return  # slow, but no mesh has calls out for long (a spawn, a gather of its own): nothing to say
        view = LongCallView(lines, time.monotonic() - self._began)
        if self._handle is None:
            self._handle = display(view, display_id=True)
        else:
            self._handle.update(view)

    def _finish(self, returned: bool = True) -> None:
        handle, self._handle, self._fut = self._handle, None, None
        if handle is not None:
            try:
                handle.update(LongCallView([], time.monotonic() - self._began, done=True, returned=returned))
            except Exception:  # noqa: BLE001 - the kernel is going away
                pass


_MAX_SLEEP = 3600.0


def _cell() -> object:
    """Which cell runs now (IPython's execution count; None outside IPython)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return None
    return None if shell is None else shell.execution_count


class _Alarm:
    """One daemon thread that calls ``fn`` once its delay is over, unless cancelled first: setting and
    cancelling are a lock each (every ``get()`` of the cell sets one), not a thread per wait."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._at: float | None = None
        self._fn: Any = None
        self._thread: threading.Thread | None = None

    def set(self, delay: float, fn: Any) -> None:
        with self._cond:
            self._at, self._fn = time.monotonic() + delay, fn
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jupyter-mesh-long-calls", daemon=True)
                self._thread.start()
            self._cond.notify()

    def cancel(self) -> None:
        with self._cond:
            self._at = self._fn = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._at is None or time.monotonic() < self._at:
                    # at most an hour at a time: a huge ``slow_call_after`` overflows the lock's timeout
                    self._cond.wait(None if self._at is None else min(_MAX_SLEEP, self._at - time.monotonic()))
                fn, self._at, self._fn = self._fn, None, None
            try:
                fn()
            except Exception:  # noqa: BLE001 - a wake-up that failed: the wait goes on as it was
                pass


def install() -> None:
    """Wrap the pause hook that is set now (the debugger prompts) with the long-call view."""
    if not isinstance(_future.pause_hook, LongCalls):
        _future.pause_hook = LongCalls(_future.pause_hook)


def uninstall() -> None:
    """Put back the hook it wrapped."""
    hook = _future.pause_hook
    if isinstance(hook, LongCalls):
        _future.pause_hook = hook.inner
