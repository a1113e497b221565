"""The host agent: one per host. Starts and watches the procs of its host; relays and gathers calls.

How it is started and configured (a local job's stdin pipe, a key file under a scheduler, a listen
address where a controller attaches) is ``agent_boot``. A local agent treats EOF on its stdin as the
controller's death; a remote one, heartbeats that stop coming: either way it kills its procs and
exits, so nothing outlives the program that started it.

Threads: the receive thread handles control-plane messages (relaying a cast to the local procs and
gathering their replies is on the latency path, so it happens right there); the I/O thread watches the
template's socket (fork results, child exits) and every proc's stdout/stderr pipe.
"""

from __future__ import annotations

import os
import selectors
import signal
import sys
import threading
import time
from typing import Any

from .._core.shape import Point, Shape
from .._wire.channels import CurveKeys
from .._wire.protocol import (
    OK,
    OUT_SYNC_PREFIX,
    RAISED,
    Dispatch,
    Kind,
    check_version,
    debug_forward,
    reply_header,
)
from .._wire.serialize import dumps
from .._wire.transport import Message, Transport
from ..errors import Failure, MeshValueError, SupervisionError
from . import seed, template_seed
from .adopted import Adopted
from .agent_procs import ProcWatch
from .agent_state import HostedMesh, ProcEntry, alive, describe_exit, kill, read_lines
from .forkserver import ForkServer
from .inboxes import ActorInboxes
from .keep_alive import Keeper
from .logs import cut_line
from .quiet import QuietProcs
from .relay import Relay
from .template import EarlyStart

KILL_GRACE = 5.0
"""Seconds a proc that ``ProcMesh.kill`` sent SIGTERM has to end (its exit handlers, ``__cleanup__``)
before it is sent SIGKILL: calls queued on it, and casts it is part of, then fail with its death."""

TAIL_MAX = 16 << 10
"""Characters of a dead proc's last output kept in its failure (its end: 30 lines, each cut at
``LINE_MAX``, could still make every later error to the rank a quarter of a megabyte)."""

__all__ = ["Agent"]


