"""``attach_to_workers``: hosts whose agents someone else started, waiting to be attached.

On each host: ``jupyter-mesh agent --listen tcp://IP:PORT`` (by hand, a launcher, a container's
entry point). It admits only a controller holding the user's mesh key (``jupyter-mesh keygen``,
shared out of band like an SSH key); the attach message, inside CURVE, hands it this session's own
keys, and the agent serves this session until it ends, then waits for the next one.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._api.host_mesh import HostMesh
from .._core.future import Future, time_left
from .._core.shape import Shape
from .._runtime.hosts import AgentHandle, Job
from .._wire.addresses import local_ip_towards, parse_tcp
from .._wire.keyfile import KeyFile, default_key_path, read_key_file
from .._wire.protocol import VERSION, Kind
from ..errors import MeshClosedError, MeshError, MeshTimeoutError, MeshValueError
from .warm import split

if TYPE_CHECKING:  # zmq is imported when a job is made, not with the package
    from .._wire.transport import Transport

__all__ = ["AttachJob", "attach_to_workers"]


class AttachJob(Job):
    """Hosts at ``addresses`` (``tcp://IP:PORT``, one listening agent each), in that order."""

    def __init__(
        self,
        addresses: Sequence[str],
        key_file: str | None = None,
        preload: Sequence[str] | None = None,
    ):
        from .._runtime.controller import Controller

        if isinstance(addresses, str) or not addresses:
            raise MeshValueError(
                f"attach needs a list of agent addresses like ['tcp://10.0.0.2:6000'], got {addresses!r}"
            )
        parsed = []
        for a in addresses:
            try:
                ip, port = parse_tcp(a)
            except ValueError as e:
                raise MeshValueError(str(e)) from None
            parsed.append(f"tcp://{ip}:{port}")
        if len(set(parsed)) != len(parsed):
            raise MeshValueError(f"an agent address is listed twice: {list(addresses)}")
        self.addresses = parsed
        self._kf: KeyFile = read_key_file(key_file or default_key_path())
        self._preload, self._warm = split(preload)  # None: each host preloads what it has (``jobs.warm``)
        self._controller = Controller.reachable_from(parse_tcp(parsed[0])[0])
        self._controller.register_job(self)
        self._lock = threading.Lock()
        self._waiters: list[Future[dict[str, Any]]] = []
        self._agents: list[AgentHandle] | None = None
        self._lost: set[int] = set()
        self._stopped = False
        self._door: Transport | None = None  # speaks the mesh key: only to say "attach"
        self._nonces: list[str] = [""] * len(parsed)
        for i in range(len(parsed)):
            self._waiters.append(self._attach(i))

    def _attach(self, index: int) -> Future[dict[str, Any]]:
        ctl = self._controller
        addr = self.addresses[index]
        nonce = secrets.token_hex(8)
        waiter = ctl.expect_agent(nonce)
        ctl.stop_expecting(self._nonces[index])  # an earlier attach to this host is not waited for now
        self._nonces[index] = nonce
        curve = ctl.transport.curve
        if curve is None:
            raise MeshValueError("attaching needs a CURVE session (JUPYTER_MESH_INSECURE is set): refused")
        session = {
            "v": VERSION,
            "key": ctl.key.hex(),
            "curve": curve.to_wire(),
            "controller": ctl.address,
            "nonce": nonce,
            "host_index": index,
            "hb_timeout": ctl.hb_timeout,
            "preload": self._preload,
            "warm": self._warm,
        }
        from .._wire.transport import Message, Transport

        if self._door is None:
            ip = local_ip_towards(parse_tcp(addr)[0])
            self._door = Transport(self._kf.key, f"tcp://{ip}", self._kf.curve)
        self._door.send(addr, Message({"k": Kind.ATTACH, "cfg": session}))
        return waiter

    def agents(self, timeout: float = 60.0) -> list[AgentHandle]:
        with self._lock:
            if self._stopped:
                raise MeshClosedError("this job was stopped; attach again")
            for i in sorted(self._lost):  # its session agent is gone: the listener takes a new session
                self._lost.discard(i)
                print(f"jupyter_mesh: attaching {self.addresses[i]} again", file=sys.stderr)
                self._waiters[i] = self._attach(i)
                self._agents = None
            if self._agents is None:
                out = []
                deadline = time.monotonic() + timeout  # the agents start together: one bound for all
                for i, w in enumerate(self._waiters):
                    try:
                        h = w.get(time_left(deadline))
                    except MeshTimeoutError:
                        raise MeshTimeoutError(
                            "attach",
                            timeout,
                            f"no agent answered at {self.addresses[i]}: is `jupyter-mesh agent --listen "
                            f"{self.addresses[i]}` running there, with the same mesh key as this controller "
                            f"({default_key_path()} unless key_file= said otherwise), and can that host reach "
                            f"{self._controller.address}?",
                        ) from None
                    except MeshError:
                        self._lost.add(i)  # refused (busy with another session): asked afresh next time,
                        raise  # not now, so a refusal is never stale and no session starts unasked
                    out.append(AgentHandle(i, h["addr"], h["pid"], h["hk"]))
                self._agents = out
            return self._agents

    def agent_lost(self, addr: str) -> None:
        for a in self._agents or []:
            if a.addr == addr:
                self._lost.add(a.index)

    def running(self) -> bool:
        return not self._stopped

    def host_mesh(self) -> HostMesh:
        return HostMesh(self._controller, self, Shape.from_sizes({"hosts": len(self.addresses)}))

    def stop(self) -> None:
        """End our sessions: each agent stops its procs and its listener waits for the next controller."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        from .._wire.transport import Message

        ctl = self._controller
        for nonce in self._nonces:  # a hello still on its way is told to shut down, not admitted
            ctl.stop_expecting(nonce)
        agents = self._agents or []
        if not ctl.is_closed:
            ctl.agents_stopping([a.addr for a in agents])
        for a in agents:
            try:
                if not ctl.is_closed:
                    ctl.transport.send(a.addr, Message({"k": Kind.SHUTDOWN}))
            except Exception:  # noqa: BLE001 - it may be gone; heartbeats stopping ends it anyway
                pass
        if not ctl.is_closed:
            ctl.forget_agents([a.addr for a in agents])
        if self._door is not None:  # an attach still queued for a host that never answered is
            self._door.close(linger_ms=0)  # dropped: it must not start a session for us later
            self._door = None

    def __repr__(self) -> str:
        return f"<AttachJob {', '.join(self.addresses)}>"


def attach_to_workers(
    workers: Sequence[str] | None = None,
    *,
    name: str | None = None,
    ca: str | None = None,
    key_file: str | None = None,
    preload: Sequence[str] | None = None,
    timeout: float = 60.0,
) -> HostMesh:
    """A host mesh over agents started with ``jupyter-mesh agent --listen ADDR`` (Monarch's name).

    ``workers``: their addresses, ``tcp://IP:PORT``. ``key_file``: the mesh key they admit (default
    ``~/.jupyter_mesh/mesh.key``). ``ca`` is accepted for Monarch programs (``"trust_all_connections"``)
    and changes nothing: every connection is authenticated by the mesh key. ``name`` is unused.
    ``preload``: what each host's template imports (default: torch & co. where installed, ``jobs.warm``).
    Waits (at most ``timeout``) until every agent answered, so a wrong address fails here."""
    if workers is None:
        raise MeshValueError("attach_to_workers needs workers=['tcp://IP:PORT', ...]")
    if ca not in (None, "trust_all_connections"):
        raise MeshValueError(f"ca={ca!r}: jupyter_mesh authenticates agents with the mesh key (key_file=), not a CA")
    job = AttachJob(workers, key_file=key_file, preload=preload)
    try:
        job.agents(timeout)
    except BaseException:
        job.stop()
        raise
    return job.host_mesh()
