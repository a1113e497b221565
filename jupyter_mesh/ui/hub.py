"""The one place where the views of this process hear about mesh changes.

The runtime calls listeners on its threads (the receive thread, or a caller reading its replies in
``get()``), once per change: a 256-proc spawn is 256 events
in a few milliseconds. The hub takes them there (cheap bookkeeping only), wakes one daemon thread,
and that thread hands every view the snapshots of the meshes that changed, at most once per
``interval`` (0.1 s: ten frames a second). When nothing changes the thread sleeps on an event with
no timeout: no polling, here or in the browser. A call is one event when it is sent and one per
gathered reply (``calls``: its ranks at once), not two per rank.

A snapshot costs the hub's thread O(ranks): ~5 ms at 256 ranks, ~0.3 s at 16,384. So the pause
after a flush is at least the flush's own CPU time over :data:`BUDGET`: the views take at most that
share of a core, and a huge mesh updates every few seconds rather than starving the controller.

Besides the runtime's own state (which includes the progress of calls in flight: ranks done and
left, ``MeshState.progress``) the hub keeps the recent failures of each mesh, with their cause,
newest last.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from .._core.state import MeshEvent, MeshState
from ..errors import format_coords
from .slow_calls import waits
from .wire import MeshWire, RecentFailure, mesh_wire

__all__ = ["Hub", "View", "hub"]

View = Callable[[list[MeshWire], list[str]], None]
"""(changed meshes, ids of meshes that are gone) -> None; called on the hub's thread."""

RECENT_FAILURES = 8
log = logging.getLogger("jupyter_mesh.ui")
BUDGET = 0.1  # the share of one core the views may take: a flush that took t s waits t / BUDGET s


def next_pause(interval: float, spent: float) -> float:
    """Seconds from one flush to the next: ``interval``, or longer when a flush took ``spent`` s of CPU."""
    return max(interval, spent / BUDGET)


class Source(Protocol):
    """Where the hub reads mesh state: the public API (``_RuntimeSource``), or a bare tracker in tests."""

    def subscribe(self, listener: Callable[[MeshEvent], None]) -> Callable[[], None]: ...
    def state(self, mesh_id: str) -> MeshState: ...  # KeyError when unknown
    def states(self, include_stopped: bool) -> list[MeshState]: ...


class _RuntimeSource:
    def subscribe(self, listener: Callable[[MeshEvent], None]) -> Callable[[], None]:
        from ..lowlevel import subscribe

        return subscribe(listener)

    def state(self, mesh_id: str) -> MeshState:
        from ..errors import MeshValueError
        from ..lowlevel import proc_mesh

        try:
            return proc_mesh(mesh_id).state()
        except MeshValueError:
            raise KeyError(mesh_id) from None

    def states(self, include_stopped: bool) -> list[MeshState]:
        from ..lowlevel import mesh_states

        return mesh_states(include_stopped=include_stopped)


