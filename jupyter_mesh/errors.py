"""Every error jupyter_mesh raises, in one tree.

::

    MeshError                       base of everything below
    ├── ActorError                  an endpoint (or an actor's __init__) raised on a remote rank
    ├── SupervisionError            a proc or host died or stopped answering (a peer *broke* it)
    ├── DeliveryError               a message could not be handed to a rank that is still alive
    ├── MeshClosedError             you stopped the mesh (or it was never started): it is *closed*
    ├── MeshTimeoutError            a wait ran out; ``phase`` says which (spawn, call, stop, transfer)
    │                               (also a builtin ``TimeoutError``)
    ├── MeshCancelledError          you cancelled the call (``Future.cancel()``, Ctrl-C, notebook ■)
    ├── UsageError-like subclasses of builtins for bad input at the call site:
    │   ├── MeshValueError          (ValueError) bad slice, unknown dim, wrong shape
    │   └── SerializationError      (TypeError) an argument or result cannot be pickled
    └── ProtocolError               a peer spoke a protocol we do not understand

    MeshInterrupted (KeyboardInterrupt)  Ctrl-C / notebook ■ while waiting: the calls were cancelled;
                                    it says on which ranks they stopped and which still run

The trio vocabulary: *closed* means you closed it, *broken* means a peer failed. Each message says what
happened, where (mesh, rank coordinates, actor, endpoint) and what to do next; the data lives in
attributes so programs need not parse messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ActorError",
    "DeliveryError",
    "Failure",
    "MeshCancelledError",
    "MeshClosedError",
    "MeshError",
    "MeshFailure",
    "MeshInterrupted",
    "MeshTimeoutError",
    "MeshValueError",
    "ProtocolError",
    "RemoteFailure",
    "SerializationError",
    "SupervisionError",
]


def format_coords(coords: Mapping[str, int]) -> str:
    """``{"hosts": 0, "gpus": 3}`` -> ``hosts=0,gpus=3`` (``rank 0`` for a zero-dim point)."""
    return ",".join(f"{k}={v}" for k, v in coords.items()) or "rank 0"


def fold_coords(coords: Sequence[Mapping[str, int]]) -> str:
    """Several ranks in a few words: ``gpus 0-3``, ``hosts=1 gpus 0,2``.

    A dim that is 0 for all of them is left out (``hosts=0`` on one machine says nothing), except the
    last one. If the ranks do not form a box (every combination of the per-dim values), they are
    listed, at most 8 of them.
    """
    if not coords or not coords[0]:
        return "rank 0" if len(coords) <= 1 else f"{len(coords)} ranks"
    dims = list(coords[0])
    per_dim = {d: sorted({c.get(d, 0) for c in coords}) for d in dims}
    box = 1
    for vs in per_dim.values():
        box *= len(vs)
    if box != len({tuple(c.items()) for c in coords}):
        shown = "; ".join(format_coords(c) for c in coords[:8])
        return shown + (f" (+{len(coords) - 8})" if len(coords) > 8 else "")
    parts = []
    for i, d in enumerate(dims):
        vs = per_dim[d]
        if vs == [0] and i < len(dims) - 1:
            continue
        parts.append(f"{d}={vs[0]}" if len(vs) == 1 else f"{d} {_ranges(vs)}")
    return " ".join(parts)


def _ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out, start, prev = [], values[0], values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(out)


class MeshError(Exception):
    """Base class of all jupyter_mesh errors."""


@dataclass(frozen=True)
class RemoteFailure:
    """One rank's exception: what was raised where, with the remote traceback as text."""

    coords: Mapping[str, int]
    actor: str
    endpoint: str
    exc_type: str
    message: str
    traceback: str
    exception: BaseException | None = field(default=None, compare=False)

    def where(self) -> str:
        return f"{self.actor}.{self.endpoint} on [{format_coords(self.coords)}]"


