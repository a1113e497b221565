"""Session-wide views for front ends (widgets, the sidebar, ``jupyter-mesh status``)."""

from __future__ import annotations

from typing import Callable

from ._state import MeshEvent, MeshState

__all__ = ["mesh_states", "shutdown", "subscribe"]


def mesh_states(include_stopped: bool = False) -> list[MeshState]:
    """Snapshots of every proc mesh this program created (running ones only by default)."""
    from ._runtime.controller import Controller

    tracker = Controller.get().state
    out = [tracker.snapshot(m) for m in tracker.mesh_ids()]
    return [s for s in out if include_stopped or not s.stopped]


def subscribe(listener: Callable[[MeshEvent], None]) -> Callable[[], None]:
    """Call ``listener(event)`` on every change of every proc mesh; returns an unsubscribe function."""
    from ._runtime.controller import Controller

    return Controller.get().state.subscribe(listener)


def shutdown() -> None:
    """Stop every mesh and agent of this program now (also runs at exit)."""
    from ._runtime.controller import Controller

    inst = Controller._instance
    if inst is not None:
        inst.shutdown()
