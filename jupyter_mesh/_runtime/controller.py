"""The controller: the one process that owns the session, its agents and its meshes.

It lives inside the user's program (a script or a Jupyter kernel). A daemon receive thread turns
agent events (proc exits, worker output) into supervision and printed output, and replies into
future results unless the caller reads them itself (``replies``: a thread waiting in ``get()``
reads its own reply box); everything else runs on the caller's thread. One per process:
``Controller.get()``.
"""

from __future__ import annotations

import atexit
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core import exit_code
from .._core.context import context
from .._core.future import Future, time_left
from .._core.shape import Shape
from .._core.state import StateTracker
from .._data import ucx as _ucx
from .._data.owner import handle_message as handle_rdma
from .._wire import protocol
from .._wire.addresses import local_ip_towards
from .._wire.channels import CurveKeys, curve_wanted, default_bind, is_loopback, remove_session_dir
from .._wire.protocol import Dispatch, Kind
from .._wire.serialize import dumps, loads
from .._wire.transport import Message, Transport
from ..errors import (
    Failure,
    MeshClosedError,
    MeshError,
    MeshTimeoutError,
    MeshValueError,
    SupervisionError,
)
from . import hooks
from .agent_links import AgentLinks
from .client import Client
from .debug_socket import DebugSocket
from .debugger import Debugger
from .elastic import Elastic
from .faults import Faults
from .hooks import Embedding
from .inits import Inits
from .logs import WorkerLogs, cut_line
from .records import MeshRecord, MeshRecords
from .stacks import Stacks, ask_stacks

if TYPE_CHECKING:
    from .._core.refs import ActorMeshRef, ProcMeshRef
    from .hosts import AgentHandle, Job

__all__ = ["Controller", "OutputSink"]


OutputSink = Callable[[str, int, str, int, list[str]], None]
"""(mesh name, rank, coords label, fd 1/2, lines) -> None: where worker output goes."""


def print_output(mesh: str, rank: int, label: str, fd: int, lines: list[str]) -> None:
    stream = sys.stdout if fd == 1 else sys.stderr  # lines arrive cut to logs.LINE_MAX
    prefix = f"[{mesh} {label}] "
    stream.write("".join(prefix + line + "\n" for line in lines))
    stream.flush()


