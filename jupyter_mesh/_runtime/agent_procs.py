"""The host agent's watch over its procs and its fork server: heartbeats to procs (busy or hung),
deaths (an exit the template reports, a proc declared dead, the template itself dying) and what a dead
proc left in its pipes. A mixin of ``agent.Agent``, which owns the state and the threads; this module
is what runs on its I/O thread for liveness, kept apart from the relaying and the start/stop requests.
"""

from __future__ import annotations

import collections
import selectors
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from .._wire.protocol import BROKEN, Kind
from .._wire.serialize import dumps
from .._wire.transport import Message
from .agent_state import ProcEntry, describe_exit, kill
from .liveness import NOTE_EVERY

if TYPE_CHECKING:
    from .._wire.transport import Transport
    from ..errors import Failure
    from .adopted import Adopted
    from .agent_state import HostedMesh
    from .forkserver import ForkServer
    from .inboxes import ActorInboxes
    from .keep_alive import Keeper
    from .quiet import QuietProcs
    from .relay import Relay

__all__ = ["ProcWatch"]


class ProcWatch:
    """Liveness of an agent's procs and template (mixed into ``Agent``, whose attributes these are)."""

    lock: threading.RLock
    procs: dict[tuple[str, int], ProcEntry]
    by_pid: dict[int, ProcEntry]
    meshes: dict[str, HostedMesh]
    forkserver: ForkServer
    adopted: Adopted
    sel: selectors.BaseSelector
    relay: Relay
    inboxes: ActorInboxes
    transport: Transport
    keeper: Keeper
    quiet: QuietProcs
    hb_timeout: float
    hb_interval: float
    controller_silence: float
    last_controller: float
    last_tick: float
    shutting_down: bool

    if TYPE_CHECKING:

        def _event(self, header: dict[str, Any], obj: Any = None) -> None: ...
        def _check_waiters(self, mesh: HostedMesh) -> None: ...
        def _maybe_stopped(self, mesh: HostedMesh) -> None: ...
        def _pipe_readable(self, fd: int, p: ProcEntry, stream: int, buf: bytearray) -> bool: ...
        def shutdown(self, orphaned: bool = True) -> None: ...
        def failure(
            self, p: ProcEntry, kind: str, detail: str, code: int | None = None, sig: int | None = None
        ) -> Failure: ...

    def _template_died(self) -> None:
        """The fork server died (its procs die with it, by PR_SET_PDEATHSIG): report each of them with
        that cause, fail starts still waiting for a fork, and start a new fork server so the host
        stays usable (respawn, new meshes)."""
        fs = self.forkserver
        self.sel.unregister(fs.sock)
        with self.lock:  # forks are sent under this lock: none may reach the new one before its key
            forked = [p for p in self.procs.values() if p.alive and p.pid]
            unborn = list(fs.pending.values())
            cause = fs.reap()
            # the new one before anyone hears of the failure: a spawn sent in answer to it must not
            # go to the dead one's socket (lost: it waited for its timeout). In a crash loop, later:
            # meanwhile forks fail with the cause (``_watch_template``)
            delay = fs.died(cause, time.monotonic())
            if not delay:
                fs.start()
                self.sel.register(fs.sock, selectors.EVENT_READ, ("template", None))
        for p in forked:
            kill(p.pid, signal.SIGKILL)
            self._proc_exited(p.pid, None, signal.SIGKILL, cause)
        # they are ours now (a subreaper's), or will be once the warm child that forked them is gone
        # too: what is left of their groups goes as they are reaped (``adopted``), here or next tick
        self.adopted.reap(fs.pid)
        for p in unborn:  # asked for, never forked: those starts fail with the cause
            p.alive, p.tail = False, collections.deque([(fs.down_cause if delay else cause) + "\n"], maxlen=30)
        with self.lock:
            for mesh in {p.mesh_id: self.meshes[p.mesh_id] for p in unborn if p.mesh_id in self.meshes}.values():
                self._check_waiters(mesh)
        if delay:
            print(f"jupyter-mesh agent: {fs.down_cause}", file=sys.stderr)
        else:
            print(f"jupyter-mesh agent: {cause}; started a new one", file=sys.stderr)

    def _heartbeat_tick(self, now: float) -> None:
        """Ping every running proc but the idle ones (``quiet``); one that stops answering is watched
        (``liveness``): busy ones are reported to the controller, hung ones (stopped, deadlocked) are
        declared dead after hb_timeout."""
        stall = now - self.last_tick - self.hb_interval
        self.last_tick = now
        if stall > self.hb_interval:
            self._forgive(stall, now)
        silent = now - self.last_controller
        if silent > self.controller_silence and not self.keeper.controller_silent(silent):
            print(f"jupyter-mesh agent: no heartbeat from the controller for {silent:.0f} s; exiting", file=sys.stderr)
            self.shutdown()
        self.keeper.tick(now)  # a reattach that waits out a silent controller
        self._watch_template(now)
        self.adopted.reap(self.forkserver.pid)  # orphans of the procs' children, and procs of a dead fork server
        with self.lock:
            running = [p for p in self.procs.values() if p.alive and p.up and not p.stopping]
        self.quiet.prune({p.pid for p in running})
        for p in running:
            if not p.last_seen:
                p.last_seen = now
            silent = now - p.last_seen
            w = p.liveness
            if w.noted and silent <= self.hb_timeout:  # it answers again: no longer "busy in native code"
                w.noted = 0.0  # (before the idle check: a proc idle right after its busy spell kept the note)
                self._event({"k": Kind.PROC_NOTE, "m": p.mesh_id, "rk": p.rank, "note": ""})
            if silent <= self.hb_interval * 1.5 and self.quiet.idle(p.pid, p.last_seen, now):
                p.last_seen = now  # idle since it last answered (no I/O, not stopped): as good as a pong
                continue
            w.answered(p.last_seen)
            if silent > 1.5 * self.hb_interval:  # a pong is late: watch what the proc does meanwhile
                w.sample(p.pid, now, p.actor_tids)
            if silent > self.hb_timeout:
                if w.hung(now, self.hb_timeout):
                    self._declare_dead(
                        p,
                        f"proc {p.pid} stopped answering heartbeats for {silent:.1f} s and {w.why_hung(now)}; "
                        "it was killed",
                    )
                elif now - w.noted >= NOTE_EVERY:  # busy: say so now and then, ping as seldom
                    w.noted = now
                    self._event({"k": Kind.PROC_NOTE, "m": p.mesh_id, "rk": p.rank, "note": w.busy_note(silent)})
                    self._ping(p)
                continue  # the pings it has not read yet will be answered when it lets go of the GIL
            self._ping(p)

    def _forgive(self, stall: float, now: float) -> None:
        """This agent could not run for ``stall`` seconds (SIGSTOP, a starved or suspended host): the
        pongs and heartbeats of that time wait unread in its sockets, so that silence is nobody's fault.
        Without this, an agent stalled for most of the timeout killed every idle proc as deadlocked
        when it resumed (the controller already forgives its own stalls: ``agent_links``)."""
        self.last_controller = min(now, self.last_controller + stall)
        with self.lock:
            for p in self.procs.values():  # (an answer read meanwhile by the receive thread is newer)
                if p.last_seen:
                    p.last_seen = min(now, p.last_seen + stall)
                if p.liveness.progress:
                    p.liveness.progress = min(now, p.liveness.progress + stall)

    def _watch_template(self, now: float) -> None:
        """Forks overdue while the template is stopped (SIGSTOP): those starts fail now, with the cause;
        its procs live on. A slow template (a long preload) is left alone: the spawn's timeout says so.
        Forks asked while a crash loop pauses (``ForkServer.died``) fail at the next tick, with its cause."""
        fs = self.forkserver
        with self.lock:
            if fs.down:  # a crash loop's pause: forks asked meanwhile fail with its cause; then a new one
                why: str | None = fs.down_cause if fs.pending else None
                if now >= fs.down_until:
                    fs.start()
                    self.sel.register(fs.sock, selectors.EVENT_READ, ("template", None))
            else:
                why = fs.overdue(now, self.hb_timeout)
        if why is None:
            return
        with self.lock:
            unborn = self.forkserver.give_up_waiting()
            for p in unborn:
                p.alive, p.stopping = False, True
                p.tail = collections.deque([why + "\n"], maxlen=30)
            for mesh in {p.mesh_id: self.meshes[p.mesh_id] for p in unborn if p.mesh_id in self.meshes}.values():
                self._check_waiters(mesh)

    def _ping(self, p: ProcEntry) -> None:
        try:
            self.transport.send(p.addr, Message({"k": Kind.PING}))
        except Exception:  # noqa: BLE001 - its exit will be reported by the template
            pass

    def _declare_dead(self, p: ProcEntry, detail: str) -> None:
        with self.lock:
            if not p.alive:
                return
            p.exit_cause, p.ended = detail, ("heartbeat", detail)
            p.alive = False
            mesh = self.meshes.get(p.mesh_id)
            pending = self.relay.waiting_on(p)
            starting = _start_waits_on(mesh, p)
        f = self.failure(p, "heartbeat", detail)
        kill(p.pid, signal.SIGKILL)  # a hung proc is of no use; killing it lets the rank be respawned
        for key in pending:
            self.relay.add_to_gather(key, p.rank, BROKEN, dumps(f)[0], [])
        if mesh is not None:
            with self.lock:
                self._check_waiters(mesh)
            if not starting:
                self._event({"k": Kind.PROC_EXIT, "m": p.mesh_id, "rk": p.rank}, f)
            self._maybe_stopped(mesh)
        if p.addr:
            self.inboxes.forget_proc(p.addr)

    def _template_event(self) -> None:
        msg = self.forkserver.recv()
        if msg is None:
            if not self.shutting_down:
                self._template_died()
            return
        op = msg["op"]
        if op == "forked":
            self.adopted.forked(msg["pid"])
            with self.lock:
                p = self.forkserver.forked(msg["token"])
                if p is not None and not p.pid:
                    p.pid = msg["pid"]
                    self.by_pid[p.pid] = p
                    if p.stopping:  # stopped before we even knew its pid
                        kill(p.pid, signal.SIGKILL)
        elif op == "exit":
            self.adopted.reaped(msg["pid"])
            self._proc_exited(msg["pid"], msg["code"], msg["signal"])
        elif op == "warming":  # its warm child imports the warm list: forks that wait for it, wait on it
            with self.lock:
                self.forkserver.warming = int(msg["pid"])
        elif op == "serving":  # its warm child forks from now on: a stopped fork server is that one
            with self.lock:
                self.forkserver.serving, self.forkserver.warming = int(msg["pid"]), 0
        elif op == "ending":  # why it is about to exit (its warm child died): said when it is reaped
            try:
                self.forkserver.ending = {
                    "pid": int(msg["pid"]),
                    "code": None if msg["code"] is None else int(msg["code"]),  # None: a seed's child, how unknown
                    "when": str(msg.get("when", ""))[:200],
                }
            except (KeyError, TypeError, ValueError):
                pass  # its plain exit is reported instead
        elif op == "preloaded" and msg["errors"]:
            print("jupyter-mesh agent: preload failed: " + "; ".join(msg["errors"]), file=sys.stderr)

    def _proc_exited(self, pid: int, code: int | None, sig: int | None, cause: str = "") -> None:
        with self.lock:
            p = self.by_pid.get(pid)
            if p is None or not p.alive:
                return
        self._drain(p)
        how = describe_exit(p, code, sig)
        kind = "signal" if sig else "exit"
        by = " (killed on request)" if p.killed_by_user else ""
        detail = f"proc {pid} {how}{by}" + (f": {cause}" if cause else "")
        with self.lock:
            p.exit_code, p.exit_signal, p.exit_cause, p.ended = code, sig, cause, (kind, detail)
            p.alive = False
            mesh = self.meshes.get(p.mesh_id)
            pending = self.relay.waiting_on(p)
            starting = _start_waits_on(mesh, p)
        f = self.failure(p, kind, detail, code, sig)
        for key in pending:
            self.relay.add_to_gather(key, p.rank, BROKEN, dumps(f)[0], [])
        if mesh is not None:
            with self.lock:
                self._check_waiters(mesh)
            if not p.stopping and not starting:
                self._event({"k": Kind.PROC_EXIT, "m": p.mesh_id, "rk": p.rank}, f)
            self._maybe_stopped(mesh)
        if p.addr:  # its socket would retry and queue for nobody (and count against ZeroMQ's limit)
            self.inboxes.forget_proc(p.addr)

    def _drain(self, p: ProcEntry) -> None:
        """Read what a dead proc left in its pipes, so its last words (a traceback) are reported."""
        for fd in p.fds:
            for _ in range(1024):
                try:
                    key = self.sel.get_key(fd)
                except (KeyError, ValueError):
                    break
                if not self._pipe_readable(fd, *key.data[1]):
                    break


def _start_waits_on(mesh: HostedMesh | None, p: ProcEntry) -> bool:
    """Does a start request still wait for ``p`` (or for its siblings)? Then that request reports its
    death; reported as a death as well, it reached the user a second time, from their next unrelated
    call, about a mesh they never got."""
    return mesh is not None and any(p.rank in ranks for _, ranks in mesh.waiters)
