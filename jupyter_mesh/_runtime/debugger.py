"""The controller's side of remote pdb: which actors are paused in ``breakpoint()``, and their terminals.

Procs report a pause, pdb's output at each prompt and the end of a pause (``remote_pdb``; ``debug``
events through their agents). Here each paused actor is a :class:`PausedActor`: ``prompt()`` gives
what pdb printed, ``send(line)`` runs a pdb command and gives its output up to the next prompt (or
until the actor runs on). The state tracker shows the rank *paused at file:line* meanwhile. A proc that
dies while paused ends its sessions with the failure, so nobody waits on a prompt that will never come.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._core import future as _future
from .._core.future import time_left
from .._core.state import MeshEvent, StateTracker
from .._wire.protocol import Kind
from .._wire.transport import Message, Transport
from ..errors import Failure, MeshError, MeshTimeoutError, MeshValueError, SupervisionError
from .client import Client
from .records import MeshRecords

__all__ = ["Debugger", "PausedActor"]


@dataclass(eq=False)
class PausedActor:
    """One actor stopped in pdb: where, since when, and its pdb terminal (``prompt``/``send``)."""

    mesh: str  # the proc mesh's name
    mesh_id: str
    rank: int
    coords: dict[str, int]
    actor: str  # the actor's name in its mesh ("trainer")
    where: str  # "file:line" where it stopped
    since: float  # time.time() of the stop
    sid: str
    _debugger: Debugger = field(repr=False)
    _pending: list[str] = field(default_factory=list, repr=False)  # pdb output not taken yet
    _prompts: int = field(default=0, repr=False)  # prompts pdb showed
    _taken: int = field(default=0, repr=False)  # prompts whose output was taken
    _continued: bool = field(default=False, repr=False)  # cont() was sent: no longer counts as paused
    post_mortem: bool = False  # stopped where its endpoint raised (its caller gets the error after)
    attached: bool = False  # a front serves its prompt now (one at a time: ``claim``)
    attached_by: str = ""  # which front ("the notebook (kernel pid 12)", "jupyter-mesh debug (pid 34)")
    detached: bool = False  # a front left it paused (``detach``): it does not prompt by itself again
    ended: str = ""  # "" while paused; "resumed", or why it ended (the proc died)
    failure: Failure | None = None

    @property
    def label(self) -> str:
        """The rank as the notebook names it: "gpus=3" (coordinates), or "rank 3"."""
        return ",".join(f"{k}={v}" for k, v in self.coords.items()) or f"rank {self.rank}"

    @property
    def paused(self) -> bool:
        return not self.ended

    def prompt(self, timeout: float | None = 30.0) -> str:
        """What pdb printed since the last command, up to its prompt ("(Pdb) "); "" once it runs on."""
        return self._debugger.take(self, timeout)

    def send(self, line: str, timeout: float | None = 30.0) -> str:
        """Run one pdb command (``p x``, ``n``, ``c``...); its output up to pdb's next prompt, or all
        it printed before the actor ran on (after ``c``, or ``n`` over a slow line)."""
        return self._debugger.command(self, line, timeout)

    def has_output(self) -> bool:
        """Whether ``prompt()`` has something to wait for: pdb has not prompted yet, or printed since the
        last take (else it waits at a prompt whose output a front took already: after a ``detach``)."""
        with self._debugger._cond:
            return self._prompts == 0 or self._prompts > self._taken or bool(self.ended)

    def claim(self, by: str) -> str:
        """Take its prompt for the front ``by`` (one front at a time): "" if taken, else who has it."""
        with self._debugger._cond:
            if self.attached:
                return self.attached_by or "another front"
            self.attached, self.attached_by, self.detached = True, by, False
        self._debugger._tell(self)  # a cell waiting on it hears who has it
        return ""

    def release(self) -> None:
        """Give its prompt back (``claim``): a cell waiting on it may prompt for it again."""
        with self._debugger._cond:
            self.attached, self.attached_by = False, ""
        self._debugger._tell(self)

    def cont(self) -> None:
        """``continue``: let the actor run on, without waiting for anything (it leaves ``paused()``
        now: its own word that it runs on may come after the reply of the call it was in)."""
        self._debugger.send_line(self, "c")
        self._continued = True

    def __str__(self) -> str:
        return f"{self.actor} on {self.mesh} {self.label} paused at {self.where} for {time.time() - self.since:.0f} s"


class Debugger:
    """Paused actors of this controller's meshes (events from the receive thread)."""

    def __init__(self, state: StateTracker, meshes: MeshRecords, transport: Transport, client: Client):
        self._state, self._meshes, self._transport, self._client = state, meshes, transport, client
        self._cond = threading.Condition()
        self._sessions: dict[str, PausedActor] = {}  # "mesh/rank/sid" -> the paused actor
        self._stepping: dict[str, PausedActor] = {}  # ran on for one ``n``/``s``/``r``: will stop again
        self._listeners: list[Callable[[PausedActor], None]] = []
        self.embedded = False  # this controller lives in a proc (an actor's meshes): nothing prompts here
        self._version = 0  # grows with every pause, prompt and end: what ``wait_change`` waits on
        self._post_mortem = False  # set_post_mortem's last word: a respawned rank gets it too
        state.subscribe(self._on_state, kinds=("failed", "stopped", "respawned"))  # not every busy/idle

    # -- views ------------------------------------------------------------------------------------
    def paused(self) -> list[PausedActor]:
        """Every actor paused now, oldest stop first."""
        with self._cond:
            now = [s for s in self._sessions.values() if not s._continued]
        return sorted(now, key=lambda s: (s.since, s.mesh, s.rank))

    def any_paused(self) -> bool:
        return bool(self._sessions)

    def subscribe(self, fn: Callable[[PausedActor], None]) -> Callable[[], None]:
        """``fn(session)`` on every pause, prompt and end (from the receive thread: quick, no blocking)."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def wait_change(self, seen: int, timeout: float | None) -> int:
        """Block until some session paused, prompted or ended after version ``seen``; the version now."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen, timeout)
            return self._version

    # -- events (receive thread) ------------------------------------------------------------------
    def on_event(self, msg: Message, frames: list[Any]) -> None:
        h = msg.header
        mesh_id, rank, sid, ev = str(h.get("m")), h.get("rk"), str(h.get("sid")), h.get("ev")
        rec = self._meshes.get(mesh_id)
        if rec is None or not isinstance(rank, int) or rank >= len(rec.ref.proc_addrs):
            return
        key = f"{mesh_id}/{rank}/{sid}"
        with self._cond:
            s = self._sessions.get(key)
            if ev == "paused" and key in self._stepping:  # the same debugger, one step further
                s = self._sessions[key] = self._stepping.pop(key)
                s.where, s.since, s._continued = str(h.get("where", "?")), time.time(), False
            elif ev == "paused":
                s = self._sessions[key] = PausedActor(
                    rec.ref.name, rec.ref.mesh_id, rank, dict(rec.ref.coords(rank)), str(h.get("an", "")),
                    str(h.get("where", "?")), time.time(), sid, self, post_mortem=bool(h.get("pm")),
                )  # fmt: skip
            elif s is None:
                return
            elif ev == "out":
                s._pending.append(str(h.get("out", "")))
                s._prompts += 1
            elif ev == "resumed":
                s._pending.append(str(h.get("out", "")))
                del self._sessions[key]
                if h.get("step"):
                    self._stepping[key] = s
                else:
                    s.ended = "resumed"
            self._version += 1
            self._cond.notify_all()
        if ev == "paused" and self.embedded:
            # a mesh an actor spawned: no front reaches this controller (inside a proc), so rather than
            # leave the actor stopped for good, it runs on, and the owner's output says so
            self._to_proc(s, {"src": {}})
            self._to_proc(s, {"line": "c"})
            print(
                f"jupyter_mesh: {s.actor} on {s.mesh} {s.label} reached a breakpoint at {s.where}, in a mesh an "
                "actor spawned; debugging those is not supported yet, so it runs on",
                file=sys.stderr,
            )
            return
        if ev == "paused":
            self._send_sources(s)
            if _future.pause_hook is None and s._prompts == 0:  # no front prompts by itself: say how to reach it
                print(
                    f"jupyter_mesh: {s}; `jupyter-mesh debug` in a shell or jupyter_mesh.debug.paused() drives its pdb",
                    file=sys.stderr,
                )
        if ev in ("paused", "resumed"):
            self._show_state(mesh_id, rank)
        self._tell(s)

    def _send_sources(self, s: PausedActor) -> None:
        """The lines of the file it stopped in, if it exists only here (a notebook cell's code)."""
        filename = s.where.rpartition(":")[0]
        lines = [] if os.path.isfile(filename) else linecache.getlines(filename)
        if sum(map(len, lines)) > 32_000:  # one control message stays small: listings go without
            lines = []
        self._to_proc(s, {"src": {filename: lines} if lines else {}})

    def _show_state(self, mesh_id: str, rank: int) -> None:
        with self._cond:
            left = [s for s in self._sessions.values() if s.mesh_id == mesh_id and s.rank == rank]
        if left:
            self._state.paused(mesh_id, rank, left[-1].where)
        else:
            self._state.resumed(mesh_id, rank)

    def _on_state(self, ev: MeshEvent) -> None:
        """A rank failed, stopped or was respawned: its pauses are over."""
        if ev.kind not in ("failed", "stopped", "respawned"):
            return
        if ev.kind == "respawned" and ev.rank is not None and self._post_mortem:
            self._post_mortem_to(ev.mesh_id, ev.rank)
        whole = ev.kind == "stopped" or ev.rank is None
        with self._cond:
            every = [*self._sessions.values(), *self._stepping.values()]
            gone = [s for s in every if s.mesh_id == ev.mesh_id and (whole or s.rank == ev.rank)]
            for s in gone:
                s.ended = f"{ev.kind}: {ev.failure.detail}" if ev.failure else ev.kind
                s.failure = ev.failure
                key = f"{s.mesh_id}/{s.rank}/{s.sid}"
                self._sessions.pop(key, None)
                self._stepping.pop(key, None)
            if gone:
                self._version += 1
                self._cond.notify_all()
        for s in gone:
            self._tell(s)

    def _post_mortem_to(self, mesh_id: str, rank: int) -> None:
        """A respawned rank is the same rank to the user: it keeps post-mortem debugging. ``respawn()``
        emits this on its caller's thread before it returns: waiting for the proc's answer there means
        a call made after it (directly, or relayed by an agent) finds the setting on."""
        rec = self._meshes.get(mesh_id)
        if rec is None or rank >= len(rec.ref.proc_addrs) or not rec.ref.proc_addrs[rank]:
            return
        what = f"post-mortem on for respawned rank {rank} of {rec.ref.name}"
        fut = self._client.request(rec.ref.proc_addrs[rank], {"k": Kind.DEBUG_IN, "pm": True}, what=what)
        if threading.current_thread().name != "jupyter-mesh-recv":  # never block the receive thread
            try:
                fut.get(10.0)
            except MeshError:  # it died again: nothing of it to debug
                pass

    def _tell(self, s: PausedActor) -> None:
        for fn in list(self._listeners):
            try:
                fn(s)
            except Exception:  # noqa: BLE001 - a front's listener must not break the receive thread
                pass

    # -- commands (caller's thread) ---------------------------------------------------------------
    def send_line(self, s: PausedActor, line: str) -> None:
        if s.ended:
            raise self._ended_error(s)
        # bytes that are not UTF-8 (a terminal's stray input arrives as lone surrogates) cannot go on
        # the wire: pdb gets "?" for them and says what it makes of the line
        self._to_proc(s, {"line": line.encode("utf-8", "replace").decode("utf-8")})

    def _to_proc(self, s: PausedActor, body: dict[str, Any]) -> None:
        rec = self._meshes.get(s.mesh_id)
        addr = rec.ref.proc_addrs[s.rank] if rec is not None and s.rank < len(rec.ref.proc_addrs) else ""
        if addr:
            self._transport.send(addr, Message({"k": Kind.DEBUG_IN, "sid": s.sid, **body}))

    def command(self, s: PausedActor, line: str, timeout: float | None) -> str:
        with self._cond:
            s._taken = s._prompts  # output of earlier prompts is not this command's
            s._pending.clear()
        self.send_line(s, line)
        return self.take(s, timeout)

    def take(self, s: PausedActor, timeout: float | None) -> str:
        with self._cond:
            if not self._cond.wait_for(lambda: s._prompts > s._taken or bool(s.ended), timeout):
                raise MeshTimeoutError("debug", timeout, f"pdb of {s.actor} on {s.mesh} {s.label}")
            s._taken = s._prompts
            out, s._pending[:] = "".join(s._pending), []
        if s.failure is not None:
            raise SupervisionError([s.failure], f"while {s.actor} was paused in the debugger at {s.where}")
        return out

    def set_post_mortem(self, on: bool, timeout: float = 10.0) -> int:
        """Post-mortem debugging on every running proc of this controller's meshes, once each has
        answered (calls sent after this find it set), and on the procs that respawn their ranks
        later; how many did."""
        self._post_mortem = on
        asked = []
        for rec in list(self._meshes.values()):
            if rec.stopped:
                continue
            for rank, addr in enumerate(rec.ref.proc_addrs):
                if addr and rank not in rec.failures:
                    what = f"post-mortem {'on' if on else 'off'} for rank {rank} of {rec.ref.name}"
                    asked.append(self._client.request(addr, {"k": Kind.DEBUG_IN, "pm": on}, what=what))
        deadline = time.monotonic() + timeout
        n = 0
        for fut in asked:
            try:
                fut.get(time_left(deadline))
                n += 1
            except MeshError:  # a rank that died or does not answer: it has no calls to stop either
                pass
        return n

    def continue_all(self) -> int:
        """``continue`` every paused actor; how many there were."""
        sessions = self.paused()
        for s in sessions:
            try:
                s.cont()
            except (MeshValueError, SupervisionError):
                pass
        return len(sessions)

    @staticmethod
    def _ended_error(s: PausedActor) -> Exception:
        if s.failure is not None:
            return SupervisionError([s.failure], f"while {s.actor} was paused in the debugger at {s.where}")
        return MeshValueError(
            f"{s.actor} on {s.mesh} {s.label} is no longer paused ({s.ended}); "
            "see jupyter_mesh.debug.paused() for the actors paused now"
        )
