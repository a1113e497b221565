"""A kept-alive agent (``SlurmJob(keep_alive=True)``) outlives its controller and waits for the next one.

Without it an agent whose controller goes (a kernel restart, a crash) kills its procs and exits, and
the allocation ends. Kept alive, it *detaches* instead: a controller that stops on purpose says so
(``DETACH``), one that dies goes silent past three heartbeat timeouts. Detached, the agent sends
nothing (no queue grows for a dead peer), keeps watching its procs, and waits until the scheduler ends
the job (its time limit) or a new controller takes it over.

A ``REATTACH`` names the new controller's address. It is signed with the session's key, like every
message, so only the user (who holds the job's 0600 key file) can send one, and the replay guard drops
an old one sent again. The agent answers with a hello that carries what it hosts — every mesh, and per
rank its address, pid, and whether it lives (and if not, how it ended) — and reports to the new
controller from then on. A controller still heard from is not taken over unless the new one says
``force``: two kernels must not drive one job by accident; when forced, the old one is told why.
One that went silent (a kernel killed a moment ago) may be dead or only late, and the agent cannot
tell yet: the reattach is held, and the new controller told it waits, until the old one either
answers its next heartbeat (then the reattach is refused, within a quarter of the heartbeat timeout)
or stays silent for the whole heartbeat timeout (then it is taken for dead and the job taken over).

A controller that lost the job (it was stopped — SIGSTOP, swapping — or forced out) may wake up and
go on: whatever it sends from then on (heartbeats, casts, stops; by its epoch) is dropped here and
in the procs, and it is told, so its calls fail naming the new one. One that was only silent, whose
job nobody took meanwhile, is reported to again when its heartbeats come back, with the proc exits
it missed.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from .._wire.addresses import parse_tcp
from .._wire.protocol import Kind
from .._wire.transport import Message
from .agent_state import describe_exit, hello

if TYPE_CHECKING:
    from .._wire.transport import Transport
    from .agent_state import HostedMesh, ProcEntry

__all__ = ["Keeper"]


class KeptAgent(Protocol):
    """What the keeper needs of its agent."""

    cfg: dict[str, Any]
    transport: Transport
    controller: str
    last_controller: float
    hb_timeout: float
    lock: threading.RLock
    meshes: dict[str, HostedMesh]
    procs: dict[tuple[str, int], ProcEntry]

    def _event(self, header: dict[str, Any], obj: Any = None) -> None: ...


class Keeper:
    """Whether an agent outlives its controller, and its hand-over to the next one."""

    def __init__(self, agent: KeptAgent, enabled: bool):
        self.agent = agent
        self.enabled = enabled
        self.detached = False
        self.on_purpose = False  # detached by a DETACH (the controller went), not by its silence
        # the epoch of the controller this agent reports to: learned from its first heartbeat, then set
        # by each reattach. A SHUTDOWN or DETACH from another one must not end or detach the job
        self.owner_epoch: str | None = None
        self.nonce = ""  # of the reattach this agent answered last: a DETACH for an older one is late
        self.deposed: dict[str, str] = {}  # controllers that lost this job (epoch -> address)
        self._told: dict[str, float] = {}  # when each of them was last told so
        self.missed: list[tuple[dict[str, Any], Any]] = []  # proc exits while the controller was silent
        # reattaches held while the controller is silent but not yet past the heartbeat timeout
        self._held: list[Message] = []
        self._held_lock = threading.RLock()

    def from_owner(self, msg: Message) -> bool:
        if self.owner_epoch is None or msg.header.get("se") == self.owner_epoch:
            return True
        print(
            f"jupyter-mesh agent: ignored '{msg.header.get('k')}' from a controller that no longer drives this job",
            file=sys.stderr,
            flush=True,
        )
        return False

    def refuses(self, msg: Message) -> bool:
        """A message from a controller that lost this job (all but a reattach): dropped, since its
        calls must not run under the new owner, and that controller is told why (once a second)."""
        se = msg.header.get("se")
        if se not in self.deposed or msg.header.get("k") == Kind.REATTACH:
            return False
        a = self.agent
        a.transport.stats.dropped_deposed += 1
        now = time.monotonic()
        if now - self._told.get(se, 0.0) >= 1.0:
            self._told[se] = now
            self._tell_taken(self.deposed[se], a.controller)
        return True

    def on_heartbeat(self, msg: Message) -> bool:
        """Whether a heartbeat counts (and is answered): only the owner's. One that comes back after
        a silence that detached this agent, with nobody having taken the job, is reported to again."""
        if not self.enabled:
            return True
        se = msg.header.get("se")
        if self.owner_epoch is None:
            self.owner_epoch = se  # the controller that started the job
        if se != self.owner_epoch or (self.detached and self.on_purpose):
            return False  # a key holder this job does not report to, or one that said it goes
        if self._held:
            self._refuse_held("it answered heartbeats while the reattach waited")
        if self.detached:
            self.detached = False
            missed, self.missed = self.missed, []
            print("jupyter-mesh agent: the controller is back; reporting to it again", file=sys.stderr, flush=True)
            for header, obj in missed:
                self.agent._event(header, obj)
        return True

    def hold(self, header: dict[str, Any], obj: Any) -> None:
        """An event while detached: a proc's exit is kept for a controller that comes back (bounded)."""
        if not self.on_purpose and header.get("k") == Kind.PROC_EXIT and len(self.missed) < 4096:
            self.missed.append((header, obj))

    def controller_silent(self, for_s: float) -> bool:
        """The controller has been silent for ``for_s`` (past the limit): True when the agent lives on."""
        if not self.enabled:
            return False
        if not self.detached:
            self._detach(f"no heartbeat from the controller for {for_s:.0f} s")
        return True

    def on_detach(self, msg: Message, frames: list[Any]) -> None:
        nonce = msg.header.get("nonce")
        if nonce is not None and nonce != self.nonce:
            return  # the answer to a reattach that gave up, overtaken by a newer one
        if self.enabled and self.from_owner(msg):
            self._detach("the controller detached (it stopped, keeping this job alive)", on_purpose=True)
            self._release_held(time.monotonic())  # a reattach that waited for it takes the job now

    def _detach(self, why: str, on_purpose: bool = False) -> None:
        a = self.agent
        self.detached, self.on_purpose = True, on_purpose
        if on_purpose:
            self.missed.clear()
        a.transport.forget(a.controller)  # what it queued for the gone controller is dropped
        print(f"jupyter-mesh agent: {why}; keeping the procs and waiting to be reattached", file=sys.stderr, flush=True)

    def _tell_taken(self, old: str, new: str) -> None:
        a = self.agent
        gone = {"k": Kind.AGENT_GONE, "addr": a.transport.address, "why": f"a controller at {new} took it over"}
        try:
            a.transport.send(old, Message(gone))
            a.transport.forget(old, linger_ms=1000)
        except Exception:  # noqa: BLE001 - an address we cannot reach: it is gone
            pass

    def on_reattach(self, msg: Message, frames: list[Any]) -> None:
        with self._held_lock:
            self._decide(msg, time.monotonic())

    def _decide(self, msg: Message, now: float) -> None:
        a = self.agent
        h = msg.header
        new, nonce, force = h.get("controller"), h.get("nonce"), h.get("force") is True
        try:
            if not (isinstance(new, str) and len(new) < 200 and isinstance(nonce, str) and len(nonce) <= 128):
                raise ValueError("a bad controller address or nonce")
            parse_tcp(new)
        except ValueError as e:
            print(f"jupyter-mesh agent: ignored a reattach: {e}", file=sys.stderr, flush=True)
            return
        cfg = {**a.cfg, "nonce": nonce}
        silent = now - a.last_controller
        if not self.enabled:
            self._refuse(msg, "this job was not started with keep_alive=True, so it cannot be reattached")
            return
        if not self.detached and silent < a.hb_timeout and new != a.controller and not force:
            self._hold(msg, silent)
            return
        old, old_epoch, epoch = a.controller, self.owner_epoch, str(h.get("se"))
        if new != old and not (self.detached and self.on_purpose):
            # forced, or only silent (stopped, swapping): it may wake up, and must hear it lost this host
            self._tell_taken(old, new)
        if old_epoch is not None and old_epoch != epoch:
            self._depose(old_epoch, old)
        self.deposed.pop(epoch, None)
        a.controller, a.last_controller, self.detached, self.on_purpose = new, time.monotonic(), False, False
        self.owner_epoch, self.nonce = epoch, nonce
        self.missed.clear()  # what the new controller needs, the hello says
        print(f"jupyter-mesh agent: reattached by {new}", file=sys.stderr, flush=True)
        a._event(hello(cfg, a.transport.address, hosted=self.hosted()))

    # -- a reattach while the controller is silent, but not yet past the heartbeat timeout -----------
    def _hold(self, msg: Message, silent: float) -> None:
        """Wait for the old controller's next heartbeat (refused then) or the end of the heartbeat
        timeout (taken over then: ``tick``); the new controller hears that it waits, and how long."""
        a = self.agent
        with self._held_lock:
            self._held = [m for m in self._held if m.header.get("controller") != msg.header["controller"]]
            self._held.append(msg)
            del self._held[:-16]  # bounded: only key holders can send these, but still
        wait = max(0.0, a.hb_timeout - silent)
        note = (
            f"its controller at {a.controller} was last heard from {silent:.1f} s ago: waiting up to "
            f"{wait:.1f} s for it to answer (then this job is refused) or to be taken for dead (then this "
            f"controller takes the job over)"
        )
        cfg = {**a.cfg, "nonce": msg.header["nonce"]}
        a.transport.send(msg.header["controller"], Message(hello(cfg, a.transport.address, waiting=note)))
        print(
            f"jupyter-mesh agent: a reattach by {msg.header['controller']} waits: {note}", file=sys.stderr, flush=True
        )

    def tick(self, now: float) -> None:
        """The agent's heartbeat tick: held reattaches take the job once its controller was silent
        for the whole heartbeat timeout."""
        if self._held and (self.detached or now - self.agent.last_controller >= self.agent.hb_timeout):
            self._release_held(now)

    def _take_held(self) -> list[Message]:
        with self._held_lock:
            held, self._held = self._held, []
        return held

    def _release_held(self, now: float) -> None:
        """Decide the held reattaches again, in order: the first takes the job (its controller is
        taken for dead or detached); any later one waits again, for the new owner's heartbeats."""
        with self._held_lock:  # one decision at a time: the receive thread may be deciding another
            for msg in self._take_held():
                self._decide(msg, max(now, time.monotonic()))

    def _refuse_held(self, why: str) -> None:
        a = self.agent
        with self._held_lock:
            for msg in self._take_held():
                self._refuse(
                    msg,
                    f"this job is still driven by a live controller at {a.controller} ({why}); stop or restart "
                    f"that kernel first, or reattach with force=True to take it over",
                )

    def _refuse(self, msg: Message, why: str) -> None:
        a = self.agent
        new = msg.header["controller"]
        a.transport.send(new, Message(hello({**a.cfg, "nonce": msg.header["nonce"]}, a.transport.address, why)))
        a.transport.forget(new, linger_ms=1000)

    def _depose(self, epoch: str, addr: str) -> None:
        """From now on nothing of the controller at ``addr`` runs here, nor in this host's procs."""
        a = self.agent
        self.deposed[epoch] = addr
        while len(self.deposed) > 64:
            del self.deposed[next(iter(self.deposed))]
        with a.lock:
            procs = [p.addr for p in a.procs.values() if p.alive and p.up]
        for addr in procs:
            a.transport.send(addr, Message({"k": Kind.NOTICE, "what": "deposed", "ep": epoch}))

    def hosted(self) -> dict[str, Any]:
        """Every mesh this agent hosts: its name, shape and, per rank, [rank, address, pid, lives, how it ended]."""
        a = self.agent
        out: dict[str, Any] = {}
        with a.lock:
            for mesh in a.meshes.values():
                ranks = []
                for r in mesh.ranks:
                    p = a.procs.get((mesh.mesh_id, r))
                    if p is None:
                        continue
                    lives = p.alive and p.up and not p.stopping
                    ended = "" if lives else describe_exit(p, p.exit_code, p.exit_signal)
                    ranks.append([r, p.addr, p.pid, lives, ended])
                out[mesh.mesh_id] = {"name": mesh.name, "shape": mesh.spawn_cfg.get("shape"), "ranks": ranks}
        return out
