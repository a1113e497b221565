"""Monarch's ``context()``: who is running, as an object. Inside an endpoint it describes the actor
(its mesh name, class, rank) and the message's rank; anywhere else, the root client (``<root>``).

Read from the process context (``_core.context``) the runtime fills in for each actor thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import slots
from .context import context as _process
from .context import message
from .shape import Extent, Point

__all__ = ["Context", "Instance", "context", "current_actor_name", "current_size"]

_NO_RANK = Point(0, Extent((), ()))


@dataclass(frozen=True)
class Instance:
    """The running actor: ``name`` (the name its mesh was spawned with), ``class_name``, ``rank`` (its
    point in the mesh it was spawned on: a sliced, flattened or renamed proc mesh numbers it in that
    view, as in Monarch), ``actor_id`` (unique per actor, per rank)."""

    name: str
    class_name: str | None
    rank: Point
    actor_id: str
    proc_id: str
    creator: Instance | None = None
    _host: Any = field(default=None, repr=False, compare=False)

    def abort(self, reason: str | None = None) -> None:
        """End this actor with a failure (Monarch's): later calls to it fail, and whoever spawned it (its
        ``__supervise__``, or the program's fault hook) hears of it. Its proc lives on."""
        if self._host is None:
            raise RuntimeError("abort() ends an actor; outside actors there is none to end")
        self._host.abort(reason)

    def kill(self, reason: str | None = None) -> None:
        """Monarch's: end this actor with a failure, as :meth:`abort` does."""
        self.abort(reason)

    def stop(self, reason: str | None = None) -> None:
        """End this actor without a failure (Monarch's), once the message it handles now ends: its
        ``__cleanup__(None)`` runs, the meshes it spawned stop, later calls to it raise
        ``SupervisionError`` (kind ``stopped``). Its proc lives on. ``reason`` is Monarch's, unused."""
        if self._host is None:
            raise RuntimeError("stop() ends an actor; outside actors there is none to stop")
        self._host.stop_self()

    @property
    def proc_mesh(self) -> Any:
        """The ``ProcMesh`` this actor was spawned on (Monarch's): it can spawn actor meshes there, and
        supervises them. Outside actors: ``this_proc()``."""
        if self._host is None:
            assert slots.this_proc is not None, "the facade (jupyter_mesh/__init__) fills this slot"
            return slots.this_proc()
        if self._host.proc_ref is None:
            raise RuntimeError(f"actor {self.name} was spawned by a runtime that did not say on which proc mesh")
        assert slots.proc_mesh_from_ref is not None, "the facade (jupyter_mesh/__init__) fills this slot"
        return slots.proc_mesh_from_ref(self._host.proc_ref)

    @property
    def proc(self) -> Any:
        """This actor's own proc, as a proc mesh of that one proc (no dims; Monarch's): what it spawns
        there runs in its process (``this_proc()`` in an actor). Outside actors: ``this_proc()``."""
        if self._host is None:
            return self.proc_mesh
        return self.proc_mesh.slice(**self._host.runtime.coords)

    def __reduce__(self) -> tuple[Any, ...]:  # the actor's runtime stays where it is
        return (Instance, (self.name, self.class_name, self.rank, self.actor_id, self.proc_id, self.creator))

    def __repr__(self) -> str:
        cls = f"{self.class_name} " if self.class_name else ""
        rank = str(self.rank) if len(self.rank) else ""
        return f"<{cls}{self.name}{rank}>"


@dataclass(frozen=True)
class Context:
    """``actor_instance``: the running actor; ``message_rank``: where the current message reached it, in
    the mesh or slice the message was sent to (Monarch's: a call to ``a.slice(gpus=1)`` numbers its
    actors from 0 in that slice, while ``actor_instance.rank`` stays the actor's own point)."""

    actor_instance: Instance
    message_rank: Point


_ROOT = Instance("root", None, _NO_RANK, "root", "root")


def context() -> Context:
    """The running actor's context, or the root client's outside actors."""
    actor = _process().actor
    host: Any = actor.host
    proc: Any = actor.proc
    if host is None or proc is None:
        return Context(_ROOT, _NO_RANK)
    cls = type(host.instance)
    inst = Instance(
        host.name,
        f"{cls.__module__}.{cls.__qualname__}" if host.instance is not None else None,
        host.point,
        f"{host.actor_id}[{proc.rank}]",
        f"{proc.mesh_name}[{proc.rank}]",
        _ROOT,
        host,
    )
    return Context(inst, host.rank_in(message.get()))


def current_actor_name() -> str:
    """A name for the running actor, unique per actor and rank ("root" outside actors)."""
    return context().actor_instance.actor_id


def current_size() -> dict[str, int]:
    """The size of each dim of the mesh or slice the current message was sent to (Monarch's: that of
    ``message_rank``; {} outside actors)."""
    return dict(context().message_rank.extent)
