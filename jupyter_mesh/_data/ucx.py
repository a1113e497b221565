"""The UCX backend of the data plane: one UCX context and worker per process, through ucxx.

ucxx (the maintained successor of ucx-py) provides the context, the worker, its address and endpoints;
the one-sided calls it lacks come from ``_ucx_ffi``. The worker runs ucxx's C++ progress thread in
*blocking* mode: it sleeps on the worker's event fd and costs nothing while idle (the machine may have
two cores). Transfers are posted from any thread (the worker is thread-safe) and the worker is signalled
so the progress thread picks them up; completions run on that thread.

Created lazily, inside the process that uses it (procs are forked from a template that must never hold
a UCX context), and only when ``ucxx`` is installed: ``pip install 'jupyter_mesh[ucx]'``.

Security: UCX's tcp transport emulates remote memory access in software and does not check keys on the
target, so a UCX port must not be reachable by strangers. Unless ``UCX_NET_DEVICES`` says otherwise,
UCX uses only the interface this process's control plane is bound to (``follow_bind``): loopback for a
one-host session, the interface of its IP on a multi-host one.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib.util
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import MeshError
from . import ucx_ffi as _ucx_ffi

__all__ = ["UcxDesc", "UcxNode", "available", "follow_bind", "node"]

_bind: str | None = None  # this process's control-plane bind (``follow_bind``)

_FAILURE_HINT = "the owner may have died or be unreachable over UCX"


def available() -> bool:
    """Is ucxx installed here (without importing it)?"""
    try:
        return importlib.util.find_spec("ucxx") is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class UcxDesc:
    """What a remote process needs to reach a registered region: travels in signed messages only."""

    worker: bytes  # the owner's UCX worker address
    rkey: bytes  # packed remote key of the region
    address: int  # the region's address in the owner
    memory_type: int  # _ucx_ffi.MEMORY_TYPE_*


def _configure_env() -> dict[str, str]:
    """UCX settings that must be in place before the context exists (set only if the user did not)."""
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    os.environ.setdefault("UCXPY_PROGRESS_MODE", "blocking")
    config: dict[str, str] = {}
    bind = _bind or os.environ.get("JUPYTER_MESH_BIND", "tcp://127.0.0.1")
    if "UCX_NET_DEVICES" not in os.environ:
        config["NET_DEVICES"] = _device_of(bind)
    # tcp moves one-sided get/put as active-message fragments: 8 KiB by default, which halves the
    # bandwidth of a 64 MiB put here; 256 KiB fragments reach UCX's tcp ceiling (W7)
    for var in ("TCP_TX_SEG_SIZE", "TCP_RX_SEG_SIZE"):
        if "UCX_" + var not in os.environ:
            config[var] = "256k"
    return config


def follow_bind(bind: str) -> None:
    """Use the interface of ``bind`` (the process's control-plane bind) for UCX, from its first use on."""
    global _bind
    _bind = bind


def _device_of(bind: str) -> str:
    """The network interface UCX may use: the one holding the bind's IP; loopback for anything local."""
    host = bind[len("tcp://") :].rsplit(":", 1)[0].strip("[]") if bind.startswith("tcp://") else ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "lo"
    if ip.is_loopback or ip.version != 4:
        return "lo"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's IPv4 address
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == str(ip):
                return name
    return "lo"


class UcxNode:
    """This process's UCX context, worker, endpoints and remote keys."""

    def __init__(self) -> None:
        config = _configure_env()
        try:
            import ucxx._lib.libucxx as ucx_lib
        except ImportError as e:
            raise MeshError(
                f"the UCX data plane needs ucxx ({e}); install it with pip install 'jupyter_mesh[ucx]', "
                "or choose another backend with JUPYTER_MESH_RDMA_BACKEND=shm|zmq"
            ) from None
        self._u = ucx_lib
        f = ucx_lib.Feature
        self.pid = os.getpid()
        self.context = ucx_lib.UCXContext(config, (f.TAG, f.WAKEUP, f.AM, f.RMA))
        self.worker = ucx_lib.UCXWorker(self.context)
        self.worker.init_blocking_progress_mode()
        self.worker.start_progress_thread(False, -1)  # blocking: sleeps on the worker's event fd
        self.lib = _ucx_ffi.load()
        self.address = self.worker.address.tobytes()
        self.cuda = bool(getattr(self.context, "cuda_support", False))
        self._eps: dict[bytes, Any] = {}
        self._rkeys: dict[tuple[bytes, bytes], int] = {}
        self._memhs: set[int] = set()
        self._dead: list[tuple[Any, list[int]]] = []
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)

    # -- owner side ---------------------------------------------------------------------------------
    def register(self, address: int, nbytes: int, cuda: bool) -> tuple[int, UcxDesc]:
        mt = _ucx_ffi.MEMORY_TYPE_CUDA if cuda else _ucx_ffi.MEMORY_TYPE_HOST
        memh = self.lib.mem_map(self.context.handle, address, max(nbytes, 1), mt)
        try:
            rkey = self.lib.rkey_pack(self.context.handle, memh)
        except BaseException:
            self.lib.mem_unmap(self.context.handle, memh)
            raise
        with self._lock:
            self._memhs.add(memh)
        return memh, UcxDesc(self.address, rkey, address, mt)

    def unregister(self, memh: int) -> None:
        with self._lock:
            if self._closed or memh not in self._memhs:
                return
            self._memhs.discard(memh)
        self.lib.mem_unmap(self.context.handle, memh)

    # -- reader side --------------------------------------------------------------------------------
    def _endpoint(self, worker: bytes) -> Any:
        with self._lock:
            ep = self._eps.get(worker)
            if ep is not None and not ep.alive:
                self._evict_locked(worker, destroy=False)
                ep = None
            if ep is None:
                addr = self._u.UCXAddress.create_from_buffer(worker)
                ep = self._u.UCXEndpoint.create_from_worker_address(self.worker, addr, True)
                self._eps[worker] = ep
            return ep

    def _rkey(self, ep: Any, desc: UcxDesc) -> int:
        key = (desc.worker, desc.rkey)
        with self._lock:
            rk = self._rkeys.get(key)
            if rk is None:
                rk = self._rkeys[key] = self.lib.rkey_unpack(ep.handle, desc.rkey)
            return rk

    def _evict_locked(self, worker: bytes, destroy: bool = True) -> None:
        """Forget the endpoint to ``worker`` and its remote keys.

        A failed endpoint is *not* destroyed here: UCX may still be tearing it down (we may even be in
        one of its callbacks, on the progress thread), and destroying keys or endpoints then crashes.
        They are kept, unused, until the process exits: a few hundred bytes per dead peer.
        """
        keys = [k for k in self._rkeys if k[0] == worker]
        ep = self._eps.pop(worker, None)
        if destroy:
            for key in keys:
                self.lib.rkey_destroy(self._rkeys.pop(key))
        else:
            self._dead.append((ep, [self._rkeys.pop(k) for k in keys]))

    def forget(self, desc: UcxDesc) -> None:
        """The region was dropped: release its remote key here."""
        with self._lock:
            rk = self._rkeys.pop((desc.worker, desc.rkey), None)
            if rk is not None:
                self.lib.rkey_destroy(rk)

    def transfer(
        self,
        op: str,
        desc: UcxDesc,
        local: int,
        nbytes: int,
        offset: int,
        local_cuda: bool,
        done: Callable[[BaseException | None], None],
    ) -> None:
        """Post a one-sided ``get`` (remote -> local) or ``put`` (+ flush: visible remotely when done)."""
        ep = self._endpoint(desc.worker)
        rkey = self._rkey(ep, desc)
        mt = _ucx_ffi.MEMORY_TYPE_CUDA if local_cuda else _ucx_ffi.MEMORY_TYPE_HOST

        def finish(status: int) -> None:
            if status == _ucx_ffi.UCS_OK:
                done(None)
                return
            with self._lock:
                if self._eps.get(desc.worker) is ep:
                    self._evict_locked(desc.worker, destroy=False)
            done(MeshError(f"UCX {op} failed: {self.lib.status_text(status)}; {_FAILURE_HINT}"))

        remote = desc.address + offset
        if op == "get":
            self.lib.post_rma("get", ep.handle, local, nbytes, remote, rkey, finish, mt)
        else:
            failed: list[int] = []

            def put_done(status: int) -> None:  # the flush below reports; remember a failed put for it
                if status != _ucx_ffi.UCS_OK:
                    failed.append(status)

            self.lib.post_rma("put", ep.handle, local, nbytes, remote, rkey, put_done, mt)
            self.lib.post_flush(ep.handle, lambda s: finish(failed[0] if failed else s))
        self.lib.worker_signal(self.worker.handle)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for worker in list(self._eps):
                self._evict_locked(worker)
            memhs, self._memhs = list(self._memhs), set()
        for memh in memhs:
            self.lib.mem_unmap(self.context.handle, memh)
        try:
            self.worker.stop_progress_thread()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


_node: UcxNode | None = None
_node_lock = threading.Lock()


def node() -> UcxNode:
    """This process's UCX node, created on first use (and again in a forked child: never inherited)."""
    global _node
    with _node_lock:
        if _node is None or _node.pid != os.getpid():
            _node = UcxNode()
        return _node


def existing() -> UcxNode | None:
    n = _node
    return n if n is not None and n.pid == os.getpid() else None