class ActorError(MeshError):
    """An endpoint raised on one or more remote ranks.

    ``failures`` holds one :class:`RemoteFailure` per failed rank; ``exception`` is the first remote
    exception when it could be unpickled here. The mesh stays usable.
    """

    def __init__(self, failures: Sequence[RemoteFailure], total: int | None = None):
        self.failures = list(failures)
        self.total = total
        first = self.failures[0]
        self.exception = first.exception
        self.actor, self.endpoint, self.coords = first.actor, first.endpoint, dict(first.coords)
        super().__init__(self._message())

    def _message(self) -> str:
        first = self.failures[0]
        head = f"{first.exc_type}: {first.message}" if first.message else first.exc_type
        if len(self.failures) == 1:
            where = first.where()
        else:
            ranks = "; ".join(format_coords(f.coords) for f in self.failures[:8])
            more = f" (+{len(self.failures) - 8} more)" if len(self.failures) > 8 else ""
            of = f" of {self.total}" if self.total else ""
            where = f"{first.actor}.{first.endpoint} on {len(self.failures)}{of} ranks [{ranks}{more}]"
        return (
            f"{head}\n  raised in {where}\n"
            f"Remote traceback (first failing rank):\n{first.traceback.rstrip()}\n"
            "The actors are still alive: fix the input or the endpoint and call again."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures, self.total))


@dataclass(frozen=True)
class Failure:
    """Why a rank stopped working: ``kind`` is one of exit, signal, heartbeat, agent, init, start, stopped
    (or ``delivery``: the rank works, one message did not reach it; see :class:`DeliveryError`)."""

    mesh: str
    coords: Mapping[str, int]
    kind: str
    detail: str
    traceback: str = ""
    exit_code: int | None = None
    signal: int | None = None

    def describe(self) -> str:
        if not self.mesh:  # a host's agent, not a rank
            return self.detail
        return f"[{format_coords(self.coords)}] {self.detail}"


@dataclass(frozen=True)
class MeshFailure(Failure):
    """What ``__supervise__`` and Monarch's ``unhandled_fault_hook`` receive: one rank's :class:`Failure`
    that also answers Monarch's questions (``mesh_name``, ``report()``, a ``str`` naming it)."""

    @classmethod
    def of(cls, failure: Failure) -> MeshFailure:
        if isinstance(failure, MeshFailure):
            return failure
        return cls(failure.mesh, failure.coords, failure.kind, failure.detail, failure.traceback,
                   failure.exit_code, failure.signal)  # fmt: skip

    @property
    def mesh_name(self) -> str:
        """The proc mesh the failed rank belongs to."""
        return self.mesh

    def report(self) -> str:
        """What happened, where, the remote traceback or last output if any, and what to do."""
        return SupervisionError([self]).args[0]

    def __str__(self) -> str:
        return f"MeshFailure(mesh={self.mesh!r}, rank=[{format_coords(self.coords)}], kind={self.kind}): {self.detail}"


_KIND_HINTS = {
    "exit": "the proc exited; look at its output above, then respawn the rank or re-create the mesh",
    "signal": "the proc was killed by a signal (OOM killer? kill -9?); respawn the rank or re-create the mesh",
    "heartbeat": "the proc or its host stopped answering; check the host, then respawn",
    "agent": "the host's agent is gone (with every proc of that host); spawn a new proc mesh: "
    "this_host(), LocalJob and attached hosts bring a fresh agent up for it; a SLURM job that ended needs a new SlurmJob",
    "init": "the actor's __init__ raised or overran its init_timeout; fix the constructor and spawn the actor mesh "
    "again (or respawn the ranks whose proc was killed)",
    "start": "the proc failed to start; check the preload modules and the environment",
    "stopped": "its proc mesh was stopped; spawn a new one",
}


