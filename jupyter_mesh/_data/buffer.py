"""RDMABuffer: a small picklable handle to a memory region owned by one process, read and written by others.

The owner wraps a contiguous tensor or buffer (``RDMABuffer(t)``) and passes the handle anywhere (as an
endpoint argument or result); whoever holds it calls ``read_into(dst)`` (remote -> local) or
``write_from(src)`` (local -> remote). Transfers are one-sided: the owner's endpoint code never runs for
them. Which backend moves the bytes (``get_rdma_backend``):

``shm``  owner on this host: the tensor's storage lives in fd-backed shared memory (moved there once,
         in place, when the buffer is created) and the reader copies straight from/into it: one copy.
``vm``   owner on this host, memory that is not shared (memoryview, bytearray, numpy): the kernel copies
         between the two processes (``process_vm_readv``/``writev``, ``_data/vm.py``): one copy. Where
         the kernel refuses (no ptrace permission, e.g. Yama), that owner is served over zmq instead.
``ucx``  UCX one-sided get/put (``_ucx``): cross-host, CUDA memory, or when forced. The owner registers
         the region with UCX when forced to, or lazily when a reader first asks over the control plane.
``zmq``  always available: the request goes over the signed control plane and the owner's *receive
         thread* (not its actors) answers with the bytes as one zero-copy frame, or copies them in.

``JUPYTER_MESH_RDMA_BACKEND=auto|shm|ucx|zmq`` forces one (in procs: ``spawn_procs(env=...)``).
Every check that can fail without a peer (dropped, stopped mesh, size, dtype, device, contiguity,
read-only) runs before a byte moves; a transfer in flight fails at its timeout, or at once when the
owner is on this host and exits. Handles and UCX keys travel only inside signed messages.

A buffer stays registered, and its memory alive, until ``drop()``; the owner's side (registry, liveness
table, the requests it answers) is ``_rdma_owner``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pickle
import secrets
import threading
import time
import warnings
from typing import Any

from .._core.context import context
from .._core.future import Future
from .._wire import shm as _shm
from .._wire.protocol import Kind
from ..errors import Failure, MeshClosedError, MeshError, MeshValueError, SupervisionError
from . import owner as _rdma_owner
from . import ucx as _ucx
from . import vm as _vm
from . import watch as _watch
from .memory import BYTES, Region, buffer_address, copy_bytes, region_of
from .owner import OwnerInfo, ShmDesc, handle_message, state

_DEATH_GRACE_S = 0.3  # how long a failed UCX transfer waits to tell a dead owner from an unreachable one

__all__ = ["ENV_BACKEND", "RDMABuffer", "get_rdma_backend", "handle_message"]

ENV_BACKEND = "JUPYTER_MESH_RDMA_BACKEND"
ENV_UCX_SAME_HOST = "JUPYTER_MESH_UCX_SAME_HOST"  # opt-in: forced UCX between processes of one host
BACKENDS = ("shm", "vm", "ucx", "zmq")
DEFAULT_TIMEOUT = 60.0  # seconds, as Monarch


def _forced() -> str | None:
    v = os.environ.get(ENV_BACKEND, "auto").strip().lower()
    if v in ("", "auto"):
        return None
    if v not in BACKENDS:
        raise MeshValueError(f"{ENV_BACKEND}={v!r} is not a backend; use auto, shm, vm, ucx or zmq")
    return v


class RDMABuffer:
    """A handle to a contiguous region of memory owned by the process that created it.

    ``RDMABuffer(tensor_or_buffer)`` registers the region; the handle pickles into a few hundred bytes
    and can be sent anywhere in the session. ``read_into``/``write_from`` return futures.

    A CPU tensor's storage is moved into shared memory once, in place, as ``Tensor.share_memory_()``
    does (views and parameters that share it follow; the storage can no longer be resized). Other
    buffers (memoryview, bytearray, numpy) stay where they are and are served over UCX or ZeroMQ.
    The memory stays registered and alive until ``drop()``.
    """

    def __init__(self, data: Any):
        region = region_of(data, "the data of an RDMABuffer")
        if not region.nbytes:
            raise MeshValueError("an RDMABuffer needs at least one byte; this tensor or buffer is empty")
        forced = _forced()
        shm = None
        if region.is_tensor and not region.is_cuda and forced in (None, "shm"):
            s = _shm.share_tensor_storage(data)
            if s is not None:
                shm = ShmDesc(*s)
                region = region_of(data, "the data of an RDMABuffer")  # the storage moved, in place
        st = state()
        self._id = secrets.token_hex(8)
        self._owner: OwnerInfo = st.me()
        self._nbytes, self._dtype, self._device = region.nbytes, region.dtype, region.device
        self._readonly = region.readonly
        self._shm = shm
        self._ucx: tuple[_ucx.UcxDesc, _ucx.UcxDesc] | None = None  # (the region, the liveness table)
        self._dropped = False
        self._slot, self._token = st.own(self._id, region)
        if forced == "ucx" or region.is_cuda:
            self._ucx = st.register_ucx(self._id)

    # -- the handle ---------------------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        state = (self._id, self._owner, self._nbytes, self._dtype, self._device, self._readonly, self._shm,
                 self._ucx, self._slot, self._token)  # fmt: skip
        return (_rebuild, (state,))

    def size(self) -> int:
        """Bytes in the region."""
        return self._nbytes

    @property
    def dtype(self) -> str:
        return self._dtype

    @property
    def device(self) -> str:
        return self._device

    def __repr__(self) -> str:
        o = self._owner
        where = f"{o.mesh_name} {','.join(f'{k}={v}' for k, v in o.coords)}" if o.mesh_name else "the controller"
        state = " dropped" if self._is_dropped() else ""
        return f"<RDMABuffer {self._nbytes} bytes {self._dtype} {self._device} on {where} (pid {o.pid}){state}>"

    def _is_mine(self) -> bool:
        return self._owner.pid == os.getpid() and self._id in state().owned

    def _is_dropped(self) -> bool:
        return self._dropped or self._id in state().dropped

    def _same_host(self) -> bool:
        return self._owner.host == context().host_key and self._owner.pidns == context().pidns

    def _pid_key(self) -> tuple[int, int] | None:
        return (self._owner.pid, self._owner.start) if self._same_host() else None

    def _owner_failure(self, what: str) -> SupervisionError:
        o = self._owner
        f = Failure(
            o.mesh_name or "controller",
            dict(o.coords),
            "exit",
            f"the process that owns this RDMABuffer (pid {o.pid}) exited",
        )
        return SupervisionError([f], f"during {what}")

    # -- transfers ----------------------------------------------------------------------------------
    def read_into(self, dst: Any, *, offset: int = 0, timeout: float = DEFAULT_TIMEOUT) -> Future[None]:
        """Copy the remote region into ``dst``, a contiguous tensor or buffer of its dtype (or bytes).

        As in Monarch, ``dst`` has at least the buffer's size, and the buffer fills its first bytes (the
        rest is left as it was). With an ``offset``, ``len(dst)`` bytes from that byte of the buffer, which
        must fit. ``timeout`` bounds the wait on the owner (zmq, ucx; 60 s, Monarch's default); a same-host
        copy (shm) never waits on it. After a timeout the destination's content is undefined.
        """
        return self._transfer("get", dst, offset, timeout)

    def write_from(self, src: Any, *, offset: int = 0, timeout: float = DEFAULT_TIMEOUT) -> Future[None]:
        """Copy ``src`` into the remote region; done when the owner's memory has it. As in Monarch, ``src``
        has at most the buffer's size and lands in its first bytes (the rest keeps its content); with an
        ``offset``, from that byte."""
        return self._transfer("put", src, offset, timeout)

    def _transfer(self, op: str, local: Any, offset: int, timeout: float) -> Future[None]:
        what = "RDMABuffer.read_into" if op == "get" else "RDMABuffer.write_from"
        region = region_of(local, "the destination of read_into" if op == "get" else "the source of write_from")
        self._check(op, region, offset, what)
        if op == "get" and region.nbytes > self._nbytes:  # a larger destination: its first bytes (Monarch)
            region = dataclasses.replace(region, nbytes=self._nbytes)
        backend = self._backend(region)
        fut: Future[None] = Future(f"{what} of {region.nbytes} bytes over {backend}")
        if backend == "shm":
            self._via_shm(op, region, offset, fut, what)
        elif backend == "vm":
            self._via_vm(op, region, offset, timeout, fut, what)
        elif backend == "zmq":
            self._via_zmq(op, region, offset, timeout, fut, what)
        else:
            self._via_ucx(op, region, offset, timeout, fut, what)
        return fut

    def _check(self, op: str, region: Region, offset: int, what: str) -> None:
        if self._is_dropped():
            raise MeshClosedError(f"{what}: this RDMABuffer was dropped; ask its owner for a new one")
        o = self._owner
        if o.mesh_id is not None:
            client = context().installed_client()
            if client is not None:
                client.check_rank(o.mesh_id, o.mesh_name or o.mesh_id, o.rank, what)
        n = region.nbytes
        if offset == 0:  # Monarch's: a destination at least as large, a source at most as large
            fits = n >= self._nbytes if op == "get" else n <= self._nbytes
        else:  # a window from ``offset``: it must fit
            fits = 0 < offset and offset + n <= self._nbytes
        if not fits:
            side = "destination" if op == "get" else "source"
            at = f" from byte offset {offset}" if offset else ""
            need = (
                "a destination of at least the buffer's size (it fills its first bytes)"
                if op == "get"
                else "a source of at most the buffer's size (written from its first byte)"
            )
            raise MeshValueError(
                f"{what}: size mismatch: the {side} has {n} bytes, the buffer has {self._nbytes}{at}. "
                f"Pass {need}, or an offset and a part that fits."
            )
        if region.dtype != self._dtype and region.dtype not in BYTES and self._dtype not in BYTES:
            raise MeshValueError(
                f"{what}: dtype mismatch: the buffer holds {self._dtype}, the local tensor is {region.dtype}; "
                "use the same dtype, or view both sides as torch.uint8 to move raw bytes"
            )
        if op == "get" and region.readonly:
            raise MeshValueError(f"{what}: the destination is read-only; pass a writable tensor or bytearray")
        if op == "put" and self._readonly:
            raise MeshValueError(f"{what}: the buffer was made from read-only memory; it can only be read")

    def _backend(self, region: Region) -> str:
        forced = _forced()
        cuda = region.is_cuda or self._device != "cpu"
        same = self._same_host()
        if cuda and forced not in (None, "ucx"):
            raise MeshValueError(
                f"device mismatch: {self._device} buffer, {region.device} local memory: CUDA memory moves only "
                f"over UCX, but {ENV_BACKEND}={forced}"
            )
        if forced == "shm" and not (same and self._shm is not None):
            why = "the owner is on another host" if not same else "its data is not a CPU tensor in shared memory"
            raise MeshValueError(f"{ENV_BACKEND}=shm cannot serve this buffer: {why}; use auto, ucx or zmq")
        if forced == "vm" and not (same and not cuda and _vm.available()):
            why = "the owner is on another host" if not same else "this platform has no process_vm_readv"
            raise MeshValueError(f"{ENV_BACKEND}=vm cannot serve this buffer: {why}; use auto, ucx or zmq")
        if forced == "ucx" and same and not cuda and os.environ.get(ENV_UCX_SAME_HOST) != "1":
            raise MeshValueError(
                f"{ENV_BACKEND}=ucx between processes of one host: UCX would run over its TCP emulation, "
                "which does not check the bounds of remote memory access and listens outside jupyter_mesh's "
                f"private channels. One host uses shared memory (unset {ENV_BACKEND}); set "
                f"{ENV_UCX_SAME_HOST}=1 only to test or benchmark UCX on one machine"
            )
        if forced is not None:
            return forced
        if cuda or (self._ucx is not None and not same):
            return "ucx"
        if same and self._shm is not None:
            return "shm"
        if same and _vm.available() and not _vm.denied((self._owner.pid, self._owner.start)):
            return "vm"
        if not same and _ucx.available():
            return "ucx"
        return "zmq"

    def _via_shm(self, op: str, region: Region, offset: int, fut: Future[None], what: str) -> None:
        o, s = self._owner, self._shm
        assert s is not None
        regions = state().regions
        try:
            if not _watch.owner_alive(o.pid, o.start):
                raise ProcessLookupError
            table, table_base = regions.get(o.pid, o.table_fd, o.table_inode, _rdma_owner.TABLE_BYTES)
            word = ctypes.c_uint64.from_address(table_base + 8 * self._slot)
            if word.value != self._token:
                raise MeshClosedError(f"{what}: this RDMABuffer was dropped by its owner; ask it for a new one")
            mapping, base = regions.get(o.pid, s.fd, s.inode, s.size)
        except (OSError, ProcessLookupError):
            if not _watch.owner_alive(o.pid, o.start):
                fut._set_exception(self._owner_failure(what))
            else:
                fut._set_exception(MeshClosedError(f"{what}: the owner released this buffer's memory (dropped)"))
            return
        except MeshClosedError as e:
            fut._set_exception(e)
            return
        remote = base + s.offset + offset
        if op == "get":
            copy_bytes(region.address, remote, region.nbytes)
        else:
            copy_bytes(remote, region.address, region.nbytes)
        dropped = word.value != self._token
        del mapping, table, word
        if not _watch.owner_alive(o.pid, o.start):  # the copy may have raced the owner's death
            fut._set_exception(self._owner_failure(what))
        elif dropped:
            fut._set_exception(MeshClosedError(f"{what}: the owner dropped this RDMABuffer during the copy"))
        else:
            fut._set_result(None)

    def _via_vm(self, op: str, region: Region, offset: int, timeout: float, fut: Future[None], what: str) -> None:
        o = self._owner
        owner = (o.pid, o.start)
        failure: BaseException | None = None
        try:
            if not _watch.owner_alive(o.pid, o.start):
                raise ProcessLookupError(o.pid)
            table, base = state().regions.get(o.pid, o.table_fd, o.table_inode, _rdma_owner.TABLE_BYTES)
            token = ctypes.c_uint64.from_address(base + 8 * self._slot)
            extent = (ctypes.c_uint64 * 2).from_address(base + _rdma_owner.extent_offset(self._slot))
            if token.value != self._token:
                raise MeshClosedError(f"{what}: this RDMABuffer was dropped by its owner; ask it for a new one")
            address, size = extent[0], extent[1]  # the owner's own record, not the handle's word
            if size != self._nbytes or offset + region.nbytes > size:
                raise MeshError(f"{what}: the owner's record of this buffer ({size} bytes) does not match the handle")
            if region.nbytes:
                _vm.copy(op, o.pid, region.address, address + offset, region.nbytes)
            if token.value != self._token:
                failure = MeshClosedError(f"{what}: the owner dropped this RDMABuffer during the copy")
            del table, token, extent
        except _vm.Denied:  # no ptrace access to that owner here: the owner serves it (zmq)
            _vm.deny(owner)
            self._via_zmq(op, region, offset, timeout, fut, what)
            return
        except MeshError as e:
            failure = e
        except ProcessLookupError:  # ESRCH: the owner is gone, or exiting (its memory already is)
            fut._set_exception(self._owner_failure(what))
            return
        except OSError as e:  # EFAULT, or the table's fd gone: the owner released it, or is dying
            failure = MeshClosedError(f"{what}: the owner released this buffer's memory ({e.strerror or e})")
            deadline = time.monotonic() + _DEATH_GRACE_S  # a dying owner loses its memory before /proc says so
            while _watch.owner_alive(o.pid, o.start) and time.monotonic() < deadline:
                time.sleep(0.01)
        if not _watch.owner_alive(o.pid, o.start):  # the copy may have raced the owner's death
            failure = self._owner_failure(what)
        if failure is not None:
            fut._set_exception(failure)
        else:
            fut._set_result(None)

    def _watch(self, timeout: float, fut: Future[None], what: str) -> _watch.Watch:
        return _watch.watch(timeout, self._pid_key(), fut._set_exception, what, lambda: self._owner_failure(what))

    def _via_zmq(self, op: str, region: Region, offset: int, timeout: float, fut: Future[None], what: str) -> None:
        n = region.nbytes
        header: dict[str, Any] = {"k": Kind.RDMA, "op": op, "b": self._id, "o": offset, "n": n}
        data = pickle.PickleBuffer(_host_bytes(region)) if op == "put" else None
        client = context().client()

        def give_up(e: BaseException) -> None:  # timed out or the owner died: forget the request
            if "i" in header:
                client.forget_request(header["i"])
            fut._set_exception(e)

        w = _watch.watch(timeout, self._pid_key(), give_up, what, lambda: self._owner_failure(what))
        reply = client.request(self._owner.addr, header, data, what=what)

        def on_reply(r: Future[Any]) -> None:
            exc = r.exception(0)
            if not w.claim():
                return  # timed out or the owner died first: leave the destination alone
            if exc is not None:
                fut._set_exception(exc)
                return
            if op == "get":
                got = r.get(0)
                copy_bytes(region.address, buffer_address(got), n)
            fut._set_result(None)

        reply.add_done_callback(on_reply)

    def _via_ucx(self, op: str, region: Region, offset: int, timeout: float, fut: Future[None], what: str) -> None:
        node = _ucx.node()  # here, not on the receive thread: the first one takes a moment
        fut._any_thread = True  # finished on UCX's progress thread: a get() in a done callback can end
        st = state()
        w = self._watch(timeout, fut, what)
        word = ctypes.c_uint64(0)

        def done(err: BaseException | None, _keep: Any = (region, word)) -> None:
            # _keep: UCX may write into local memory until an operation completes, even after a
            # timeout (the owner may resume), so it stays alive until this runs
            o = self._owner
            local_owner = self._pid_key() is not None
            if err is not None and local_owner and not w.finished and _watch.owner_alive(o.pid, o.start):
                # a dying process closes its sockets before its exit shows in /proc: look again a
                # moment later, so an owner killed mid-transfer is named as such (not "unreachable")
                threading.Timer(_DEATH_GRACE_S, report, args=(err,)).start()
                return
            report(err)

        def report(err: BaseException | None) -> None:
            if not w.claim():
                return
            if err is not None:
                o = self._owner
                if self._pid_key() is not None and not _watch.owner_alive(o.pid, o.start):
                    err = self._owner_failure(what)  # UCX saw the connection drop before we saw the exit
                fut._set_exception(err)
            else:
                fut._set_result(None)

        def checked(err: BaseException | None, desc: _ucx.UcxDesc) -> None:
            if err is None and word.value != self._token:
                err = MeshClosedError(f"{what}: this RDMABuffer was dropped by its owner; ask it for a new one")
            if err is not None or w.finished:
                done(err)
                return
            node.transfer(op, desc, region.address, region.nbytes, offset, region.is_cuda, done)

        def post(descs: tuple[_ucx.UcxDesc, _ucx.UcxDesc]) -> None:
            desc, table = descs
            if w.finished:
                return
            try:  # first the liveness word (8 bytes, one-sided), then the data
                addr = ctypes.addressof(word)
                node.transfer("get", table, addr, 8, 8 * self._slot, False, lambda e: checked(e, desc))
            except Exception as e:  # noqa: BLE001 - reported through the future
                done(MeshError(f"{what}: UCX could not start the transfer: {e}"))

        descs = self._ucx or st.ucx_descs.get(self._id)
        if descs is not None:
            post(descs)
            return

        def on_desc(r: Future[Any]) -> None:
            exc = r.exception(0)
            if exc is not None:
                done(exc)
                return
            d = tuple(_ucx.UcxDesc(*t) for t in r.get(0))
            st.ucx_descs[self._id] = (d[0], d[1])
            post((d[0], d[1]))

        request = {"k": Kind.RDMA, "op": "ucx", "b": self._id}
        context().client().request(self._owner.addr, request, what=what).add_done_callback(on_desc)

    def drop(self) -> Future[None]:
        """Release the region: the owner forgets it (and its UCX registration); every handle stops working."""
        st = state()
        self._dropped = True
        if self._is_mine():
            st.release(self._id)
            return Future.completed(None, "RDMABuffer.drop")
        st.dropped.add(self._id)
        descs = st.ucx_descs.pop(self._id, None) or self._ucx
        node = _ucx.existing()
        if descs is not None and node is not None:
            node.forget(descs[0])
        if self._shm is not None:
            st.regions.forget(self._owner.pid, self._shm.inode)
        if self._pid_key() is not None and not _watch.owner_alive(self._owner.pid, self._owner.start):
            return Future.completed(None, "RDMABuffer.drop")
        request = {"k": Kind.RDMA, "op": "drop", "b": self._id}
        return context().client().request(self._owner.addr, request, what="RDMABuffer.drop")


def _host_bytes(region: Region) -> memoryview:
    if region.is_tensor:
        import torch

        return memoryview(region.obj.detach().reshape(-1).view(torch.uint8).numpy())
    return region.obj


def _rebuild(state: tuple[Any, ...]) -> RDMABuffer:
    b = RDMABuffer.__new__(RDMABuffer)
    (b._id, b._owner, b._nbytes, b._dtype, b._device, b._readonly, b._shm, b._ucx, b._slot, b._token) = state
    b._dropped = False
    _check_handle(b)
    return b


def _check_handle(b: RDMABuffer) -> None:
    """A handle's numbers index memory on this side (the owner's liveness table, its segment, mapped
    here): one out of range would read or write outside them, so it is refused when unpickled."""
    s = b._shm
    ok = (
        type(b._slot) is int
        and 0 <= b._slot < _rdma_owner.SLOTS
        and type(b._nbytes) is int
        and b._nbytes >= 0
        and isinstance(b._owner, OwnerInfo)
        and (s is None or (isinstance(s, ShmDesc) and 0 <= s.offset and s.offset + b._nbytes <= s.size))
    )
    if not ok:
        raise MeshValueError(
            f"an RDMABuffer handle that no owner made (slot {b._slot!r}, {b._nbytes!r} bytes, shm {s!r}): "
            "it was altered on the way; ask the owner for a new handle"
        )


def is_ibverbs_available() -> bool:
    """Monarch's question, "can transfers use InfiniBand verbs here?": an RDMA device on this host
    and UCX to drive it (ours goes through UCX, which picks verbs when it can)."""
    try:
        devices = os.listdir("/sys/class/infiniband")
    except OSError:
        return False
    return bool(devices) and _ucx.available()


def is_rdma_available() -> bool:
    """Monarch's deprecated name of :func:`is_ibverbs_available` (with its ``DeprecationWarning``)."""
    warnings.warn(
        "is_rdma_available is deprecated (as in Monarch): use is_ibverbs_available() or get_rdma_backend()",
        DeprecationWarning,
        stacklevel=2,
    )
    return is_ibverbs_available()


def get_rdma_backend(buf: RDMABuffer | None = None) -> str:
    """The backend a transfer uses: of ``buf`` (to or from CPU memory here), or, without one, to a
    process on another host. ``JUPYTER_MESH_RDMA_BACKEND`` forces it."""
    if buf is None:
        return _forced() or ("ucx" if _ucx.available() else "zmq")
    cpu = Region(None, 0, 0, buf._dtype, "cpu", False, False)
    return buf._backend(cpu)
