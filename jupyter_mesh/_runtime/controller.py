"""The controller: the one process that owns the session, its agents and its meshes.

It lives inside the user's program (a script or a Jupyter kernel). A daemon receive thread turns
replies into future results and agent events (proc exits, worker output) into supervision and
printed output; everything else runs on the caller's thread. One per process: ``Controller.get()``.
"""

from __future__ import annotations

import atexit
import os
import secrets
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .._future import Future
from .._serialize import loads
from .._shape import Shape
from .._transport import Message, Transport
from ..errors import Failure, MeshClosedError, MeshError, MeshTimeoutError, SupervisionError, format_coords
from .client import Client

if TYPE_CHECKING:
    from .._mesh import ProcMeshRef
    from ..jobs import AgentHandle, Job

__all__ = ["Controller", "OutputSink"]


def _local_host_key() -> str:
    from .agent import host_key

    return host_key()

OutputSink = Callable[[str, int, str, int, list[str]], None]
"""(mesh name, rank, coords label, fd 1/2, lines) -> None: where worker output goes."""


def print_output(mesh: str, rank: int, label: str, fd: int, lines: list[str]) -> None:
    stream = sys.stdout if fd == 1 else sys.stderr
    prefix = f"[{mesh} {label}] "
    stream.write("".join(prefix + line + "\n" for line in lines))
    stream.flush()


@dataclass
class _ProcMeshRecord:
    ref: ProcMeshRef
    pids: dict[int, int]
    stopped: bool = False
    failures: dict[int, Failure] = field(default_factory=dict)