class Agent(ProcWatch):
    def __init__(self, cfg: dict[str, Any], early: EarlyStart | None = None):
        """``early``: this host's template, started before this process imported us (``agent_main``)."""
        check_version(cfg.get("v"), "the controller that started this agent")
        self.cfg = cfg
        self.key = bytes.fromhex(cfg["key"])
        self.controller: str = cfg["controller"]
        self.host_index: int = cfg.get("host_index", 0)
        # liveness: procs must answer pings within hb_timeout; the controller must ping us
        self.hb_timeout: float = float(cfg.get("hb_timeout", 3.0))
        self.hb_interval = self.hb_timeout / 4
        # idle procs are told from /proc, not pinged (``quiet``); JUPYTER_MESH_PING_IDLE=1 pings all
        self.quiet = QuietProcs(enabled=os.environ.get("JUPYTER_MESH_PING_IDLE") != "1")
        # a controller silent this long is taken for dead; with a stdin lifeline (LocalJob) its death
        # closes our stdin, and silence only means it is busy (a long C call holding its GIL)
        self.controller_silence = float("inf") if cfg.get("stdin_lifeline") else 3 * self.hb_timeout
        self.last_controller = time.monotonic()
        self.last_tick = self.last_controller  # the I/O thread's last heartbeat tick (``_heartbeat_tick``)
        self.bind: str = cfg["bind"]  # the controller's: a private directory on its host, or TCP
        self.curve = CurveKeys.from_wire(cfg["curve"]) if cfg.get("curve") else None
        self.transport = Transport(self.key, self.bind, self.curve)
        self.lock = threading.RLock()
        self.procs: dict[tuple[str, int], ProcEntry] = {}
        self.by_pid: dict[int, ProcEntry] = {}
        self.meshes: dict[str, HostedMesh] = {}
        self.inboxes = ActorInboxes(self.transport)  # relays of calls go straight to actors' inboxes
        self.relay = Relay(self)  # casts to this host's procs, and their gathered replies
        self.keeper = Keeper(self, cfg.get("keep_alive") is True)  # outlive the controller, for the next one
        self.dispatch = self._table()
        self.shutting_down = False
        self._exiting = False  # set once, by the thread that runs shutdown()
        self._exit_lock = threading.Lock()
        self.orphaned = True
        self.nested = bool(cfg.get("nested"))  # started by an actor: the session's controller sweeps
        # pipes, the template and its lifeline
        self.sel = selectors.DefaultSelector()
        self.adopted = Adopted()  # a subreaper: procs whose fork server died are ours to reap, groups first
        self.lifeline_r, self.lifeline_w = (early.lifeline_r, early.lifeline_w) if early else os.pipe()
        self.forkserver = ForkServer(
            cfg["key"],
            self.lifeline_r,
            list(cfg.get("preload") or []),
            list(cfg.get("warm") or []),
            (early.proc, early.sock) if early else None,
        )  # it starts now (or started already) and preloads in the background: our hello does not wait for it
        self.sel.register(self.forkserver.sock, selectors.EVENT_READ, ("template", None))
        self.wake_r, self.wake_w = os.pipe()
        self.sel.register(self.wake_r, selectors.EVENT_READ, ("wake", None))

    # -- plumbing ---------------------------------------------------------------------------------
    def _event(self, header: dict[str, Any], obj: Any = None) -> None:
        if self.keeper.detached:  # nobody to tell: what a new controller needs, it asks for (``hosted``)
            self.keeper.hold(header, obj)  # a proc's exit, for a silent controller that comes back
            return
        payload, bufs = dumps(obj) if obj is not None else (b"", [])
        try:
            self.transport.send(self.controller, Message(header, payload, bufs))
        except Exception:  # noqa: BLE001 - controller gone: the lifeline will end us
            pass

    def _reply(self, to: tuple[str, int], ok: int, obj: Any) -> None:
        payload, bufs = dumps(obj)
        self.transport.send(to[0], Message(reply_header(to[1], ok), payload, bufs))

    # -- receive thread ---------------------------------------------------------------------------
    def _table(self) -> Dispatch:
        return Dispatch(
            f"agent of host {self.host_index}",
            {
                Kind.REPLY: self._on_gathered_reply,
                Kind.PONG: self._on_pong,
                Kind.NOTICE: self._on_notice,
                Kind.HEARTBEAT: self._on_heartbeat,
                Kind.CALL: self._on_call,
                Kind.SPAWN: self._on_call,
                Kind.GATHERED: lambda msg, _: self.relay.subtree_gathered(msg),  # from an agent below (tree)
                Kind.PRUNE: lambda msg, _: self.relay.prune(msg.header),  # the caller lost an agent below
                Kind.ACTOR_UP: self._on_actor_up,
                Kind.PROC_UP: lambda msg, _: self._proc_up(msg.header),
                Kind.SPAWN_PROCS: lambda msg, _: self._spawn_procs(msg.header),
                Kind.STOP_PROCS: lambda msg, _: self._stop_procs(msg.header),
                Kind.START_PROCS: lambda msg, _: self._start_procs(msg.header),
                Kind.KILL_PROC: lambda msg, _: self._kill_proc(msg.header),
                Kind.STATS: lambda msg, _: self._reply(
                    (msg.header["s"], msg.header["i"]), OK, vars(self.transport.stats)
                ),
                Kind.SHUTDOWN: self._on_shutdown,
                Kind.DETACH: self.keeper.on_detach,
                Kind.REATTACH: self.keeper.on_reattach,
                Kind.DEBUG: lambda msg, _: self._event(debug_forward(msg.header)),  # remote pdb
            },
        )

    def _on_shutdown(self, msg: Message, frames: list[Any]) -> None:
        """The controller stops this job (it lives on); an earlier one that lost the job may not."""
        if self.keeper.from_owner(msg):
            self.shutdown(orphaned=False)

    def handle(self, msg: Message, frames: list[Any]) -> None:
        if self.keeper.deposed and self.keeper.refuses(msg):  # from a controller that lost this job
            return
        self.dispatch(msg, frames)

    def _on_gathered_reply(self, msg: Message, frames: list[Any]) -> None:
        if "to" in msg.header:  # a local rank's share of a cast's replies
            self.relay.gathered(msg.header, msg)
        else:
            self.dispatch.report_unknown("r (not gathered)", msg.header.get("s"))

    def _on_pong(self, msg: Message, frames: list[Any]) -> None:
        p = self.procs.get((msg.header["m"], msg.header["rk"]))
        if p is not None:
            p.last_seen = time.monotonic()

    def _on_notice(self, msg: Message, frames: list[Any]) -> None:
        """A rank failed or was respawned: every local proc's client should know."""
        with self.lock:
            addrs = [p.addr for p in self.procs.values() if p.alive and p.up]
        for addr in addrs:
            self.transport.send_raw(addr, frames)

    def _on_heartbeat(self, msg: Message, frames: list[Any]) -> None:
        if not self.keeper.on_heartbeat(msg):  # kept alive: only the controller that owns the job counts
            return
        self.last_controller = time.monotonic()
        # to the controller's heartbeat socket: its liveness must not queue behind replies
        self.transport.send(
            msg.header.get("hr") or self.controller,
            Message({"k": Kind.HEARTBEAT_ACK, "addr": self.transport.address}),
        )

    def _on_call(self, msg: Message, frames: list[Any]) -> None:
        self.relay.relay(msg.header, frames)

    def _on_actor_up(self, msg: Message, frames: list[Any]) -> None:
        h = msg.header
        self.inboxes.learn(h["pa"], h["a"], h["addr"])
        with self.lock:  # the thread that runs its endpoints: what liveness looks at
            for p in (p for p in self.procs.values() if p.addr == h["pa"] and isinstance(h.get("tid"), int)):
                p.actor_tids.add(h["tid"])

    def failure(self, p: ProcEntry, kind: str, detail: str, code: int | None = None, sig: int | None = None) -> Failure:
        mesh = self.meshes.get(p.mesh_id)
        tail = "".join(p.tail)
        if len(tail) > TAIL_MAX:  # its end is what says why; every later call to the rank repeats it
            tail = (
                f"… [{len(tail) - TAIL_MAX} characters before these cut: the proc's logs keep them]\n"
                + tail[-TAIL_MAX:]
            )
        return Failure(
            mesh.name if mesh else p.mesh_id,
            dict(mesh.shape.point(p.rank)) if mesh else {},
            kind,
            detail,
            tail,
            code,
            sig,
        )

    def _spawn_procs(self, h: dict[str, Any]) -> None:
        shape = Shape.from_wire(h["shape"])
        mesh = HostedMesh(h["m"], h["name"], shape, list(h["ranks"]), spawn_cfg=h)
        with self.lock:
            self.meshes[mesh.mesh_id] = mesh
            if h.get("preload"):
                self.forkserver.load(h["preload"])
            self._start(mesh, mesh.ranks, (h["s"], h["i"]))

    def _start_procs(self, h: dict[str, Any]) -> None:
        """Start procs for ``ranks`` of an existing mesh: respawn failed ranks, or grow the mesh."""
        with self.lock:
            mesh = self.meshes.get(h["m"])
            if mesh is None:
                self._reply((h["s"], h["i"]), RAISED, MeshValueError(f"no proc mesh {h['m']} on this host"))
                return
            busy = [r for r in h["ranks"] if (p := self.procs.get((mesh.mesh_id, r))) is not None and p.alive]
            if busy:
                self._reply(
                    (h["s"], h["i"]), RAISED, MeshValueError(f"ranks {busy} are still running; kill them first")
                )
                return
            if "shape" in h:
                self._reshape(mesh, h["shape"])
            for r in h["ranks"]:
                if r not in mesh.ranks:
                    mesh.ranks.append(r)
            self._start(mesh, list(h["ranks"]), (h["s"], h["i"]))
            self._check_waiters(mesh)  # a request with no ranks here (only a new extent) is done now

    def _start(self, mesh: HostedMesh, ranks: list[int], reply_to: tuple[str, int]) -> None:
        """Fork one proc per rank from the template (caller holds the lock); reply when all are up."""
        cfg0 = mesh.spawn_cfg
        mesh.waiters.append((reply_to, set(ranks)))
        for rank in ranks:
            label = ",".join(f"{k}={v}" for k, v in Point(rank, mesh.shape.extent).items())
            old = self.procs.get((mesh.mesh_id, rank))
            if old is not None:
                self.by_pid.pop(old.pid, None)
            p = ProcEntry(mesh.mesh_id, rank, label)
            self.procs[(mesh.mesh_id, rank)] = p
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            cfg = {
                "rank": rank,
                "mesh_id": mesh.mesh_id,
                "mesh_name": mesh.name,
                "shape": cfg0["shape"],
                "host_dims": cfg0.get("host_dims", 1),
                "agent": self.transport.address,
                "env": cfg0.get("env") or {},
                "preload": cfg0.get("preload") or [],
                "bind": cfg0.get("bind", self.bind),  # procs listen where their agent does
                "curve": self.curve.to_wire() if self.curve else None,
                # what we relayed before it existed: a replay of that must not run in it
                "floors": self.transport.floors(self.transport.address),
                "deposed": list(self.keeper.deposed),  # controllers that lost this job: nothing of theirs runs
                "cwd": cfg0.get("cwd"),
                "path": cfg0.get("path"),
                "warm_wait": cfg0.get("warm_wait") is not False,  # (read by the template, not the proc)
            }
            self.forkserver.fork(p, cfg, [out_w, err_w])
            os.close(out_w)
            os.close(err_w)
            p.fds = [out_r, err_r]
            for fd, stream in ((out_r, 1), (err_r, 2)):
                os.set_blocking(fd, False)
                self.sel.register(fd, selectors.EVENT_READ, ("pipe", (p, stream, bytearray())))
        os.write(self.wake_w, b"x")  # the I/O thread re-reads the selector

    def _reshape(self, mesh: HostedMesh, shape_wire: list[Any], keep: list[int] | None = None) -> None:
        """The mesh grows or shrinks (caller holds the lock): tell the procs that stay their new extent."""
        mesh.shape = Shape.from_wire(shape_wire)
        mesh.spawn_cfg = {**mesh.spawn_cfg, "shape": shape_wire}
        for r in mesh.ranks if keep is None else keep:
            p = self.procs.get((mesh.mesh_id, r))
            if p is not None and p.alive and p.up:
                self.transport.send(p.addr, Message({"k": Kind.RESHAPE, "shape": shape_wire}))

    def _kill_proc(self, h: dict[str, Any]) -> None:
        with self.lock:
            p = self.procs.get((h["m"], h["rk"]))
        if p is None or not p.alive:
            self._reply((h["s"], h["i"]), RAISED, MeshValueError(f"rank {h['rk']} is not running"))
            return
        p.killed_by_user = True
        sig = int(h.get("sig", signal.SIGTERM))
        kill(p.pid, sig)
        if sig == signal.SIGTERM:  # a proc whose exit handlers run on (or that ignores it) dies anyway
            t = threading.Timer(KILL_GRACE, self._escalate, args=([p],))
            t.daemon = True
            t.start()
        self._reply((h["s"], h["i"]), OK, p.pid)

    def _proc_up(self, h: dict[str, Any]) -> None:
        with self.lock:
            p = self.procs.get((h["m"], h["rk"]))
            if p is None or (p.pid and p.pid != h["pid"]):
                return
            p.addr, p.up = h["addr"], True
            if not p.pid:
                p.pid = h["pid"]
                self.by_pid[p.pid] = p
            self._check_waiters(self.meshes[p.mesh_id])
        self._event({"k": Kind.PROC_READY, "m": p.mesh_id, "rk": p.rank, "pid": p.pid})  # for progress bars

    def _check_waiters(self, mesh: HostedMesh) -> None:
        """Answer every start request whose procs are all up, or one of which died first."""
        keep = []
        for to, ranks in mesh.waiters:
            procs = [self.procs[(mesh.mesh_id, r)] for r in sorted(ranks)]
            failed = [p for p in procs if not p.alive]
            if any(p.alive and not p.up for p in procs):
                keep.append((to, ranks))  # report once every proc is up or dead: all failures at once
            elif failed:
                fails = [
                    self.failure(
                        p,
                        "start",
                        f"proc failed to start ({describe_exit(p, p.exit_code, p.exit_signal)})"
                        + (f": {p.exit_cause}" if p.exit_cause else "")
                        if p.pid
                        else "proc was never forked: " + "".join(p.tail).strip(),
                    )
                    for p in failed
                ]
                self._reply(to, RAISED, SupervisionError(fails, "while starting its procs"))
            elif all(p.up for p in procs):
                self._reply(to, OK, [(p.rank, p.addr, p.pid) for p in procs])
            else:
                keep.append((to, ranks))
        mesh.waiters = keep

    def _stop_procs(self, h: dict[str, Any]) -> None:
        grace = float(h.get("grace", 10.0))
        with self.lock:
            mesh = self.meshes.get(h["m"])
            if mesh is None:
                self._reply((h["s"], h["i"]), OK, None)
                return
            only = h.get("ranks")  # a shrink stops some ranks; a stop, all of them
            ranks = [r for r in mesh.ranks if only is None or r in only]
            mesh.stop_replies.append(((h["s"], h["i"]), None if only is None else set(ranks)))
            if h.get("shape"):
                self._reshape(mesh, h["shape"], keep=[r for r in mesh.ranks if r not in ranks])
            procs = [self.procs[(mesh.mesh_id, r)] for r in ranks]
            for p in procs:
                p.stopping = True
                if p.alive and not p.pid:  # not forked yet (a slow or stalled template): it never
                    p.alive = False  # runs (killed as soon as its fork is reported), so it is stopped
            running = [p for p in procs if p.alive]
        for p in running:
            if p.up:
                self.transport.send(p.addr, Message({"k": Kind.STOP}))
            else:
                kill(p.pid, signal.SIGKILL)
        if running:
            t = threading.Timer(grace, self._escalate, args=(running,))
            t.daemon = True
            t.start()
        self._maybe_stopped(mesh)

    def _escalate(self, procs: list[ProcEntry]) -> None:
        for p in procs:
            if p.alive:
                kill(p.pid, signal.SIGKILL)

    def _maybe_stopped(self, mesh: HostedMesh) -> None:
        """Answer stop requests whose procs are all gone, and forget those procs (and the mesh)."""
        done = []
        with self.lock:
            keep = []
            for to, only in mesh.stop_replies:
                ranks = [r for r in mesh.ranks if only is None or r in only]
                if any(self.procs[(mesh.mesh_id, r)].alive for r in ranks):
                    keep.append((to, only))
                    continue
                for r in ranks:
                    p = self.procs.pop((mesh.mesh_id, r))
                    self.by_pid.pop(p.pid, None)
                mesh.ranks = [r for r in mesh.ranks if r not in ranks]
                done.append(to)
            mesh.stop_replies = keep
            if not mesh.ranks and not keep:
                self.meshes.pop(mesh.mesh_id, None)
        for to in done:
            self._reply(to, OK, None)

    # -- I/O thread -------------------------------------------------------------------------------
    def io_loop(self) -> None:
        next_tick = time.monotonic() + self.hb_interval
        while not self.shutting_down:
            now = time.monotonic()
            if now >= next_tick:
                try:
                    self._heartbeat_tick(now)
                except Exception:  # noqa: BLE001 - liveness must outlive a bug in one tick, and say so
                    import traceback

                    traceback.print_exc()
                next_tick = now + self.hb_interval
            for key, _ in self.sel.select(max(0.0, next_tick - now)):
                if self.sel.get_map().get(key.fd) is not key:
                    continue  # closed by an earlier event of this round (a drained pipe)
                kind, data = key.data
                try:
                    if kind == "template":
                        self._template_event()
                    elif kind == "wake":
                        try:
                            os.read(self.wake_r, 512)
                        except BlockingIOError:
                            pass
                    else:
                        self._pipe_readable(key.fd, *data)
                except Exception:  # noqa: BLE001 - the agent must outlive any one bad event
                    import traceback

                    traceback.print_exc()

    def _pipe_readable(self, fd: int, p: ProcEntry, stream: int, buf: bytearray) -> bool:
        lines, eof, progressed = read_lines(fd, buf)
        if eof:
            self.sel.unregister(fd)
            os.close(fd)
        if lines:
            # a proc's last output (shown when it dies) is the user's: the notebook's markers stay out;
            # each line cut as the kept logs cut it, or a few long lines make every later error megabytes
            p.tail.extend(
                cut_line(ln.partition(OUT_SYNC_PREFIX)[0]) + "\n" for ln in lines if not ln.startswith(OUT_SYNC_PREFIX)
            )
            self._event({"k": Kind.OUT, "m": p.mesh_id, "rk": p.rank, "fd": stream, "label": p.label, "lines": lines})
        return progressed

    # -- lifecycle --------------------------------------------------------------------------------
    def shutdown(self, orphaned: bool = True) -> None:
        """Kill every proc, the template, and exit. Runs on controller request or its death.

        Never returns: the first caller cleans up and ends the process with ``os._exit``; any other
        thread that gets here waits for it. Were one to return (the main thread, say), the
        interpreter would finalize under the cleanup and cut it off, before the sweep of
        ``/dev/shm``, or with a thread inside a read of stdin (a fatal error at shutdown).

        Only an orphaned agent (its controller gone) sweeps the session's shared-memory segments: a
        controller that asked us to stop still has other meshes whose messages may be in flight."""
        with self._exit_lock:
            first = not self._exiting
            self._exiting = self.shutting_down = True
        if not first:
            time.sleep(60.0)  # the first caller ends the process; this is only a backstop
            os._exit(1)
        try:
            self.orphaned = orphaned
            with self.lock:
                procs = [p for p in self.procs.values() if p.alive]
            for p in procs:
                kill(p.pid, signal.SIGTERM)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and any(alive(p.pid) for p in procs):
                time.sleep(0.02)
            for p in procs:
                kill(p.pid, signal.SIGKILL)
            os.close(self.lifeline_w)
            self.forkserver.stop()
            self.adopted.settle(self.forkserver.pid, 1.0)  # its procs, ours now: what they started goes too
            if self.orphaned and template_seed.seed_pid():  # a stopped seed would never see its job end
                seed.end_for_dead_controller(template_seed.seed_pid())
            from .._wire import shm as _shm

            if self.orphaned and not self.nested:  # segments sent to procs that died before mapping them
                _shm.sweep(self.transport.shm_prefix)
        except BaseException:  # noqa: BLE001 - report, and still exit
            import traceback

            traceback.print_exc()
        finally:
            try:
                sys.stderr.flush()
            finally:
                os._exit(0)
