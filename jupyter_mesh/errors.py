"""Every error jupyter_mesh raises, in one tree.

::

    MeshError                       base of everything below
    ├── ActorError                  an endpoint raised on a remote rank, and its caller gets it
    ├── SupervisionError            a rank is gone: its proc or host died or stopped answering (a peer
    │   │                           *broke* it), its actor died (``__init__`` raised, an error no caller
    │   │                           could receive), or its proc mesh or actor mesh was stopped
    │   │                           (also a builtin ``RuntimeError``, as in Monarch)
    │   └── MeshFailure             what the fault hook (and Monarch's ``unhandled_fault_hook``) gets:
    │                               a failure that no pending call was told about
    ├── DeliveryError               a message could not be handed to a rank that is still alive
    ├── ReduceError                 a reduce's op failed on the results it was given (in a host agent,
    │                               or in the caller)
    ├── MeshClosedError             the runtime or a job was shut down (or never started): it is
    │                               *closed* (also a ``RuntimeError``)
    ├── MeshTimeoutError            a wait ran out; ``phase`` says which (spawn, call, stop, transfer)
    │                               (also a builtin ``TimeoutError``)
    ├── MeshCancelledError          you cancelled the call (``Future.cancel()``, Ctrl-C, notebook ■)
    ├── MeshDeadlockError           a wait that could never end: ``get()`` on a pending future on the
    │                               receive thread, which alone reads its reply (a ``RuntimeError``)
    ├── UsageError-like subclasses of builtins for bad input at the call site:
    │   ├── MeshValueError          (ValueError) bad slice, unknown dim, wrong shape; where Monarch raises
    │   │   │                       another builtin, also that one, so either ``except`` catches it:
    │   │   ├── MeshIndexError      (IndexError) an index out of range (``slice(gpus=5)``)
    │   │   ├── MeshKeyError        (KeyError) a dim missing or unknown (``item()``, ``size(dim)``)
    │   │   └── MeshDimTypeError    (TypeError) ``slice()`` of a dim the mesh does not have
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
    "CallSite",
    "DeliveryError",
    "Failure",
    "MeshCancelledError",
    "MeshClosedError",
    "MeshDeadlockError",
    "MeshDimTypeError",
    "MeshError",
    "MeshFailure",
    "MeshIndexError",
    "MeshInterrupted",
    "MeshKeyError",
    "MeshTimeoutError",
    "MeshValueError",
    "ProtocolError",
    "ReduceError",
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
            on = f"[{format_coords(first.coords)}]"
        else:
            ranks = "; ".join(format_coords(f.coords) for f in self.failures[:8])
            more = f" (+{len(self.failures) - 8} more)" if len(self.failures) > 8 else ""
            of = f" of {self.total}" if self.total else ""
            on = f"{len(self.failures)}{of} ranks [{ranks}{more}]"
        # "Actor call a.b failed" is Monarch's wording, which programs match
        if all(f.exc_type == "FrameTooLarge" for f in self.failures):  # a result too large to send back
            todo = f"The actors are still alive, but {_TOO_LARGE_HINT}."
        else:
            todo = "The actors are still alive: fix the input or the endpoint and call again."
        return (
            f"{head}\n  Actor call {first.actor}.{first.endpoint} failed on {on}\n"
            f"Remote traceback (first failing rank):\n{first.traceback.rstrip()}\n{todo}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures, self.total))


@dataclass(frozen=True)
class Failure:
    """Why a rank stopped working: ``kind`` is one of exit, signal, heartbeat, agent, start, stopped (its
    proc), or init, died, broadcast, stopped (its actor ``actor``: the proc lives on). ``delivery``: the
    rank works, one message did not reach it (see :class:`DeliveryError`). ``relay``: the rank works,
    but a host agent that relayed the call to its host (in the middle of the fan-out tree) was lost. ``broadcast`` is reported
    also where the actor lives on (the kernel's default): an error no caller could receive."""

    mesh: str
    coords: Mapping[str, int]
    kind: str
    detail: str
    traceback: str = ""
    exit_code: int | None = None
    signal: int | None = None
    actor: str = ""  # the actor mesh, for a failure of one actor (its proc lives on)
    who: str = ""  # that actor as Monarch names it: ``module.Class name{'gpus': 0/4}``
    rank: int | None = None  # the failed rank's index in its proc mesh (row-major), where known

    @property
    def mesh_name(self) -> str:
        """Monarch's name for it: the actor mesh that failed, else the proc mesh."""
        return self.actor or self.mesh

    def report(self) -> str:
        """Monarch's user-readable report of this failure: where, and why."""
        return self.describe() + (f"\n{self.traceback.rstrip()}" if self.traceback else "")

    def describe(self, phrase: bool = True) -> str:
        """``[gpus=3] why``; an actor that ended is named with Monarch's phrase (which programs match),
        unless not ``phrase`` (a call's lead line names it already; the notebook is terser)."""
        if not self.mesh:  # a host's agent, not a rank
            return self.detail
        detail = self.detail
        if self.ended_actor and self.who and phrase:
            detail = f"The actor {self.who} and all its descendants have failed: {detail}"
        return f"[{format_coords(self.coords)}] {detail}"

    @property
    def ended_actor(self) -> bool:
        """Is this the end of one actor (its proc lives on), not of its proc or a mere report?"""
        return self.kind in ("init", "died") or (self.kind == "stopped" and bool(self.actor))


_KIND_HINTS = {
    "exit": "the proc exited; look at its output above, then respawn the rank or re-create the mesh",
    "signal": "the proc was killed by a signal (OOM killer? kill -9?); respawn the rank or re-create the mesh",
    "heartbeat": "the proc or its host stopped answering; check the host, then respawn",
    "agent": "the host's agent is gone (with every proc of that host); spawn a new proc mesh: "
    "this_host(), LocalJob and attached hosts bring a fresh agent up for it; a SLURM job that ended needs a new SlurmJob",
    "init": "the actor's __init__ raised or overran its init_timeout; fix the constructor and spawn the actor mesh "
    "again (or respawn the ranks whose proc was killed)",
    "died": "the actor died (an error no caller could receive, or a BaseException such as SystemExit); its proc "
    "lives on: spawn the actor mesh again",
    "broadcast": "an endpoint called with broadcast() raised, and a broadcast has no caller to receive it; fix "
    "the endpoint (use call() to get its errors back)",
    "start": "the proc failed to start, for the reason above: a stopped fork server or seed needs SIGCONT, an "
    "import error a fix to the preload modules or the environment; then spawn again",
    "stopped": "it was stopped; spawn a new one",
    "relay": "the proc lives on; call it again, on a slice without the lost host's ranks",
}


_ACTOR_KINDS = frozenset({"init", "died", "broadcast"})  # failures whose traceback is the actor's own


class SupervisionError(MeshError, RuntimeError):
    """One or more ranks failed (proc death, lost heartbeat, failed start or init, a dead actor) or were
    stopped.

    ``failures`` lists every failed rank that the call touched, not only the first. A ``RuntimeError``
    too, as Monarch's is.
    """

    def __init__(self, failures: Sequence[Failure], context: str = "", call: CallSite | None = None):
        self.failures = list(failures)
        self.context = context
        self.call = call
        super().__init__(self._message())

    def _message(self) -> str:
        first = self.failures[0]
        meshes = list(dict.fromkeys(f.mesh for f in self.failures if f.mesh))
        if len(meshes) > 1:  # failures held for later, of several meshes: each line names its mesh
            what = f"{len(self.failures)} rank(s) of meshes " + ", ".join(f"'{m}'" for m in meshes)
        else:
            what = f"{len(self.failures)} rank(s) of mesh '{first.mesh}'" if first.mesh else "a host agent"
        in_call = self.call is not None and bool(first.mesh)
        if in_call:  # Monarch's lead line, which programs match: the call, then the actor it reached
            assert self.call is not None
            lines = [f"Endpoint call {self.call.name}.{self.call.endpoint}() failed, The actor {self.call.who()} "
                     f"and all its descendants have failed: {what}:"]  # fmt: skip
        else:
            lines = [f"{what} failed" + (f" {self.context}" if self.context else "") + ":"]
        several = len(meshes) > 1
        lines += [
            f"  {repr(f.mesh) + ' ' if several and f.mesh else ''}{f.describe(phrase=not in_call)}"
            for f in self.failures[:16]
        ]
        if len(self.failures) > 16:
            lines.append(f"  ... and {len(self.failures) - 16} more")
        with_tb = next((f for f in self.failures if f.traceback), None)
        if with_tb is not None:
            label = "Remote traceback" if with_tb.kind in _ACTOR_KINDS else "Last output of the proc"
            lines.append(f"{label}:\n" + with_tb.traceback.rstrip())
        lines.append("What to do: " + _KIND_HINTS.get(first.kind, "inspect the failure, then respawn"))
        return "\n".join(lines)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures, self.context, self.call))