class Controller:
    """Session key, control-plane endpoint, agents and proc meshes of this program."""

    _instance: Controller | None = None
    _instance_lock = threading.Lock()
    # proc meshes of this process's controllers that shut down: a handle kept from one of them must fail
    # as closed, not time out, once a new controller (with a new client) runs in its place
    _shut_down_meshes: set[str] = set()

    @classmethod
    def get(cls) -> Controller:
        inst = cls._instance
        if inst is None:
            with cls._instance_lock:
                inst = cls._instance
                if inst is None:
                    inst = cls._instance = Controller(embedded=hooks.embedding())
                    hooks.hold_faults_with(inst.faults.hold)
        return inst

    @classmethod
    def reachable_from(cls, peer_ip: str) -> Controller:
        """The controller, listening where a host at ``peer_ip`` can reach it (jobs on other hosts).

        A session listens on private unix sockets unless ``JUPYTER_MESH_BIND`` said TCP. An idle one
        (no job running, no mesh) is replaced by one bound to our IP on the route to that host, with
        CURVE; its state tracker and output sink carry over, so widgets and the notebook's output
        routing keep working. A busy one cannot move its running meshes: that is a clear error."""
        return cls._listening_for(peer_ip, None)

    @classmethod
    def adopt(cls, key: bytes, curve: CurveKeys, peer_ip: str) -> Controller:
        """The controller of a kept-alive job's session (``SlurmJob.reattach``): its keys, bound to our
        IP on the route to ``peer_ip``. Only an idle session can become it, as for ``reachable_from``."""
        return cls._listening_for(peer_ip, (key, curve))

    @classmethod
    def _listening_for(cls, peer_ip: str, keys: tuple[bytes, CurveKeys] | None) -> Controller:
        inst = cls.get()
        bind = inst.transport.bind
        if keys is not None and (inst.key, inst.transport.curve) == keys:
            return inst  # this session is that one already
        if bind.startswith("tcp://") and keys is None:
            if is_loopback(bind) and not is_loopback(f"tcp://{peer_ip}"):
                raise MeshValueError(
                    f"this session listens on {bind} (loopback): a host at {peer_ip} cannot reach it; "
                    f"set JUPYTER_MESH_BIND=tcp://<this host's IP on that network>"
                )
            return inst
        if inst.embedded:
            raise MeshValueError("an actor cannot start jobs on other hosts; create them in the controller")
        busy = [j for j in inst._jobs if j.running()]
        live = [r.ref.name for r in inst.meshes.values() if not r.stopped]
        if keys is not None and (busy or live):
            raise MeshValueError(
                f"this session already runs {', '.join(live) or busy[0]!r}; a kept job is reattached by a "
                f"session of its own: stop them first (%mesh down), or reattach from a fresh kernel"
            )
        if busy or live:
            raise MeshValueError(
                f"this session listens on private unix sockets (this host only) and already runs "
                f"{', '.join(live) or busy[0]!r}: it cannot move them to the network. Stop them first "
                f"(%mesh down), create jobs on other hosts before local meshes, or start with "
                f"JUPYTER_MESH_BIND=tcp://<this host's IP>"
            )
        ip = local_ip_towards(peer_ip)
        inst.shutdown()  # takes the instance lock itself
        with cls._instance_lock:
            new = cls._instance = Controller(bind=f"tcp://{ip}", carry=inst, keys=keys)
            hooks.hold_faults_with(new.faults.hold)
        return new

    def __init__(
        self,
        bind: str | None = None,
        embedded: Embedding | None = None,
        carry: Controller | None = None,
        keys: tuple[bytes, CurveKeys] | None = None,
    ):
        """``embedded``: inside a proc, an actor that spawns meshes makes the proc a controller too;
        it then shares the proc's key, transport, client and receive thread instead of its own.
        ``keys``: the session key and CURVE keys of a kept-alive job this controller takes over."""
        self.embedded = embedded is not None
        if embedded is not None:
            self.key, self.transport, self.client = embedded.key, embedded.transport, embedded.client
        else:
            self.key = keys[0] if keys else secrets.token_bytes(32)
            # private unix sockets unless the user asked for TCP, which then speaks CURVE (_wire/channels)
            bind = bind or default_bind()
            curve = keys[1] if keys else CurveKeys.new() if curve_wanted(bind) else None
            self.transport = Transport(self.key, bind, curve)
            _ucx.follow_bind(bind)
            self.client = Client(self.transport, reply_boxes=True)
        self.address = self.transport.address
        self.client.calls.stopped.update(Controller._shut_down_meshes)
        # ``carry``: the idle controller this one replaces (``reachable_from``): who watches state and
        # where output goes stay as they were
        self.state: StateTracker = carry.state if carry is not None else StateTracker()
        self.client.hooks.activity = self.state.activity
        self.client.hooks.on_spawn = self._record_spawn
        self.inits = Inits(self)  # actor constructors that take long
        self.client.hooks.constructed = self.inits.constructed
        self.output: OutputSink = print_output if carry is None else carry.output
        self.meshes = MeshRecords()
        self.worker_logs = WorkerLogs()  # for ProcMesh.logs(): bounded in bytes, trimmed when a mesh stops
        self.client.hooks.on_stopped = self.worker_logs.stopped
        self._jobs: list[Job] = []
        self._lock = threading.Lock()
        self._closed = False
        self.killed_on_request: set[tuple[str, int]] = set()
        self.faults = Faults(self)  # who hears of a failure; what fail fast holds
        self.elastic = Elastic(self)
        self.kill, self.respawn, self.resize = self.elastic.kill, self.elastic.respawn, self.elastic.resize
        self.watch_init = self.inits.watch_init
        self.raise_pending_fault = self.faults.raise_pending
        self.client.hooks.before_call = self.raise_pending_fault
        self.client.hooks.kill_ranks = self._kill_now
        self.client.hooks.actors_stopping = self.faults.actors_stopping
        # admission and liveness of agents: O(hosts) pings per interval, never O(procs)
        self.links = AgentLinks(self)
        self.hb_timeout = self.links.hb_timeout
        self.expect_agent, self.stop_expecting = self.links.expect_agent, self.links.stop_expecting
        self.forget_agents, self.agent_lost = self.links.forget_agents, self.links.agent_lost
        # actors paused in breakpoint()
        self.debugger: Debugger = Debugger(self.state, self.meshes, self.transport, self.client)
        self.debugger.embedded = self.embedded
        # `jupyter-mesh debug` from a shell of this user on this host (a private unix socket)
        self.debug_socket = DebugSocket.start(self.debugger) if embedded is None else None
        self._thread: threading.Thread | None = None
        self.dispatch = self._table()
        if embedded is not None:
            embedded.route(self.dispatch)
        else:
            assert self.client.boxes is not None
            self._thread = threading.Thread(
                target=self.transport.serve,
                args=(self._on_message, self.client.boxes.tick),
                name="jupyter-mesh-recv",
                daemon=True,
            )
            self._thread.start()
        atexit.register(self._at_exit)

    # -- events from the wire (receive thread) ----------------------------------------------------
    def _table(self) -> Dispatch:
        return Dispatch(
            "controller",
            {
                Kind.REPLY: lambda msg, _: self.client.on_reply(msg),
                Kind.PORT: lambda msg, _: self.client.ports.on_message(msg),
                Kind.GATHERED: lambda msg, _: self.client.on_reply(msg),
                Kind.UNFORWARDED: lambda msg, _: self.client.unforwarded(msg),  # a tree relay failed
                Kind.PROGRESS: lambda msg, _: self.client.on_progress(msg),  # ranks done, reply held
                Kind.OUT: self._on_output,
                Kind.CANCELLED: lambda msg, _: self.client.cancel_acks.acked(msg.header["i"], msg.header["rk"]),
                Kind.PROC_READY: lambda msg, _: self.state.ready(msg.header["m"], msg.header["rk"], msg.header["pid"]),
                # a proc that does not answer is busy (or answers again)
                Kind.PROC_NOTE: lambda msg, _: self.state.note(msg.header["m"], msg.header["rk"], msg.header["note"]),
                Kind.RDMA: lambda msg, _: handle_rdma(self.transport, msg),
                Kind.PROC_EXIT: lambda msg, _: self.proc_exit(
                    msg.header["m"], msg.header["rk"], loads(msg.payload, msg.buffers)
                ),
                Kind.HEARTBEAT_ACK: self.links.on_heartbeat_ack,
                Kind.AGENT_UP: self.links.on_agent_up,
                Kind.AGENT_GONE: self.links.on_agent_gone,
                Kind.ACTOR_FAULT: self.faults.actor_fault,
                Kind.DEBUG: self.debugger.on_event,
            },
        )

    def _on_message(self, msg: Message, frames: list[Any]) -> None:
        self.dispatch(msg, frames)

    def _on_output(self, msg: Message, frames: list[Any]) -> None:
        h = msg.header
        rec = self.meshes.get(h["m"])
        lines = [cut_line(line) for line in h["lines"]]  # one huge line must not flood the cell or memory
        if rec is not None:
            self.worker_logs.add(h["m"], h["rk"], h["fd"], lines, time.time())
        self.output(rec.ref.name if rec else h["m"], h["rk"], h["label"], h["fd"], lines)

    def proc_exit(self, mesh_id: str, rank: int, failure: Failure) -> None:
        rec = self.meshes.get(mesh_id)
        if rec is None or rec.stopped:
            return
        with self._lock:  # the receive and heartbeat threads may both report it: handle it once
            if rank in rec.failures:
                return
            rec.failures[rank] = failure
        if rank < len(rec.ref.proc_addrs) and rec.ref.proc_addrs[rank]:
            self.client.forget_proc(rec.ref.proc_addrs[rank])  # no socket left retrying a dead proc
        # order matters: whoever wakes up from a failed call, or sees the rank failed, may rely on
        # the fault having been handled and the state updated already
        told = self.client.waits_on(mesh_id, rank)
        doomed = self.client.doomed(mesh_id, rank)  # its call failed already, of another rank's death
        try:
            self.faults.rank_failed(rec, rank, failure, told or doomed)
        finally:
            self.state.failed(mesh_id, rank, failure)
            hit = self.client.mark_failed({rank: failure}, mesh_id)
            self.notify_procs(protocol.notice("failed", mesh_id, rank), failure)
        if told and not hit and not doomed:  # the call that waited on it finished meanwhile, without it
            self.faults.rank_failed(rec, rank, failure, False, hook_only=True)

    def notify_procs(self, header: dict[str, Any], obj: Any = None) -> None:
        """Tell every proc (through its agent: O(hosts) sends) that a rank failed or came back, so
        actors calling it directly fail fast, or reach its new address."""
        payload, bufs = dumps(obj) if obj is not None else (b"", [])
        agents = self.links.live()
        frames = self.transport.encode(Message(header, payload, bufs), agents)
        for addr in agents:
            if addr not in self.links.lost:
                try:
                    self.transport.send_raw(addr, frames)
                except Exception:  # noqa: BLE001 - closing down
                    return

    def _kill_now(self, ref: ProcMeshRef, ranks: list[int]) -> list[int]:
        """SIGKILL the procs of ``ranks`` (a second interrupt): the ranks they killed."""
        killed = []
        for r in ranks:
            try:
                self.kill(ref, r, signal.SIGKILL, timeout=2.0)
                killed.append(r)
            except MeshError as e:
                print(f"jupyter_mesh: could not kill rank {r} of '{ref.name}': {e}", file=sys.stderr)
        return killed

    @property
    def pending_fault(self) -> SupervisionError | None:
        """A failure fail fast holds, to raise at the next API call (or exit 1 at the end)."""
        return self.faults.pending

    def register_job(self, job: Job) -> None:
        self._check_open()
        self._jobs.append(job)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise MeshClosedError("the jupyter_mesh controller was shut down; start a new program or kernel")

    # -- proc meshes ------------------------------------------------------------------------------
    def spawn_procs(
        self,
        job: Job,
        host_indices: list[int],
        shape: Shape,
        name: str,
        env: dict[str, str],
        preload: list[str],
        timeout: float,
        host_dims: int = 1,
        warm: bool = True,
    ) -> ProcMeshRef:
        """``host_dims``: how many leading dims of ``shape`` are the host mesh's (0 for ``this_host()``);
        ``warm``: whether forks wait for the hosts' warm imports (torch...) if those still run."""
        from .._core.refs import ProcMeshRef, new_id

        self._check_open()
        self.raise_pending_fault()
        agents: list[AgentHandle] = job.agents(timeout)
        hosts = [agents[i] for i in host_indices]
        per_host = len(shape) // len(hosts)
        mesh_id = new_id(name)
        ref = ProcMeshRef(
            mesh_id,
            name,
            shape,
            [""] * len(shape),
            [r // per_host for r in range(len(shape))],
            [a.addr for a in hosts],
            [a.host_key for a in hosts],
            host_dims,
        )
        rec = MeshRecord(ref, {})
        emb = hooks.embedding()
        if emb is not None and self.embedded:
            rec.owner = emb.current_owner()
        self.meshes[mesh_id] = rec
        coords = [dict(shape.point(r)) for r in range(len(shape))]
        self.state.created(mesh_id, name, dict(shape.extent), coords, ref.agent_addrs, ref.rank_host, job.describe)
        rec.job, rec.env, rec.preload = job, env, preload
        futs = [
            self.spawn_request(agent, ref, list(range(pos * per_host, (pos + 1) * per_host)), env, preload, warm=warm)
            for pos, agent in enumerate(hosts)
        ]
        errors: list[BaseException] = []
        deadline = time.monotonic() + timeout  # one bound for all hosts (each had its own: N x timeout)
        for f in futs:
            try:
                for rank, addr, pid in f.get(time_left(deadline)):
                    ref.proc_addrs[rank] = addr
                    rec.pids[rank] = pid
            except MeshTimeoutError:
                what = f"procs of '{name}' did not all start"
                if warm:  # the likeliest wait on a slow host, and the way around it
                    what += (
                        " (a host whose fork server still imports its warm list, torch and co., forks "
                        "once that is done; spawn_procs(warm=False) does not wait for it)"
                    )
                errors.append(MeshTimeoutError("spawn", timeout, what))
            except MeshError as e:
                errors.append(e)
        if errors:
            try:  # undo; whatever happens here, the user sees the error that made us undo
                self.stop_procs(ref, 2.0)
            except Exception as e:  # noqa: BLE001
                print(f"jupyter_mesh: while undoing the spawn of '{name}': {e}", file=sys.stderr)
            fails = [f for e in errors if isinstance(e, SupervisionError) for f in e.failures]
            if fails:
                raise SupervisionError(fails, "while starting its procs")
            raise errors[0]
        self.meshes_changed(rec)
        return ref

    def spawn_request(
        self,
        agent: AgentHandle,
        ref: ProcMeshRef,
        ranks: list[int],
        env: dict[str, str],
        preload: list[str],
        shape: Shape | None = None,
        warm: bool = True,
    ) -> Future[Any]:
        req = protocol.spawn_procs(
            ref.mesh_id, ref.name, ranks, (shape or ref.shape).to_wire(), env, preload, ref.host_dims, warm
        )
        if agent.host_key == context().host_key:  # same machine: procs see our modules and relative paths
            req.update(cwd=os.getcwd(), path=sys.path)
        return self.client.request(agent.addr, req, what=f"spawn of proc mesh '{ref.name}'")

    def stop_procs(self, ref: ProcMeshRef, timeout: float) -> None:
        rec = self.meshes.get(ref.mesh_id)
        if rec is None or rec.stopped:
            return
        rec.stopped = True
        self.client.mark_stopped(ref.mesh_id)
        self.state.stopped(ref.mesh_id)
        # actors elsewhere holding this mesh: calls to it fail as closed instead of waiting
        self.notify_procs(protocol.notice("stopped", ref.mesh_id))
        if self._closed:
            return
        futs = [
            self.client.request(a, protocol.stop_procs(ref.mesh_id, timeout), what=f"stop of '{ref.name}'")
            for a in ref.agent_addrs
        ]
        # bounded whatever state the mesh is in: an agent that is lost has taken its procs with it;
        # the procs of one that does not confirm in time are killed from here
        deadline = time.monotonic() + timeout + 5.0
        for h, f in enumerate(futs):
            try:
                f.get(time_left(deadline))
            except SupervisionError:
                pass  # its agent is gone, and its procs with it
            except MeshTimeoutError:
                self._force_stop(rec, h, f"it did not confirm the stop of '{ref.name}' within {timeout + 5.0:g} s")
        for addr in ref.proc_addrs:
            if addr:
                self.client.forget_proc(addr)
        self.meshes_changed(rec)

    def job_stopping(self, job: Job) -> None:
        """A job stops its agents, and with them every proc of its meshes: those meshes are stopped
        (calls raise SupervisionError, kind stopped), not failed (the procs' exits are not failures to report)."""
        for rec in list(self.meshes.values()):
            if rec.job is job and not rec.stopped:
                self._stopped_with_agents(rec)

    def agents_stopping(self, addrs: list[str]) -> None:
        """A job is about to stop these agents on purpose: the meshes with procs on them are stopped
        first, whichever HostMesh spawned them (Monarch's ProcessJob hands out several of the same
        hosts), so their procs' exits are not reported as failures and calls to them fail at once.
        Without this a call to such a mesh waited for its timeout, or for ever: nobody watches a
        forgotten agent."""
        gone = set(addrs)
        for rec in list(self.meshes.values()):
            if not rec.stopped and gone.intersection(rec.ref.agent_addrs):
                self._stopped_with_agents(rec)
                for a in rec.ref.agent_addrs:  # a mesh over other agents too: their procs go as well
                    if a not in gone and not self._closed:
                        self.client.request(
                            a, protocol.stop_procs(rec.ref.mesh_id, 5.0), what=f"stop of '{rec.ref.name}'"
                        )

    def _stopped_with_agents(self, rec: MeshRecord) -> None:
        rec.stopped = True
        self.client.mark_stopped(rec.ref.mesh_id)
        self.state.stopped(rec.ref.mesh_id)
        self.notify_procs(protocol.notice("stopped", rec.ref.mesh_id))
        for addr in rec.ref.proc_addrs:
            if addr:
                self.client.forget_proc(addr)

    def _force_stop(self, rec: MeshRecord, host: int, why: str) -> None:
        """An agent did not answer a stop: kill its procs of this mesh ourselves where we can (same
        machine), and say what was forced."""
        ref = rec.ref
        ranks = [r for r, h in enumerate(ref.rank_host) if h == host]
        killed = []
        if ref.host_keys and ref.host_keys[host] == context().host_key:
            for r in ranks:
                pid = rec.pids.get(r)
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except (ProcessLookupError, PermissionError):
                        pass
        # the agent itself is judged by its heartbeats, not by this: its other meshes stay
        print(
            f"jupyter_mesh: stopping '{ref.name}': the agent at {ref.agent_addrs[host]} {why.removeprefix('it ')}; "
            f"forced: killed procs {killed or 'none (not on this machine)'}",
            file=sys.stderr,
        )

    def _record_spawn(self, mesh: ActorMeshRef, payload: bytes, bufs: list[Any]) -> None:
        rec = self.meshes.get(mesh._ref.mesh_id)
        if rec is not None:
            rec.actors.append((mesh, payload, [bytes(b) for b in bufs]))
            self.meshes_changed(rec)

    def meshes_changed(self, rec: MeshRecord) -> None:
        """A job that remembers its meshes for a later controller (``keep_alive``) saves them now."""
        if rec.job is None:
            return
        try:
            rec.job.meshes_changed()
        except Exception as e:  # noqa: BLE001 - the mesh works; only its record for a later kernel is behind
            print(f"jupyter_mesh: could not save the meshes of {rec.job!r}: {e}", file=sys.stderr)

    def logs(self, ref: ProcMeshRef, rank: int | None, tail: int | None) -> list[tuple[float, int, int, str]]:
        lines = self.worker_logs.lines(ref.mesh_id, rank)
        return lines[-tail:] if tail else lines

    def stacks(self, ref: ProcMeshRef, ranks: list[int], timeout: float, all_threads: bool) -> Stacks:
        """Every thread's stack on ``ranks`` now, asked of each proc's receive thread at once."""
        return ask_stacks(self.client, ref, self.meshes.live(ref), ranks, timeout, all_threads)

    def is_stopped(self, mesh_id: str) -> bool:
        rec = self.meshes.get(mesh_id)
        if rec is None:  # a mesh another process spawned (passed to an actor here): as its notices say
            return mesh_id in self.client.calls.stopped
        return rec.stopped

    def proc_pids(self, mesh_id: str) -> dict[int, int]:
        return dict(self.meshes[mesh_id].pids)

    # -- shutdown ---------------------------------------------------------------------------------
    def _at_exit(self) -> None:
        # a failure handed to the user's fault hook just before the program ended: the hook ran on the
        # receive thread before anyone could see the failure, so a script that ended then still had it
        # run; on its own thread (a daemon) it was cut off, or never began. Let it finish, with the
        # mesh still up (it may respawn or call), but not hold the exit for ever
        if not hooks.drain_fault_hooks(hooks.DRAIN_AT_EXIT_S):
            print(
                f"jupyter_mesh: a fault hook still ran {hooks.DRAIN_AT_EXIT_S:g} s after the program ended; "
                "exiting without it (failures queued behind it were not handed to it)",
                file=sys.stderr,
            )
        self.shutdown()
        err = self.pending_fault
        if err is not None:  # fail fast: an ignored failure makes the program fail
            print(f"jupyter_mesh: exiting with an unhandled failure:\n{err}", file=sys.stderr)
            exit_code.exit_at_end(1)  # after the program's other atexit handlers, also those registered before us

    def shutdown(self) -> None:
        """Stop every agent (and so every proc); fail whatever still waits. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for mesh_id, rec in list(self.meshes.items()):  # (a spawn on another thread may add one)
            rec.stopped = True
            self.state.stopped(mesh_id)
            self.worker_logs.stopped(mesh_id)
        with self.client.calls.lock:
            self.client.calls.stopped.update(self.meshes)
            Controller._shut_down_meshes.update(self.meshes)
        self.links.close()
        if self.debug_socket is not None:
            self.debug_socket.close()
        self.client.fail_all(MeshClosedError("the jupyter_mesh controller shut down while this call was pending"))
        for job in list(self._jobs):
            try:
                if job.keep_alive and job.running():
                    job.detach()  # its agents keep their procs for the next controller
                else:
                    job.stop()
            except Exception as e:  # noqa: BLE001 - keep stopping the others
                print(f"jupyter_mesh: error stopping {job!r}: {e}", file=sys.stderr)
        if self._thread is not None:  # an embedded controller leaves the proc's transport alone
            self.transport.stop_serving()
            self._thread.join(2.0)
            if self.client.boxes is not None:
                self.client.boxes.close()
            # TCP peers (agents on other hosts) must still get what we queued last: their SHUTDOWN
            self.transport.close(linger_ms=500 if self.transport.bind.startswith("tcp://") else 0)
            from .._wire import shm as _shm

            _shm.sweep(self.transport.shm_prefix)  # segments no receiver claimed (it died first)
            remove_session_dir(self.transport.bind)  # and the sockets of processes that were killed
        with Controller._instance_lock:
            if Controller._instance is self:
                Controller._instance = None
                hooks.hold_faults_with(None)
        if context().installed_client() is self.client:
            context().set_client(None)
        try:
            atexit.unregister(self._at_exit)
        except Exception:  # noqa: BLE001
            pass
