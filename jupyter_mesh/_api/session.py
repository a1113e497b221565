"""Session-wide views for front ends (widgets, the sidebar, ``jupyter-mesh status``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .._core.future import Future
from .._core.state import MeshEvent, MeshState
from ..errors import MeshFailure, MeshValueError

if TYPE_CHECKING:
    from .._core.refs import ActorMeshRef
    from .mesh import ActorMesh
    from .proc_mesh import ProcMesh

__all__ = [
    "mesh_states",
    "on_send",
    "proc_mesh",
    "set_actor_errors",
    "set_fault_hook",
    "shutdown",
    "shutdown_context",
    "subscribe",
    "sync_output",
]


def mesh_states(include_stopped: bool = False) -> list[MeshState]:
    """Snapshots of every proc mesh this program created (running ones only by default)."""
    from .._runtime.controller import Controller

    tracker = Controller.get().state
    out = [tracker.snapshot(m) for m in tracker.mesh_ids()]
    return [s for s in out if include_stopped or not s.stopped]


def subscribe(listener: Callable[[MeshEvent], None]) -> Callable[[], None]:
    """Call ``listener(event)`` on every change of every proc mesh; returns an unsubscribe function."""
    from .._runtime.controller import Controller

    return Controller.get().state.subscribe(listener)


def proc_mesh(mesh_id: str) -> ProcMesh:
    """The whole proc mesh with this ``mesh_id`` (as in :class:`MeshState`): front ends that only hold
    an id (the sidebar, ``jupyter-mesh status``) act on a mesh through the same API as the user."""
    from .._runtime.controller import Controller
    from .proc_mesh import ProcMesh

    ctl = Controller.get()
    rec = ctl.meshes.get(mesh_id)
    if rec is None:
        raise MeshValueError(
            f"no proc mesh with id '{mesh_id}' in this program; see jupyter_mesh.lowlevel.mesh_states()"
        )
    return ProcMesh(ctl, rec.ref)


def on_send(
    sent: Callable[[ActorMesh[Any], list[int]], None] | None,
    spawned: Callable[[ActorMesh[Any], type], None] | None = None,
) -> None:
    """Call ``sent(actor_mesh, ranks)`` on the sending thread each time a call or broadcast goes to
    ranks of an actor mesh, and ``spawned(actor_mesh, cls)`` when actors are spawned (None: stop). A
    notebook tells by them which cell caused the output a rank prints later, and which class
    definition live actors run."""
    from .._runtime.controller import Controller

    hooks = Controller.get().client.hooks
    hooks.sent = cast("Callable[[ActorMeshRef, list[int]], None] | None", sent)
    hooks.spawned = cast("Callable[[ActorMeshRef, type], None] | None", spawned)


def sync_output(mesh_id: str, ranks: list[int], token: str) -> int:
    """Ask ``ranks`` of a proc mesh to print a marker line (``_wire.protocol.OUT_SYNC_PREFIX`` +
    ``token``) on stdout and on stderr after what they printed so far; returns how many procs were
    asked (each prints two markers). When the markers arrived, so did the output before them."""
    from .._runtime.controller import Controller

    ctl = Controller.get()
    rec = ctl.meshes.get(mesh_id)
    if rec is None:
        return 0
    return ctl.client.sync_output(rec.ref, ranks, token)


def shutdown() -> None:
    """Stop every mesh and agent of this program now (also runs at exit)."""
    from .._runtime.controller import Controller

    inst = Controller._instance
    if inst is not None:
        inst.shutdown()


def shutdown_context() -> Future[None]:
    """Monarch's name for :func:`shutdown`: stop everything this program started; a completed future.
    Idempotent; a later API call starts a fresh runtime."""
    shutdown()
    return Future.completed(None, "shutdown")


def set_fault_hook(hook: Callable[[MeshFailure], None] | None) -> Callable[[MeshFailure], None]:
    """Choose what happens to a failure no pending call was told about (a :class:`MeshFailure`, which
    is a ``SupervisionError``); returns the previous hook.

    Default (``None``): fail fast - print it, raise it at the next API call, exit non-zero at the end
    if it was never raised. Jupyter kernels install a hook that shows it and keeps the kernel alive.
    """
    from .._runtime import hooks

    return hooks.set_fault_hook(hook)


def set_actor_errors(mode: str) -> str:
    """What an error that no caller receives (under ``broadcast()``, or a ``BaseException``) does to
    the actor, for actor meshes spawned from now on; returns the previous mode. ``"fatal"`` (the
    default, Monarch's): the actor dies, later calls raise ``SupervisionError``, the fault hook hears
    of it. ``"survive"`` (the ``mesh`` kernel's): it is reported, and the actor lives on."""
    from .._runtime import actor_errors

    return actor_errors.set_actor_errors(mode)
