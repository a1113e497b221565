"""Per-rank state of proc meshes and the stream of changes: what widgets, the sidebar and
``jupyter-mesh status`` render. Pure data and callbacks: no sockets, no Jupyter.

A rank is *starting* until its proc reports in, then *idle* or *busy* (calls from this controller in
flight), *paused* (an actor of it stopped in the debugger), *failed* (with a :class:`~jupyter_mesh.errors.Failure`), or *stopped*.
A rank's ``note`` says what a state alone cannot: an actor still in its ``__init__`` ("initializing
'trainer' (42 s)"), or a proc that does not answer because it is busy in native code.

While calls are out, a mesh's :class:`CallProgress` says which ranks are done and which are left,
from the moment a rank gets busy until none is: ranks answer as they finish (their agents report
them before a host's gathered reply), so "3/8 done" shows while the call runs, not after it.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from ..errors import Failure

__all__ = [
    "CallProgress",
    "HostInfo",
    "HostState",
    "MeshEvent",
    "MeshState",
    "ProcState",
    "RankState",
    "StateTracker",
    "host_address",
]


class ProcState(str, enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    PAUSED = "paused"  # an actor of the rank stopped in the debugger (``breakpoint()``); its note says where
    FAILED = "failed"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


_IN_CALL = (ProcState.BUSY, ProcState.PAUSED)  # a paused rank is still in its call


class HostState(str, enum.Enum):
    """A host agent as its meshes see it. Every state but ``up`` is final: the controller never takes
    back an agent it gave up on (a job starts a fresh one for the next mesh)."""

    UP = "up"
    UNREACHABLE = "unreachable"  # silent past the heartbeat timeout: a cut network, a stopped machine
    EXITING = "exiting"  # the agent said it is going (SIGTERM: scancel, a time limit)
    LOST = "lost"  # its process died (or it went for another reason)

    def __str__(self) -> str:
        return self.value


def host_address(agent: str) -> str:
    """What a view calls a host: the IP of a TCP agent (``tcp://10.0.0.3:41234`` -> ``10.0.0.3``),
    ``local`` for one on this machine's private sockets (``ipc://``)."""
    if agent.startswith("tcp://"):
        return agent[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
    return "local"


@dataclass(frozen=True)
class HostInfo:
    index: int  # the host's index in the mesh (``rank_host``)
    agent: str  # its agent's inbox: tcp://IP:PORT, or an ipc:// path on this machine
    state: HostState = HostState.UP
    why: str = ""  # why it is not up: the cause its ranks failed with

    @property
    def address(self) -> str:
        return host_address(self.agent)


JobDescription = Union[Mapping[str, Any], Callable[[], Mapping[str, Any]]]
"""``Job.describe()`` or the method itself (read at each snapshot: a keep_alive set later shows)."""


@dataclass(frozen=True)
class RankState:
    rank: int
    coords: Mapping[str, int]
    state: ProcState
    inflight: int = 0
    pid: int | None = None
    failure: Failure | None = None
    note: str = ""  # e.g. "initializing 'trainer' (42 s)", "no answer for 12 s, busy in native code ..."
    busy_s: float = 0.0  # how long it has been busy (0 unless busy)
    host: int = 0  # index into MeshState.hosts


@dataclass(frozen=True)
class CallProgress:
    """The calls out on a mesh, since a rank got busy while none was: ranks that finished, ranks left."""

    done: tuple[int, ...]
    left: tuple[int, ...]
    elapsed: float  # seconds since the first of these ranks got busy

    def __str__(self) -> str:
        left = ", ".join(map(str, self.left[:16])) + (", ..." if len(self.left) > 16 else "")
        return f"{len(self.done)}/{len(self.done) + len(self.left)} done, left: {left or '-'} ({self.elapsed:.1f} s)"


@dataclass(frozen=True)
class MeshState:
    """A snapshot of one proc mesh."""

    mesh_id: str
    name: str
    sizes: Mapping[str, int]
    ranks: tuple[RankState, ...]
    stopped: bool = False
    progress: CallProgress | None = None  # None while no call is out
    hosts: tuple[HostInfo, ...] = ()  # () when the runtime did not say (a tracker fed by hand)
    job: Mapping[str, Any] | None = None  # Job.describe(): kind, id (the scheduler's), keep_alive

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in ProcState}
        for r in self.ranks:
            out[r.state.value] += 1
        return out

    @property
    def failures(self) -> list[Failure]:
        return [r.failure for r in self.ranks if r.failure is not None]


@dataclass(frozen=True)
class MeshEvent:
    """One change. ``kind``: created, state, calls, failed, stopped, respawned, resized, note, host
    (``host`` is its index; ``note`` why it is no longer up).

    ``state`` is one rank's change (``rank``, ``coords``). ``calls`` is many ranks' at once, as calls
    start or end: ``ranks`` went from ``previous`` to ``state`` (idle to busy, or back) together. A
    call to 256 ranks is then one event when it is sent and one per gathered reply (per host or per
    subtree), not two per rank: views mark the mesh changed, and read ``ProcMesh.state()`` when they
    draw."""

    kind: str
    mesh_id: str
    name: str
    rank: int | None = None
    coords: Mapping[str, int] = field(default_factory=dict)
    state: ProcState | None = None
    previous: ProcState | None = None
    failure: Failure | None = None
    note: str = ""
    time: float = field(default_factory=time.time)
    host: int | None = None
    ranks: tuple[int, ...] = ()  # a ``calls`` event's ranks


Listener = Callable[[MeshEvent], None]


class _Wave:
    """Calls out on one mesh, from the moment a rank gets busy until every rank is done again."""

    __slots__ = ("done", "left", "since")

    def __init__(self, since: float):
        self.done: set[int] = set()
        self.left: set[int] = set()
        self.since = since


class _TrackedMesh:
    def __init__(self, mesh_id: str, name: str, sizes: dict[str, int], coords: list[dict[str, int]]):
        self.mesh_id, self.name, self.sizes, self.coords = mesh_id, name, sizes, coords
        n = len(coords)
        self.hosts: list[HostInfo] = []
        self.rank_host = [0] * n
        self.job: JobDescription | None = None
        self.state = [ProcState.STARTING] * n
        self.inflight = [0] * n
        self.pids: list[int | None] = [None] * n
        self.failures: list[Failure | None] = [None] * n
        self.notes = [""] * n  # from the agent: why the proc does not answer (busy)
        self.inits: list[dict[str, tuple[str, float]]] = [{} for _ in range(n)]  # actor id -> (name, since)
        self.busy_since: list[float | None] = [None] * n
        self.wave: _Wave | None = None
        self.stopped = False

    def moved(self, rank: int, old: ProcState, new: ProcState) -> None:
        """Keep the busy clocks and the current wave in step with a rank's state change (a paused
        rank is still in its call: busy for the wave)."""
        if new in _IN_CALL and old not in _IN_CALL:
            now = time.monotonic()
            self.busy_since[rank] = now
            if self.wave is None:
                self.wave = _Wave(now)
            self.wave.left.add(rank)
            self.wave.done.discard(rank)
        elif old in _IN_CALL and new not in _IN_CALL:
            self.busy_since[rank] = None
            w = self.wave
            if w is not None and rank in w.left:
                w.left.discard(rank)
                w.done.add(rank)
                if not w.left:
                    self.wave = None

    def count(self, ranks: Sequence[int], delta: int) -> Sequence[int]:
        """Calls to ``ranks`` started (+1) or ended (-1): the ranks that went busy (or idle) with it.

        On the call path, for every rank of every call: a few list operations per rank, one wave
        and busy-clock update per batch (not :meth:`moved` per rank)."""
        inflight, state = self.inflight, self.state
        if len(ranks) == 1:  # call_one, choose: the latency path
            return self._count_one(ranks, delta)
        if delta > 0:
            for r in ranks:
                inflight[r] += 1
            moved = [r for r in ranks if state[r] is ProcState.IDLE]
            if moved:
                now = time.monotonic()
                busy_since = self.busy_since
                for r in moved:
                    state[r] = ProcState.BUSY
                    busy_since[r] = now
                if self.wave is None:
                    self.wave = _Wave(now)
                self.wave.left.update(moved)
                self.wave.done.difference_update(moved)
            return moved
        for r in ranks:
            if inflight[r]:
                inflight[r] -= 1
        moved = [r for r in ranks if state[r] is ProcState.BUSY and not inflight[r]]
        if moved:
            busy_since = self.busy_since
            for r in moved:
                state[r] = ProcState.IDLE
                busy_since[r] = None
            w = self.wave
            if w is not None:
                ended = w.left.intersection(moved)
                w.left -= ended
                w.done |= ended
                if not w.left:
                    self.wave = None
        return moved

    def _count_one(self, ranks: Sequence[int], delta: int) -> Sequence[int]:
        """:meth:`count` for one rank, without the lists and set operations a batch needs."""
        r = ranks[0]
        if delta > 0:
            self.inflight[r] += 1
            if self.state[r] is not ProcState.IDLE:
                return ()
            now = time.monotonic()
            self.state[r], self.busy_since[r] = ProcState.BUSY, now
            w = self.wave
            if w is None:
                w = self.wave = _Wave(now)
            w.left.add(r)
            w.done.discard(r)
            return ranks
        if self.inflight[r]:
            self.inflight[r] -= 1
        if self.state[r] is not ProcState.BUSY or self.inflight[r]:
            return ()
        self.state[r], self.busy_since[r] = ProcState.IDLE, None
        w = self.wave
        if w is not None:
            if r in w.left:
                w.left.discard(r)
                w.done.add(r)
            if not w.left:
                self.wave = None
        return ranks

    def progress(self, now: float) -> CallProgress | None:
        w = self.wave
        if w is None:
            return None
        return CallProgress(tuple(sorted(w.done)), tuple(sorted(w.left)), now - w.since)

    def place(self, agents: Sequence[str], rank_host: Sequence[int]) -> None:
        """Where the ranks run: the agent per host index, the host index per rank. Hosts known
        already keep their state (a grown mesh keeps its lost host lost)."""
        if not agents:
            return
        known = {h.index: h for h in self.hosts}
        self.hosts = [known[i] if i in known and known[i].agent == a else HostInfo(i, a) for i, a in enumerate(agents)]
        self.rank_host = [int(h) for h in rank_host][: len(self.coords)]
        self.rank_host += [0] * (len(self.coords) - len(self.rank_host))

    def job_now(self) -> Mapping[str, Any] | None:
        job = self.job
        if job is None or not callable(job):
            return job
        try:
            return dict(job())
        except Exception:  # noqa: BLE001 - a view must render whatever a job's describe() does
            return None

    def forget_notes(self, rank: int) -> None:
        self.notes[rank] = ""
        self.inits[rank] = {}

    def note(self, rank: int, now: float) -> str:
        # (a copy, taken in one step: the receive thread adds and removes entries while a view reads them)
        inits = tuple(self.inits[rank].values())
        parts = [f"initializing '{name}' ({now - since:.0f} s)" for name, since in inits]
        if self.notes[rank]:
            parts.append(self.notes[rank])
        return "; ".join(parts)


class StateTracker:
    """Holds the state of every proc mesh of this controller and tells listeners what changed.

    Listeners run on the thread that caused the change (often the runtime's receive thread): they
    must be quick and must not block; a listener that raises is dropped from nothing, only logged.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # a rank's state, in-flight count and the mesh's wave change from two threads at once (the
        # caller's, starting a call; the receive thread, ending the last one): each change is made
        # whole under this lock (listeners run outside it)
        self._moves = threading.Lock()
        self._meshes: dict[str, _TrackedMesh] = {}
        self._listeners: list[tuple[str | None, Listener, frozenset[str] | None]] = []
        # which event kinds someone listens to (None in a listener's entry: all): the busy/idle changes
        # of every call are built into a ``calls`` event only when someone wants those
        self._wants_all = False
        self._wants: frozenset[str] = frozenset()

    # -- listeners --------------------------------------------------------------------------------
    def subscribe(
        self, fn: Listener, mesh_id: str | None = None, kinds: Collection[str] | None = None
    ) -> Callable[[], None]:
        """``fn(event)`` on every change (of ``mesh_id`` only, of ``kinds`` only, if given)."""
        entry = (mesh_id, fn, frozenset(kinds) if kinds is not None else None)
        with self._lock:
            self._listeners.append(entry)
            self._recount()

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._listeners:
                    self._listeners.remove(entry)
                    self._recount()

        return unsubscribe

    def _recount(self) -> None:
        self._wants_all = any(k is None for _, _, k in self._listeners)
        self._wants = frozenset().union(*(k for _, _, k in self._listeners if k is not None))

    def _emit(self, ev: MeshEvent) -> None:
        if not self._listeners:
            return
        for mesh_id, fn, kinds in list(self._listeners):
            if (mesh_id is None or mesh_id == ev.mesh_id) and (kinds is None or ev.kind in kinds):
                try:
                    fn(ev)
                except Exception:
                    import logging

                    logging.getLogger("jupyter_mesh.state").exception("state listener failed")

    # -- updates from the runtime -----------------------------------------------------------------
    def created(
        self,
        mesh_id: str,
        name: str,
        sizes: dict[str, int],
        coords: list[dict[str, int]],
        agents: Sequence[str] = (),
        rank_host: Sequence[int] = (),
        job: JobDescription | None = None,
    ) -> None:
        """A new mesh; ``agents`` (inbox per host index), ``rank_host`` (host index per rank) and
        ``job`` (``Job.describe`` or its result) say where its ranks run and who placed them."""
        e = _TrackedMesh(mesh_id, name, sizes, coords)
        e.place(agents, rank_host)
        e.job = job
        with self._lock:
            self._meshes[mesh_id] = e
        self._emit(MeshEvent("created", mesh_id, name))

    def host_lost(self, agent: str, state: HostState | str, why: str) -> None:
        """The agent ``agent`` is gone for good (``state``: unreachable, exiting, lost): every running
        mesh with a host there says so, with ``why``. Its ranks fail through :meth:`failed`."""
        state = HostState(state)
        for e in list(self._meshes.values()):
            if e.stopped:
                continue
            for i, h in enumerate(e.hosts):
                if h.agent == agent and h.state is HostState.UP:
                    e.hosts[i] = HostInfo(h.index, h.agent, state, why)
                    self._emit(MeshEvent("host", e.mesh_id, e.name, note=why, host=h.index))

    def _set(
        self, e: _TrackedMesh, rank: int, new: ProcState, kind: str = "state", failure: Failure | None = None
    ) -> None:
        with self._moves:
            old = e.state[rank]
            if old == new and failure is None:
                return
            e.state[rank] = new
            e.moved(rank, old, new)
        if self._wants_all or kind in self._wants:  # on the call path: build the event only for someone
            self._emit(MeshEvent(kind, e.mesh_id, e.name, rank, e.coords[rank], new, old, failure))

    def ready(self, mesh_id: str, rank: int, pid: int) -> None:
        e = self._meshes.get(mesh_id)
        if e is None or e.stopped:
            return
        e.pids[rank] = pid
        if e.state[rank] == ProcState.STARTING:
            self._set(e, rank, ProcState.BUSY if e.inflight[rank] else ProcState.IDLE)

    def note(self, mesh_id: str, rank: int, text: str) -> None:
        """The agent says why a proc does not answer (busy in native code), or "" once it does again."""
        e = self._meshes.get(mesh_id)
        if e is None or e.stopped or rank >= len(e.notes) or e.notes[rank] == text:
            return
        e.notes[rank] = text
        self._emit(MeshEvent("note", e.mesh_id, e.name, rank, e.coords[rank], e.state[rank], note=text))

    def paused(self, mesh_id: str, rank: int, where: str) -> None:
        """An actor of ``rank`` stopped in the debugger at ``where`` ("file:line"); the rest of the
        mesh runs on. Until :meth:`resumed`, calls starting or ending there leave it paused."""
        e = self._meshes.get(mesh_id)
        if e is None or e.stopped or rank >= len(e.state) or e.state[rank] in (ProcState.FAILED, ProcState.STOPPED):
            return
        e.notes[rank] = f"paused at {where}"
        if e.state[rank] == ProcState.PAUSED:  # another stop of the same rank: only the note changes
            self._emit(MeshEvent("note", e.mesh_id, e.name, rank, e.coords[rank], e.state[rank], note=e.notes[rank]))
        else:
            self._set(e, rank, ProcState.PAUSED)

    def resumed(self, mesh_id: str, rank: int) -> None:
        """No actor of ``rank`` is in the debugger any more: busy or idle as its calls say."""
        e = self._meshes.get(mesh_id)
        if e is None or e.stopped or rank >= len(e.state) or e.state[rank] != ProcState.PAUSED:
            return
        e.notes[rank] = ""
        self._set(e, rank, ProcState.BUSY if e.inflight[rank] else ProcState.IDLE)

    def initializing(self, mesh_id: str, ranks: list[int], actor_id: str, name: str = "", done: bool = False) -> None:
        """Actor ``actor_id`` (``name``) is being constructed on ``ranks`` (until called again with ``done``)."""
        e = self._meshes.get(mesh_id)
        if e is None or e.stopped:
            return
        now = time.monotonic()
        for r in ranks:
            if r >= len(e.inits) or (done and actor_id not in e.inits[r]):
                continue
            if done:
                del e.inits[r][actor_id]
            else:
                e.inits[r][actor_id] = (name, now)
            self._emit(MeshEvent("note", e.mesh_id, e.name, r, e.coords[r], e.state[r], note=e.note(r, now)))

    def refresh_inits(self) -> bool:
        """Re-announce the notes of ranks still initializing (their "(N s)" grew); False if none is."""
        now, any_left = time.monotonic(), False
        for e in list(self._meshes.values()):
            for r, inits in enumerate(list(e.inits)):
                if inits and not e.stopped:
                    any_left = True
                    self._emit(MeshEvent("note", e.mesh_id, e.name, r, e.coords[r], e.state[r], note=e.note(r, now)))
        return any_left

    def activity(self, mesh_id: str, ranks: Sequence[int], delta: int) -> None:
        """Calls from this controller to ``ranks`` started (+1) or finished (-1): one ``calls`` event
        for the ranks that went busy (or idle), if someone listens."""
        e = self._meshes.get(mesh_id)
        if e is None:
            return
        with self._moves:
            moved = e.count(ranks, delta)
        if moved and (self._wants_all or "calls" in self._wants):
            new, old = (ProcState.BUSY, ProcState.IDLE) if delta > 0 else (ProcState.IDLE, ProcState.BUSY)
            self._emit(MeshEvent("calls", e.mesh_id, e.name, state=new, previous=old, ranks=tuple(moved)))

    def failed(self, mesh_id: str, rank: int, failure: Failure) -> None:
        e = self._meshes.get(mesh_id)
        if e is None or e.stopped:
            return
        e.failures[rank] = failure
        e.inflight[rank] = 0
        e.forget_notes(rank)
        self._set(e, rank, ProcState.FAILED, "failed", failure)

    def respawned(self, mesh_id: str, rank: int, pid: int) -> None:
        e = self._meshes.get(mesh_id)
        if e is None:
            return
        e.failures[rank], e.pids[rank], e.inflight[rank] = None, pid, 0
        e.forget_notes(rank)
        self._set(e, rank, ProcState.IDLE, "respawned")

    def resized(
        self,
        mesh_id: str,
        sizes: dict[str, int],
        coords: list[dict[str, int]],
        agents: Sequence[str] = (),
        rank_host: Sequence[int] = (),
    ) -> None:
        e = self._meshes.get(mesh_id)
        if e is None:
            return
        n_old, n_new = len(e.coords), len(coords)
        e.sizes, e.coords = sizes, coords
        if agents:
            e.place(agents, rank_host)
        else:  # a tracker fed by hand: new ranks on host 0
            e.rank_host = (e.rank_host + [0] * n_new)[:n_new]
        if n_new > n_old:
            e.state += [ProcState.STARTING] * (n_new - n_old)
            e.inflight += [0] * (n_new - n_old)
            e.pids += [None] * (n_new - n_old)
            e.failures += [None] * (n_new - n_old)
            e.notes += [""] * (n_new - n_old)
            e.inits += [{} for _ in range(n_new - n_old)]
            e.busy_since += [None] * (n_new - n_old)
        else:
            del e.state[n_new:], e.inflight[n_new:], e.pids[n_new:], e.failures[n_new:]
            del e.notes[n_new:], e.inits[n_new:], e.busy_since[n_new:]
        e.wave = None  # its ranks are renumbered: start counting again
        self._emit(MeshEvent("resized", e.mesh_id, e.name))

    def stopped(self, mesh_id: str) -> None:
        e = self._meshes.get(mesh_id)
        if e is None or e.stopped:
            return
        e.stopped = True
        e.wave = None
        for r in range(len(e.state)):
            e.state[r] = ProcState.STOPPED
            e.inflight[r] = 0
            e.busy_since[r] = None
            e.forget_notes(r)
        self._emit(MeshEvent("stopped", e.mesh_id, e.name, state=ProcState.STOPPED))

    # -- reading ----------------------------------------------------------------------------------
    def snapshot(self, mesh_id: str) -> MeshState:
        e = self._meshes[mesh_id]
        now = time.monotonic()
        with self._moves:  # the wave's sets change under a call that starts or ends meanwhile
            progress = e.progress(now)
        ranks = tuple(
            RankState(
                r, e.coords[r], e.state[r], e.inflight[r], e.pids[r], e.failures[r], e.note(r, now),
                0.0 if (t := e.busy_since[r]) is None else now - t, e.rank_host[r],
            )
            for r in range(len(e.state))
        )  # fmt: skip
        return MeshState(e.mesh_id, e.name, dict(e.sizes), ranks, e.stopped, progress, tuple(e.hosts), e.job_now())

    def mesh_ids(self) -> list[str]:
        return list(self._meshes)