class Controller:
    """Session key, control-plane endpoint, agents and proc meshes of this program."""

    _instance: Controller | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> Controller:
        inst = cls._instance
        if inst is None:
            with cls._instance_lock:
                inst = cls._instance
                if inst is None:
                    inst = cls._instance = Controller()
        return inst

    def __init__(self, bind: str | None = None):
        self.key = secrets.token_bytes(32)
        self.transport = Transport(self.key, bind or os.environ.get("JUPYTER_MESH_BIND", "tcp://127.0.0.1"))
        self.address = self.transport.address
        self.client = Client(self.transport)
        self.output: OutputSink = print_output
        self._agent_waiters: dict[str, Future[dict[str, Any]]] = {}
        self._meshes: dict[str, _ProcMeshRecord] = {}
        self._jobs: list[Job] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=self.transport.serve, args=(self._on_message,), name="jupyter-mesh-recv", daemon=True
        )
        self._thread.start()
        atexit.register(self.shutdown)

    # -- events from the wire (receive thread) ----------------------------------------------------
    def _on_message(self, msg: Message, frames: list[Any]) -> None:
        h = msg.header
        k = h["k"]
        if k == "r" or k == "g":
            self.client.on_reply(msg)
        elif k == "out":
            rec = self._meshes.get(h["m"])
            self.output(rec.ref.name if rec else h["m"], h["rk"], h["label"], h["fd"], h["lines"])
        elif k == "rdma":
            from .. import _rdma_owner as _rdma

            _rdma.handle_message(self.transport, msg)
        elif k == "proc_exit":
            self._proc_exit(h["m"], h["rk"], loads(msg.payload, msg.buffers))
        elif k == "agent_up":
            w = self._agent_waiters.pop(h.get("nonce", ""), None)
            if w is not None:
                w._set_result(h)

    def _proc_exit(self, mesh_id: str, rank: int, failure: Failure) -> None:
        rec = self._meshes.get(mesh_id)
        if rec is None or rec.stopped:
            return
        rec.failures[rank] = failure
        self.client.mark_failed({rank: failure}, mesh_id)
        print(f"jupyter_mesh: [{failure.mesh} {format_coords(failure.coords)}] {failure.detail}", file=sys.stderr)

    # -- agents -----------------------------------------------------------------------------------
    def expect_agent(self, nonce: str) -> Future[dict[str, Any]]:
        fut: Future[dict[str, Any]] = Future("agent start")
        self._agent_waiters[nonce] = fut
        return fut

    def register_job(self, job: Job) -> None:
        self._check_open()
        self._jobs.append(job)

    def _check_open(self) -> None:
        if self._closed:
            raise MeshClosedError("the jupyter_mesh controller was shut down; start a new program or kernel")

    # -- proc meshes ------------------------------------------------------------------------------
    def spawn_procs(
        self, job: Job, host_indices: list[int], shape: Shape, name: str, env: dict[str, str],
        preload: list[str], timeout: float,
    ) -> ProcMeshRef:
        from .._mesh import ProcMeshRef, _new_id

        self._check_open()
        agents: list[AgentHandle] = job.agents(timeout)
        hosts = [agents[i] for i in host_indices]
        per_host = len(shape) // len(hosts)
        mesh_id = _new_id(name)
        ref = ProcMeshRef(mesh_id, name, shape, [""] * len(shape), [r // per_host for r in range(len(shape))],
                          [a.addr for a in hosts], [a.host_key for a in hosts])
        rec = _ProcMeshRecord(ref, {})
        self._meshes[mesh_id] = rec
        futs = []
        for pos, agent in enumerate(hosts):
            ranks = list(range(pos * per_host, (pos + 1) * per_host))
            futs.append(self.client.request(agent.addr, {
                "k": "spawn_procs", "mesh_id": mesh_id, "name": name, "ranks": ranks, "shape": shape.to_wire(),
                "env": env, "preload": preload,
                # same machine: procs see the controller's modules and relative paths
                **({"cwd": os.getcwd(), "path": sys.path} if agent.host_key == _local_host_key() else {}),
            }, what=f"spawn of proc mesh '{name}'"))
        errors: list[BaseException] = []
        for f in futs:
            try:
                for rank, addr, pid in f.get(timeout):
                    ref.proc_addrs[rank] = addr
                    rec.pids[rank] = pid
            except MeshTimeoutError:
                errors.append(MeshTimeoutError("spawn", timeout, f"procs of '{name}' did not all start"))
            except MeshError as e:
                errors.append(e)
        if errors:
            self.stop_procs(ref, 2.0)
            fails = [f for e in errors if isinstance(e, SupervisionError) for f in e.failures]
            if fails:
                raise SupervisionError(fails, "while starting its procs")
            raise errors[0]
        return ref

    def stop_procs(self, ref: ProcMeshRef, timeout: float) -> None:
        rec = self._meshes.get(ref.mesh_id)
        if rec is None or rec.stopped:
            return
        rec.stopped = True
        self.client.mark_stopped(ref.mesh_id)
        if self._closed:
            return
        futs = [self.client.request(a, {"k": "stop_procs", "mesh_id": ref.mesh_id, "grace": timeout},
                                    what=f"stop of '{ref.name}'") for a in ref.agent_addrs]
        for f in futs:
            try:
                f.get(timeout + 5.0)
            except MeshTimeoutError:
                raise MeshTimeoutError("stop", timeout + 5.0, f"agents did not confirm that '{ref.name}' stopped") from None

    def is_stopped(self, mesh_id: str) -> bool:
        rec = self._meshes.get(mesh_id)
        return rec is None or rec.stopped

    def proc_pids(self, mesh_id: str) -> dict[int, int]:
        return dict(self._meshes[mesh_id].pids)

    # -- shutdown ---------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop every agent (and so every proc); fail whatever still waits. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for rec in self._meshes.values():
            rec.stopped = True
        self.client.fail_all(MeshClosedError("the jupyter_mesh controller shut down while this call was pending"))
        for job in self._jobs:
            try:
                job.stop()
            except Exception as e:  # noqa: BLE001 - keep stopping the others
                print(f"jupyter_mesh: error stopping {job!r}: {e}", file=sys.stderr)
        self.transport.stop_serving()
        self._thread.join(2.0)
        self.transport.close()
        from .. import _shm

        _shm.sweep(self.transport.shm_prefix)  # segments no receiver claimed (it died first)
        with Controller._instance_lock:
            if Controller._instance is self:
                Controller._instance = None
        from . import client as _client_mod

        if _client_mod._current is self.client:
            _client_mod.set_current_client(None)
        try:
            atexit.unregister(self.shutdown)
        except Exception:  # noqa: BLE001
            pass

