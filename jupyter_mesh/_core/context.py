"""Who this process is, in one object: its host, its place in a proc mesh, the client that sends for
it, and (per thread) the actor running on the calling thread.

Every layer reads it; only the runtime writes it (a proc installs its client and identity when it
starts; the controller's client is made on first use through ``slots.default_client``). Before this there
were ten module globals; now a forked child that calls :func:`context` gets a fresh one (the pid is
checked; ``os.fork`` keeps the pid it is checked against current), so nothing of the parent's identity
leaks into a new proc.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import MeshClosedError
from . import slots
from .future import Future

__all__ = [
    "ActorContext",
    "ProcIdentity",
    "ProcessContext",
    "Requester",
    "context",
    "host_key",
    "message",
    "own_rank",
]


class Requester(Protocol):
    """What the data plane and ports need of a client (the runtime's ``Client`` is one): its own address,
    a signed request to a peer, forgetting a request it gave up on, whether a rank is known broken,
    opening a port here and sending to a port anywhere."""

    @property
    def address(self) -> str: ...

    def request(self, address: str, header: dict[str, Any], obj: Any = None, what: str = "request") -> Future[Any]: ...

    def forget_request(self, req_id: int) -> None: ...

    def check_rank(self, mesh_id: str, mesh_name: str, rank: int, context: str) -> None: ...

    def open_port(self, entry: Any, weak: bool = True) -> tuple[str, int]: ...

    def send_to_port(self, address: str, port_id: int, ok: bool, obj: Any, rank: int | None) -> None: ...


@dataclass(frozen=True)
class ProcIdentity:
    """A proc's place: which mesh, which rank, at which coordinates (buffers it makes carry it)."""

    mesh_id: str
    mesh_name: str
    coords: tuple[tuple[str, int], ...]
    rank: int


class ActorContext(threading.local):
    """The actor on the calling thread: ``current_rank()`` asks its host for the actor's point, or the
    point of the message it handles (:data:`message`)."""

    proc: Any = None
    host: Any = None  # the proc runtime's ActorHost of that actor (a mesh it spawns is owned by it)


# The header of the message the running code handles (per thread, and per task of an async endpoint),
# set by the actor's host around each call; None outside a call (``__init__``, ``__supervise__``).
# ``current_rank()`` hands it to the host, which numbers the actor in the view the message was sent to,
# only when asked.
message: ContextVar[Any] = ContextVar("jupyter_mesh.message", default=None)


@contextlib.contextmanager
def own_rank() -> Iterator[None]:
    """Code run in this block sees the actor's own rank, not the message's: ``%%mesh`` cells and the
    tensor engine's ops run as their proc, whatever slice they were sent to."""
    token = message.set(None)
    try:
        yield
    finally:
        message.reset(token)


def host_key() -> str:
    """Same boot, the same network and pid namespaces and the same ``/dev/shm`` = the same host for us:
    loopback, shared memory and pids all mean the same thing on both sides. A container that shares the
    network but not the pids (``--network=host``) is another host: its pids are not ours to signal and
    shared memory we name by ``/proc/<pid>/fd`` is not its."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        netns = os.stat("/proc/self/ns/net").st_ino
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return socket.gethostname()
    try:
        shm = os.stat("/dev/shm").st_dev
    except OSError:
        shm = 0
    return f"{boot}/{netns}/{pidns}/{shm}"


class ProcessContext:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.identity: ProcIdentity | None = None
        # in a proc: what it lends a controller made inside it (``_runtime.hooks.Embedding``)
        self.embedding: Any = None
        self.actor = _actor_context
        self._client: Requester | None = None
        self._host_key: str | None = None
        self._pidns: int | None = None
        self._lock = threading.Lock()

    @property
    def host_key(self) -> str:
        if self._host_key is None:
            self._host_key = host_key()
        return self._host_key

    @property
    def pidns(self) -> int:
        """Owners and readers must share a pid namespace for pids (and /proc/<pid>/fd) to mean the same."""
        if self._pidns is None:
            try:
                self._pidns = os.stat("/proc/self/ns/pid").st_ino
            except OSError:
                self._pidns = 0
        return self._pidns

    def client(self) -> Requester:
        """The client that sends for this process: a proc's own, else the controller's (made now)."""
        c = self._client
        if c is None:
            with self._lock:
                if self._client is None:
                    make = slots.default_client
                    if make is None:
                        raise MeshClosedError("no jupyter_mesh runtime in this process; import jupyter_mesh first")
                    self._client = make()
                c = self._client
        return c

    def installed_client(self) -> Requester | None:
        """The client if one was made or installed, else None (never starts a controller)."""
        return self._client

    def set_client(self, client: Requester | None) -> None:
        self._client = client


_actor_context = ActorContext()
_context: ProcessContext | None = None
_context_lock = threading.Lock()

_pid = os.getpid()  # this process's, kept current by a fork hook: ``os.getpid()`` is a system call


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def context() -> ProcessContext:
    """This process's context (a new one after a fork)."""
    global _context
    c = _context
    if c is None or c.pid != _pid:
        with _context_lock:
            if _context is None or _context.pid != _pid:
                _context = ProcessContext()
            c = _context
    return c
