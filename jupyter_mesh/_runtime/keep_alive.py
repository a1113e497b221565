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
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Protocol

from .._wire.addresses import parse_tcp
from .._wire.protocol import Kind
from .._wire.transport import Message
from .agent_state import describe_exit, hello

if TYPE_CHECKING:
    import threading

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
        # the epoch of the controller that took this agent over: a SHUTDOWN or DETACH from an earlier
        # one (it lost the job, and may not know yet) must not end or detach the job under the new one
        self.owner_epoch: str | None = None

    def from_owner(self, msg: Message) -> bool:
        if self.owner_epoch is None or msg.header.get("se") == self.owner_epoch:
            return True
        print(
            f"jupyter-mesh agent: ignored '{msg.header.get('k')}' from a controller that no longer drives this job",
            file=sys.stderr,
            flush=True,
        )
        return False

    def controller_silent(self, for_s: float) -> bool:
        """The controller has been silent for ``for_s`` (past the limit): True when the agent lives on."""
        if not self.enabled:
            return False
        if not self.detached:
            self._detach(f"no heartbeat from the controller for {for_s:.0f} s")
        return True

    def on_detach(self, msg: Message, frames: list[Any]) -> None:
        if self.enabled and self.from_owner(msg):
            self._detach("the controller detached (it stopped, keeping this job alive)")

    def _detach(self, why: str) -> None:
        a = self.agent
        self.detached = True
        a.transport.forget(a.controller)  # what it queued for the gone controller is dropped
        print(f"jupyter-mesh agent: {why}; keeping the procs and waiting to be reattached", file=sys.stderr, flush=True)

    def on_reattach(self, msg: Message, frames: list[Any]) -> None:
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
        silent = time.monotonic() - a.last_controller
        refused = ""
        if not self.enabled:
            refused = "this job was not started with keep_alive=True, so it cannot be reattached"
        elif not self.detached and silent < a.hb_timeout and new != a.controller and not force:
            refused = (
                f"this job is still driven by a live controller at {a.controller} (heard from {silent:.1f} s ago); "
                f"stop or restart that kernel first, or reattach with force=True to take it over"
            )
        if refused:
            a.transport.send(new, Message(hello(cfg, a.transport.address, refused)))
            a.transport.forget(new, linger_ms=1000)
            return
        old = a.controller
        if not self.detached and new != old:  # forced: the old controller hears it lost this host, and why
            a.transport.send(
                old,
                Message(
                    {"k": Kind.AGENT_GONE, "addr": a.transport.address, "why": f"a controller at {new} took it over"}
                ),
            )
            a.transport.forget(old, linger_ms=1000)
        a.controller, a.last_controller, self.detached = new, time.monotonic(), False
        self.owner_epoch = str(h.get("se"))
        print(f"jupyter-mesh agent: reattached by {new}", file=sys.stderr, flush=True)
        a._event(hello(cfg, a.transport.address, hosted=self.hosted()))

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
