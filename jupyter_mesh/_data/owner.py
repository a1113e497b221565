"""The owner's side of RDMABuffer: the buffers this process owns and what it answers about them.

Every process that creates an ``RDMABuffer`` keeps here: the registered regions (and their UCX
registrations), a **liveness table** and the handler of the signed ``rdma`` requests of the zmq
backend, which runs on the process's receive thread, never on an actor's.

The liveness table is how a stale handle learns, one-sided, that its buffer was dropped: one 8-byte
word per live buffer in fd-backed shared memory (also registered with UCX when UCX is used), holding
a random token while the buffer lives and 0 once it is dropped. Readers on this host check it through
the mapping, readers over UCX with an 8-byte get, before they move any byte. A dropped region is kept
alive a few seconds more (``GRACE_S``), so a transfer that passed the check just before the drop still
touches live memory. After the tokens the table holds each live buffer's extent (address and size in
the owner's memory): a same-host reader copying with ``process_vm_readv`` (``vm``) takes them from
there, never from the handle it was sent.
"""

from __future__ import annotations

import mmap
import os
import pickle
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from .._core.context import context
from .._wire.protocol import OK, RAISED, reply_header
from ..errors import MeshClosedError, MeshError, MeshValueError
from . import ucx as _ucx
from . import watch as _watch
from .memory import Region, buffer_address, copy_bytes

__all__ = ["Owned", "OwnerInfo", "ShmDesc", "handle_message", "state"]

SLOTS = 8192  # live buffers per process
GRACE_S = 5.0
TABLE_BYTES = SLOTS * 24  # SLOTS tokens, then SLOTS (address, nbytes) pairs


def extent_offset(slot: int) -> int:
    """Where a slot's (address, nbytes) pair is in the liveness table."""
    return SLOTS * 8 + 16 * slot


@dataclass(frozen=True)
class OwnerInfo:
    """Who owns a buffer: travels inside every handle."""

    addr: str  # control-plane inbox of the owning process
    host: str  # host key (same boot and network namespace)
    pidns: int
    pid: int
    start: int  # process start time: (pid, start) names one process across pid reuse
    table_fd: int  # the liveness table (fd in the owner, inode to recognise it)
    table_inode: int
    mesh_id: str | None = None  # None: the controller (or a process outside any mesh)
    mesh_name: str | None = None
    coords: tuple[tuple[str, int], ...] = ()
    rank: int = -1


@dataclass(frozen=True)
class ShmDesc:
    fd: int
    inode: int
    size: int  # bytes of the whole shared storage
    offset: int  # where the region starts in it


class _Liveness:
    def __init__(self) -> None:
        self.fd = os.memfd_create("jupyter-mesh-liveness", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, TABLE_BYTES)
        self.map = mmap.mmap(self.fd, TABLE_BYTES)
        self.words = memoryview(self.map).cast("Q")
        self.inode = os.fstat(self.fd).st_ino
        self.address = buffer_address(self.map)
        self.free = list(range(SLOTS - 1, -1, -1))
        self.ucx: _ucx.UcxDesc | None = None
        self.lock = threading.Lock()

    def take(self, address: int, nbytes: int) -> tuple[int, int]:
        with self.lock:
            if not self.free:
                raise MeshError(f"this process owns {SLOTS} live RDMABuffers; drop() the ones no longer needed")
            slot = self.free.pop()
        token = secrets.randbits(63) | 1
        at = extent_offset(slot) // 8
        self.words[at], self.words[at + 1] = address, nbytes  # before the token: a reader checks it first
        self.words[slot] = token
        return slot, token

    def clear(self, slot: int) -> None:
        self.words[slot] = 0
        at = extent_offset(slot) // 8
        self.words[at] = self.words[at + 1] = 0
        with self.lock:
            self.free.append(slot)

    def ucx_desc(self) -> _ucx.UcxDesc:
        with self.lock:
            if self.ucx is None:
                self.ucx = _ucx.node().register(self.address, SLOTS * 8, False)[1]
            return self.ucx


class Owned:
    """The owner's record of a live buffer."""

    def __init__(self, region: Region, slot: int):
        self.region = region
        self.slot = slot
        self.memh: int | None = None
        self.ucx: _ucx.UcxDesc | None = None
        self.lock = threading.Lock()

    def host_view(self, offset: int, n: int) -> memoryview:
        r = self.region
        if r.is_tensor:
            import torch

            flat = r.obj.detach().reshape(-1).view(torch.uint8)
            return memoryview(flat.numpy())[offset : offset + n]  # keeps the tensor alive while sent
        return r.obj[offset : offset + n]