@dataclass(frozen=True)
class CallSite:
    """The endpoint call a :class:`SupervisionError` failed: actor mesh ``name``, its class, the endpoint."""

    name: str
    cls: str
    endpoint: str

    def who(self) -> str:
        return f"{self.cls} '{self.name}'" if self.cls else f"'{self.name}'"


class MeshFailure(SupervisionError):
    """A failure no pending call was told about, as the fault hook gets it (Monarch's ``MeshFailure``):
    ``mesh_name``, ``crashed_ranks`` and ``report()`` as there, and, being a ``SupervisionError``, it can
    be raised as it is (fail fast raises it at the next call)."""

    @property
    def mesh_name(self) -> str:
        """The actor mesh (or proc mesh) that failed."""
        return self.failures[0].mesh_name

    @property
    def mesh(self) -> None:
        """Monarch gives no mesh object here either (``mesh_name`` says which)."""
        return None

    @property
    def crashed_ranks(self) -> list[int]:
        """The failed ranks' indices in their proc mesh (row-major), as Monarch's repr lists them."""
        return [f.rank for f in self.failures if f.rank is not None]

    @property
    def crashed_coords(self) -> list[dict[str, int]]:
        """The failed ranks' coordinates (``{'gpus': 3}``), in the order of ``failures``."""
        return [dict(f.coords) for f in self.failures]

    def report(self) -> str:
        """Each failed rank's report (where, why, its traceback or last output), as Monarch's."""
        return "\n".join(f.report() for f in self.failures)

    def __repr__(self) -> str:
        kinds = ",".join(sorted({f.kind for f in self.failures}))
        where = "; ".join(format_coords(c) for c in self.crashed_coords[:8])
        return (
            f"MeshFailure(mesh_name={self.mesh_name!r}, crashed_ranks={self.crashed_ranks}, "
            f"coords=[{where}], kind={kinds})"
        )

    def __str__(self) -> str:
        """Named, as Monarch prints one (``__supervise__`` code logs ``str(failure)``), then the report."""
        return f"{self!r}: {super().__str__()}"

    def __getattr__(self, name: str) -> Any:
        """The first failure's fields (``kind``, ``coords``, ``detail``...): ``__supervise__`` gets a
        MeshFailure per failed rank, and code written for a :class:`Failure` keeps working."""
        if name in _FAILURE_FIELDS and self.failures:
            return getattr(self.failures[0], name)
        raise AttributeError(name)


