"""Session-wide views for front ends (widgets, the sidebar, ``jupyter-mesh status``)."""

from __future__ import annotations

from collections.abc import Callable

from ._state import MeshEvent, MeshState
from .errors import SupervisionError

__all__ = ["mesh_states", "set_fault_hook", "shutdown", "subscribe"]


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


def set_fault_hook(hook: Callable[[SupervisionError], None] | None) -> Callable[[SupervisionError], None]:
    """Choose what happens to a failure no pending call was told about; returns the previous hook.

    Default (``None``): fail fast - print it, raise it at the next API call, exit non-zero at the end
    if it was never raised. Jupyter kernels install a hook that shows it and keeps the kernel alive.
    """
    from ._runtime import controller

    return controller.set_fault_hook(hook)