class Hub:
    def __init__(self, interval: float = 0.1, source: Source | None = None):
        self.interval = interval
        self.source: Source = source or _RuntimeSource()
        self._lock = threading.Lock()
        self._views: list[View] = []
        self._dirty: set[str] = set()
        self._wake = threading.Event()
        self._stop: threading.Event | None = None  # the running thread's own stop flag
        self._unsubscribe: Callable[[], None] | None = None
        self._failures: dict[str, collections.deque[RecentFailure]] = {}
        self.flushes = 0  # how many batches went out (tests check that events are coalesced)
        self._calls_out = threading.Event()  # some mesh has calls out: the long-call watcher looks

    # -- views ------------------------------------------------------------------------------------
    def add_view(self, view: View) -> Callable[[], None]:
        """Start handing ``view`` updates; returns the function that stops it."""
        with self._lock:
            self._views.append(view)
            if self._unsubscribe is None:
                self._unsubscribe = self.source.subscribe(self._on_event)
            if self._stop is None:
                self._stop = threading.Event()
                threading.Thread(target=self._run, args=(self._stop,), name="jupyter-mesh-ui", daemon=True).start()
                threading.Thread(
                    target=self._watch_long_calls, args=(self._stop,), name="jupyter-mesh-long-calls", daemon=True
                ).start()

        def remove() -> None:
            unsub, stop = None, None
            with self._lock:
                if view in self._views:
                    self._views.remove(view)
                if not self._views:
                    unsub, self._unsubscribe = self._unsubscribe, None
                    stop, self._stop = self._stop, None
            if stop is not None:
                stop.set()
                self._wake.set()
                self._calls_out.set()
            if unsub is not None:
                unsub()

        return remove

    def meshes(self, mesh_id: str | None = None, include_stopped: bool = False) -> list[MeshWire]:
        """Snapshots now, for a view that just opened (one mesh, or every running one)."""
        states = self.source.states(include_stopped or mesh_id is not None)
        return [self._wire(s) for s in states if mesh_id is None or s.mesh_id == mesh_id]

    # -- from the runtime (its threads: bookkeeping only) ------------------------------------------
    def _on_event(self, ev: MeshEvent) -> None:
        with self._lock:
            if ev.kind == "failed" and ev.failure is not None:
                q = self._failures.setdefault(ev.mesh_id, collections.deque(maxlen=RECENT_FAILURES))
                q.append(
                    RecentFailure(
                        rank=ev.rank or 0,
                        label=format_coords(ev.coords),
                        kind=ev.failure.kind,
                        detail=ev.failure.detail,
                        time=ev.time,
                    )
                )
            self._dirty.add(ev.mesh_id)
        self._wake.set()

    def _wire(self, state: MeshState) -> MeshWire:
        with self._lock:
            failures = list(self._failures.get(state.mesh_id, ())) or None
        return mesh_wire(state, failures, waits().cached(state))

    # -- the hub's thread -------------------------------------------------------------------------
    def _run(self, stop: threading.Event) -> None:
        last, spent = 0.0, 0.0
        while True:
            self._wake.wait()
            if stop.is_set():
                return
            pause = last + next_pause(self.interval, spent) - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the rate bound: changes meanwhile join this batch
            with self._lock:
                if stop.is_set():
                    return
                self._wake.clear()
                dirty, self._dirty = self._dirty, set()
                views = list(self._views)
            last = time.monotonic()
            if dirty:
                cpu = time.thread_time()
                self._flush(dirty, views)
                spent = time.thread_time() - cpu

    def _flush(self, dirty: set[str], views: list[View]) -> None:
        changed: list[MeshWire] = []
        gone: list[str] = []
        for mesh_id in sorted(dirty):
            try:
                changed.append(self._wire(self.source.state(mesh_id)))
            except KeyError:
                gone.append(mesh_id)
        if any(m["gather"] is not None for m in changed):
            self._calls_out.set()
        self.flushes += 1
        for view in views:
            try:
                view(changed, gone)
            except Exception:  # one closed comm must not stop the other views
                log.exception("a mesh view failed to update")

    def _watch_long_calls(self, stop: threading.Event) -> None:
        """While calls are out: once they run past ``slow_call_after``, where their ranks left are, every
        ``REFRESH`` s (the views show it). Sleeps on an event while no call is out."""
        from .slow_calls import REFRESH, slow_after

        while True:
            self._calls_out.wait()
            if stop.is_set():
                return
            self._calls_out.clear()  # before looking: a flush meanwhile sets it again
            try:
                states = [s for s in self.source.states(False) if s.progress is not None]
            except Exception:  # noqa: BLE001 - the runtime is going away
                states = []
            after, nap = slow_after(), REFRESH
            if not states or after <= 0:
                continue
            for state in states:
                assert state.progress is not None
                if state.progress.elapsed < after:
                    nap = min(nap, after - state.progress.elapsed)
                    continue
                try:
                    waits().look(state)
                except Exception:  # a view's extra must not stop the watcher
                    log.exception("locating the ranks of a long call failed")
                with self._lock:
                    self._dirty.add(state.mesh_id)
                self._wake.set()
            self._calls_out.set()  # calls are out: look again after the nap
            stop.wait(max(0.05, nap))
            if stop.is_set():
                return


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    """The process's hub (created on first use)."""
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub()
        return _hub