_FAILURE_FIELDS = frozenset({"coords", "kind", "detail", "exit_code", "signal", "actor", "describe"})


_TOO_LARGE_HINT = (
    "a retry fails the same way: the message is larger than a peer over TCP accepts (JUPYTER_MESH_MAX_FRAME). "
    "Pass (or return) a large tensor as an RDMABuffer, whose bytes travel outside the message, send less per "
    "call, or raise JUPYTER_MESH_MAX_FRAME to the same value on every host and here"
)
"""What to do about a message refused for its size (``FrameTooLarge``, from ``_wire.channels``)."""


def _too_large(f: Failure) -> bool:
    """Was it not sent for its size? A delivery failure's detail ends with the error's repr."""
    return "FrameTooLarge(" in f.detail


class DeliveryError(MeshError):
    """A call (or spawn) could not be handed to some ranks, which are still alive and usable: the
    sender or the relaying agent failed to send it. ``failures`` (kind ``delivery``) say why, per rank.
    Nothing ran there, and no later call waits behind it: the call can simply be made again, unless
    the message was too large for a peer over TCP (``FrameTooLarge`` in a failure: the message says so)."""

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
        retry = "make the call again (a spawn: spawn the actor mesh again). If it keeps failing, report it."
        large = sum(_too_large(f) for f in self.failures)
        if large == len(self.failures):
            lines.append(f"What to do: nothing ran on those ranks, and {_TOO_LARGE_HINT}.")
        elif large:
            lines.append(
                f"What to do: nothing ran on those ranks. Where it was too large (FrameTooLarge), {_TOO_LARGE_HINT}; "
                f"elsewhere, {retry}"
            )
        else:
            lines.append(f"What to do: nothing ran on those ranks; {retry}")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures, self.context))