class State:
    """The data plane of this process: buffers it owns, handles it dropped, mappings it holds."""

    def __init__(self) -> None:
        from .._wire import shm as _shm

        self.pid = os.getpid()
        self.owned: dict[str, Owned] = {}
        self.dropped: set[str] = set()
        self.ucx_descs: dict[str, tuple[_ucx.UcxDesc, _ucx.UcxDesc]] = {}  # reader cache: (buffer, table)
        self.regions = _shm.RegionMap()
        self.lock = threading.Lock()
        self._me: OwnerInfo | None = None
        self._table: _Liveness | None = None
        self._graveyard: list[tuple[float, Owned]] = []

    @property
    def table(self) -> _Liveness:
        with self.lock:
            if self._table is None:
                self._table = _Liveness()
            return self._table

    def me(self) -> OwnerInfo:
        ctx = context()
        addr = ctx.client().address
        # rebuilt when the client changed: after shutdown() a program's new controller listens elsewhere
        if self._me is None or self._me.addr != addr:
            who = ctx.identity
            t = self.table
            start = _watch.process_start_time(self.pid)
            self._me = OwnerInfo(addr, ctx.host_key, ctx.pidns, self.pid, start, t.fd, t.inode,
                                 who.mesh_id if who else None, who.mesh_name if who else None, who.coords if who else (),
                                 who.rank if who else -1)  # fmt: skip
        return self._me

    def own(self, buf_id: str, region: Region) -> tuple[int, int]:
        slot, token = self.table.take(region.address, region.nbytes)
        with self.lock:
            self.owned[buf_id] = Owned(region, slot)
        return slot, token

    def register_ucx(self, buf_id: str) -> tuple[_ucx.UcxDesc, _ucx.UcxDesc]:
        """UCX descriptors of the buffer and of the liveness table (registering them on first use)."""
        owned = self.owned.get(buf_id)
        if owned is None:
            raise MeshClosedError("this RDMABuffer was dropped by its owner; ask it for a new one")
        table = self.table.ucx_desc()
        with owned.lock:
            if owned.ucx is None:
                r = owned.region
                owned.memh, owned.ucx = _ucx.node().register(r.address, r.nbytes, r.is_cuda)
            return owned.ucx, table

    def release(self, buf_id: str) -> None:
        now = time.monotonic()
        with self.lock:
            owned = self.owned.pop(buf_id, None)
            self.dropped.add(buf_id)
            if owned is not None:
                self._graveyard.append((now + GRACE_S, owned))
            due = [o for t, o in self._graveyard if t <= now]
            self._graveyard = [(t, o) for t, o in self._graveyard if t > now]
        if owned is not None:
            self.table.clear(owned.slot)  # stale handles see the drop from now on
        node = _ucx.existing()
        for o in due:  # dropped more than GRACE_S ago: no transfer can still be on it
            if o.memh is not None and node is not None:
                node.unregister(o.memh)


_state_obj: State | None = None
_state_lock = threading.Lock()


def state() -> State:
    global _state_obj
    with _state_lock:
        if _state_obj is None or _state_obj.pid != os.getpid():
            _state_obj = State()
        return _state_obj


def handle_message(transport: Any, msg: Any) -> None:
    """A signed ``rdma`` request about a buffer this process owns; answered without its actors."""
    from .._wire.serialize import dumps, loads
    from .._wire.transport import Message

    h = msg.header
    st = state()

    def reply(ok: int, obj: Any) -> None:
        payload, bufs = dumps(obj)
        transport.send(h["s"], Message(reply_header(h["i"], ok), payload, bufs))

    op = h.get("op")
    try:
        if op == "ucx":  # registering may start UCX (a moment): not on the receive thread

            def serve() -> None:
                try:
                    reply(OK, tuple(tuple(vars(d).values()) for d in st.register_ucx(h["b"])))
                except MeshClosedError as e:
                    reply(RAISED, e)
                except Exception as e:  # noqa: BLE001 - the reader gets it
                    reply(RAISED, MeshError(f"the owner could not register the buffer with UCX: {e}"))

            threading.Thread(target=serve, name="rdma-ucx-register", daemon=True).start()
            return
        if op == "drop":
            st.release(h["b"])
            reply(OK, None)
            return
        owned = st.owned.get(h["b"])
        if owned is None:
            raise MeshClosedError("this RDMABuffer was dropped by its owner; ask it for a new one")
        off, n = int(h["o"]), int(h["n"])
        if off < 0 or off + n > owned.region.nbytes:
            raise MeshValueError(f"range {off}+{n} is outside the buffer's {owned.region.nbytes} bytes")
        if op == "get":
            reply(OK, pickle.PickleBuffer(owned.host_view(off, n)))
        elif op == "put":
            data = memoryview(loads(msg.payload, msg.buffers)).cast("B")
            if data.nbytes != n:
                raise MeshValueError(f"got {data.nbytes} bytes, expected {n}")
            copy_bytes(owned.region.address + off, buffer_address(data), n)
            reply(OK, None)
        else:
            raise MeshValueError(f"unknown data-plane request {op!r}")
    except Exception as e:  # noqa: BLE001 - every request gets an answer
        reply(RAISED, e)