class SupervisionError(MeshError):
    """One or more ranks failed (proc death, lost heartbeat, failed start or init).

    ``failures`` lists every failed rank that the call touched, not only the first.
    """

    def __init__(self, failures: Sequence[Failure], context: str = ""):
        self.failures = list(failures)
        self.context = context
        super().__init__(self._message())

    def _message(self) -> str:
        first = self.failures[0]
        meshes = list(dict.fromkeys(f.mesh for f in self.failures if f.mesh))
        if len(meshes) > 1:  # failures held for later, of several meshes: each line names its mesh
            what = f"{len(self.failures)} rank(s) of meshes " + ", ".join(f"'{m}'" for m in meshes)
        else:
            what = f"{len(self.failures)} rank(s) of mesh '{first.mesh}'" if first.mesh else "a host agent"
        lines = [f"{what} failed" + (f" {self.context}" if self.context else "") + ":"]
        several = len(meshes) > 1
        lines += [f"  {repr(f.mesh) + ' ' if several and f.mesh else ''}{f.describe()}" for f in self.failures[:16]]
        if len(self.failures) > 16:
            lines.append(f"  ... and {len(self.failures) - 16} more")
        with_tb = next((f for f in self.failures if f.traceback), None)
        if with_tb is not None:
            label = "Remote traceback" if with_tb.kind == "init" else "Last output of the proc"
            lines.append(f"{label}:\n" + with_tb.traceback.rstrip())
        lines.append("What to do: " + _KIND_HINTS.get(first.kind, "inspect the failure, then respawn"))
        return "\n".join(lines)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures, self.context))


class DeliveryError(MeshError):
    """A call (or spawn) could not be handed to some ranks, which are still alive and usable: the
    sender or the relaying agent failed to send it. ``failures`` (kind ``delivery``) say why, per rank.
    Nothing ran there, and no later call waits behind it: the call can simply be made again."""

    def __init__(self, failures: Sequence[Failure], context: str = ""):
        self.failures = list(failures)
        self.context = context
        first = self.failures[0]
        lines = [
            f"{len(self.failures)} rank(s) of mesh '{first.mesh}' did not get the message"
            + (f" {self.context}" if self.context else "")
            + " (their procs are alive):"
        ]
        lines += [f"  {f.describe()}" for f in self.failures[:16]]
        if len(self.failures) > 16:
            lines.append(f"  ... and {len(self.failures) - 16} more")
        lines.append(
            "What to do: nothing ran on those ranks; make the call again (a spawn: spawn the actor mesh "
            "again). If it keeps failing, report it."
        )
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures, self.context))


class MeshClosedError(MeshError):
    """The mesh (or runtime) was stopped by this program; it cannot be used any more."""


class MeshCancelledError(MeshError):
    """The call was cancelled here; the remote work was asked to stop (async endpoints are cancelled,
    sync endpoints get KeyboardInterrupt at their next Python instruction)."""


class MeshTimeoutError(MeshError, TimeoutError):
    """A wait ran out. ``phase`` is spawn, call, stop or transfer; ``seconds`` the limit."""

    def __init__(self, phase: str, seconds: float | None, what: str = ""):
        self.phase, self.seconds, self.what = phase, seconds, what
        limit = f"{seconds:g} s" if seconds is not None else "its limit"
        super().__init__(
            f"{phase} timed out after {limit}{': ' + what if what else ''}. "
            "Raise the timeout, or check the mesh with .state() / `jupyter-mesh status`."
        )

    def __reduce__(self) -> tuple[Any, ...]:  # raised in an endpoint, it travels back to the caller
        return (type(self), (self.phase, self.seconds, self.what))


class MeshValueError(MeshError, ValueError):
    """Bad input at the call site (unknown dim, index out of range, wrong shape)."""


class SerializationError(MeshError, TypeError):
    """An argument or return value could not be pickled (or unpickled)."""


class ProtocolError(MeshError):
    """A peer sent something this version does not understand."""


class MeshInterrupted(KeyboardInterrupt):
    """Ctrl-C (or the notebook's ■) while waiting on a call: the call was cancelled on its ranks.

    Still a ``KeyboardInterrupt``, so a script stops as usual; the message says what was cancelled,
    where it stopped and how fast, and which ranks still run (native code that ignores signals), with
    what to do. ``still_running`` holds their coordinates. In IPython it shows as that message alone."""

    def __init__(self, message: str, still_running: Sequence[Mapping[str, int]] = ()):
        super().__init__(message)
        self.still_running = [dict(c) for c in still_running]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.still_running))

    def _render_traceback_(self) -> list[str]:
        return [str(self)]