class ReduceError(MeshError):
    """A reduce's op raised (or its function did not unpickle, or too many folds of functions still
    ran there to start one more) while folding the results: ``op`` names it, ``where`` says where it ran
    (a host agent's address, or the caller), ``error`` what happened; ``hint``, when set, what to do."""

    def __init__(self, op: str, error: str, where: str, context: str = "", hint: str = ""):
        self.op, self.error, self.where, self.context, self.hint = op, error, where, context, hint
        super().__init__(
            f"the reduce op {op} failed in {where}"
            + (f" {context}" if context else "")
            + f": {error}\n"
            + (
                hint
                or "What to do: the op must take two results (or two partial results) of the endpoint and "
                "return one of the same kind; named ops: sum, prod, min, max. Use call() to see the results "
                "one by one."
            )
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.op, self.error, self.where, self.context, self.hint))


class MeshClosedError(MeshError, RuntimeError):
    """The runtime (or a job) was shut down by this program; it cannot be used any more. A stopped proc
    mesh or actor mesh fails its calls with :class:`SupervisionError` (kind ``stopped``), as in Monarch."""


class MeshCancelledError(MeshError):
    """The call was cancelled here; the remote work was asked to stop (async endpoints are cancelled,
    sync endpoints get KeyboardInterrupt at their next Python instruction)."""


class MeshDeadlockError(MeshError, RuntimeError):
    """A wait that could never end, refused at once instead of hanging: ``get()`` (or ``result()``,
    ``exception()``) on a future that is still pending, called on jupyter_mesh's receive thread (where
    done callbacks run), or ``await`` of one in an event loop run there. Its reply can only be read by
    that thread, which would be the one waiting. ``what`` is the future's call, ``thread`` the receive
    thread's name, ``how`` the wait (``get()`` or ``await``)."""

    def __init__(self, what: str, thread: str = "the receive thread", how: str = "get()"):
        self.what, self.thread, self.how = what, thread, how
        super().__init__(
            f"{how} on a pending future ({what}) from code running on jupyter_mesh's receive thread "
            f"({thread!r}; done callbacks run there): its reply can only be read by this very thread, so the "
            "wait could never end. What to do: chain instead, with add_done_callback(fn) on that future (fn "
            "runs once its reply is in), or call get() from a thread of your own or from an actor endpoint."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.what, self.thread, self.how))


class MeshTimeoutError(MeshError, TimeoutError):
    """A wait ran out. ``phase`` is spawn, call, stop or transfer; ``seconds`` the limit."""

    def __init__(self, phase: str, seconds: float | None, what: str = ""):
        self.phase, self.seconds, self.what = phase, seconds, what
        limit = f"{seconds:g} s" if seconds is not None else "its limit"
        said = what.rstrip(".")  # a cancel's report ends with a full stop of its own
        super().__init__(
            f"{phase} timed out after {limit}{': ' + said if said else ''}. "
            "Raise the timeout, or check the mesh with .state() / `jupyter-mesh status`."
        )

    def __reduce__(self) -> tuple[Any, ...]:  # raised in an endpoint, it travels back to the caller
        return (type(self), (self.phase, self.seconds, self.what))


class MeshValueError(MeshError, ValueError):
    """Bad input at the call site (unknown dim, index out of range, wrong shape)."""


class MeshIndexError(MeshValueError, IndexError):
    """An index out of range; an ``IndexError`` too, as Monarch raises there."""


class MeshKeyError(MeshValueError, KeyError):
    """A dim missing or unknown where a mapping's key is expected; a ``KeyError`` too, as Monarch raises
    there. Its text is the message itself (``KeyError`` would print it quoted)."""

    def __str__(self) -> str:
        return Exception.__str__(self)


class MeshDimTypeError(MeshValueError, TypeError):
    """``slice()`` of a dim the mesh does not have; a ``TypeError`` too, as Monarch raises there."""


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
