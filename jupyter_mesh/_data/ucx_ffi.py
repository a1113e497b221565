"""ctypes bindings for the few libucp calls that ucxx's Python API does not expose: one-sided RMA.

ucxx gives us the context, the worker, endpoints and worker addresses (their ``handle`` properties
are the raw ``ucp_*_h`` pointers). What ``RDMABuffer`` also needs is memory registration, remote keys
and get/put/flush, which live only in libucp's C API (``ucp/api/ucp.h``, UCX >= 1.14). This module
binds exactly those, against the same ``libucp.so`` that ucxx loaded, and nothing else: no policy,
no threads, no torch. Struct layouts follow ``ucp.h``; only the fields we set are named in the masks.

Completion: an operation that does not complete at once calls back on whichever thread progresses
the worker (ucxx's progress thread). ``post_*`` take a Python callable ``done(status: int)`` that runs
there, exactly once, whether the operation finished immediately or later.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Callable

__all__ = ["UCS_OK", "UcpError", "UcpLib", "load"]

UCS_OK = 0
UCS_INPROGRESS = 1
_UCS_ERR_LAST = -100

# ucp_mem_map_params_t.field_mask
_MEM_MAP_ADDRESS = 1 << 0
_MEM_MAP_LENGTH = 1 << 1
_MEM_MAP_MEMORY_TYPE = 1 << 4
# ucp_request_param_t.op_attr_mask
_OP_CALLBACK = 1 << 1
_OP_USER_DATA = 1 << 2
_OP_MEMORY_TYPE = 1 << 6
# ucs_memory_type_t
MEMORY_TYPE_HOST = 0
MEMORY_TYPE_CUDA = 1


class UcpError(RuntimeError):
    """A libucp call failed; ``status`` is the ``ucs_status_t`` code."""

    def __init__(self, what: str, status: int, text: str):
        self.status = status
        super().__init__(f"{what} failed: {text} (ucs_status {status})")


class _MemMapParams(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("address", ctypes.c_void_p),
        ("length", ctypes.c_size_t),
        ("flags", ctypes.c_uint),
        ("prot", ctypes.c_uint),
        ("memory_type", ctypes.c_int),
        ("exported_memh_buffer", ctypes.c_void_p),
    ]


_SendCallback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


class _RequestParam(ctypes.Structure):
    _fields_ = [
        ("op_attr_mask", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("request", ctypes.c_void_p),
        ("cb", _SendCallback),  # a union of function pointers: all the same size
        ("datatype", ctypes.c_uint64),
        ("user_data", ctypes.c_void_p),
        ("reply_buffer", ctypes.c_void_p),
        ("memory_type", ctypes.c_int),
        ("recv_info", ctypes.c_void_p),
        ("memh", ctypes.c_void_p),
    ]


class UcpLib:
    """The bound functions plus the completion table that maps ``user_data`` to Python callables."""

    def __init__(self, ucp: ctypes.CDLL, ucs: ctypes.CDLL):
        self._ucp, self._ucs = ucp, ucs
        vp, sz, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
        pvp = ctypes.POINTER(ctypes.c_void_p)
        self._sig(ucs.ucs_status_string, ctypes.c_char_p, [ctypes.c_int])
        self._sig(ucp.ucp_mem_map, ctypes.c_int, [vp, ctypes.POINTER(_MemMapParams), pvp])
        self._sig(ucp.ucp_mem_unmap, ctypes.c_int, [vp, vp])
        self._sig(ucp.ucp_rkey_pack, ctypes.c_int, [vp, vp, pvp, ctypes.POINTER(sz)])
        self._sig(ucp.ucp_rkey_buffer_release, None, [vp])
        self._sig(ucp.ucp_ep_rkey_unpack, ctypes.c_int, [vp, vp, pvp])
        self._sig(ucp.ucp_rkey_destroy, None, [vp])
        rp = ctypes.POINTER(_RequestParam)
        self._sig(ucp.ucp_get_nbx, vp, [vp, vp, sz, u64, vp, rp])
        self._sig(ucp.ucp_put_nbx, vp, [vp, vp, sz, u64, vp, rp])
        self._sig(ucp.ucp_ep_flush_nbx, vp, [vp, rp])
        self._sig(ucp.ucp_request_free, None, [vp])
        self._sig(ucp.ucp_worker_signal, ctypes.c_int, [vp])
        self._pending: dict[int, Callable[[int], None]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._cb = _SendCallback(self._on_complete)  # kept alive as long as the library object

    @staticmethod
    def _sig(fn: ctypes._CFuncPtr, restype: object, argtypes: list[object]) -> None:  # type: ignore[name-defined]
        fn.restype = restype
        fn.argtypes = argtypes

    def status_text(self, status: int) -> str:
        raw = self._ucs.ucs_status_string(status)
        return raw.decode() if raw else f"status {status}"

    def _check(self, what: str, status: int) -> None:
        if status != UCS_OK:
            raise UcpError(what, status, self.status_text(status))

    # -- memory registration and remote keys ----------------------------------------------------------
    def mem_map(self, context: int, address: int, length: int, memory_type: int = MEMORY_TYPE_HOST) -> int:
        p = _MemMapParams()
        p.field_mask = _MEM_MAP_ADDRESS | _MEM_MAP_LENGTH | _MEM_MAP_MEMORY_TYPE
        p.address, p.length, p.memory_type = address, length, memory_type
        memh = ctypes.c_void_p()
        self._check("ucp_mem_map", self._ucp.ucp_mem_map(context, ctypes.byref(p), ctypes.byref(memh)))
        return memh.value or 0

    def mem_unmap(self, context: int, memh: int) -> None:
        self._check("ucp_mem_unmap", self._ucp.ucp_mem_unmap(context, memh))

    def rkey_pack(self, context: int, memh: int) -> bytes:
        buf, size = ctypes.c_void_p(), ctypes.c_size_t()
        self._check("ucp_rkey_pack", self._ucp.ucp_rkey_pack(context, memh, ctypes.byref(buf), ctypes.byref(size)))
        try:
            return ctypes.string_at(buf.value or 0, size.value)
        finally:
            self._ucp.ucp_rkey_buffer_release(buf)

    def rkey_unpack(self, ep: int, packed: bytes) -> int:
        rkey = ctypes.c_void_p()
        self._check("ucp_ep_rkey_unpack", self._ucp.ucp_ep_rkey_unpack(ep, packed, ctypes.byref(rkey)))
        return rkey.value or 0

    def rkey_destroy(self, rkey: int) -> None:
        self._ucp.ucp_rkey_destroy(rkey)

    def worker_signal(self, worker: int) -> None:
        self._ucp.ucp_worker_signal(worker)

    # -- operations -------------------------------------------------------------------------------------
    def _param(self, done: Callable[[int], None], memory_type: int | None) -> tuple[_RequestParam, int]:
        op_id = next(self._ids)
        with self._lock:
            self._pending[op_id] = done
        p = _RequestParam()
        p.op_attr_mask = _OP_CALLBACK | _OP_USER_DATA
        p.cb = self._cb
        p.user_data = op_id
        if memory_type is not None:
            p.op_attr_mask |= _OP_MEMORY_TYPE
            p.memory_type = memory_type
        return p, op_id

    def _started(self, what: str, ptr: int | None, op_id: int) -> None:
        """Interpret a ``ucs_status_ptr_t``: done now (OK or error) or pending (callback later)."""
        raw = ptr or 0
        if raw and raw < (1 << 63):  # a request pointer: the callback will run
            return
        status = raw - (1 << 64) if raw >= (1 << 63) else raw
        with self._lock:
            done = self._pending.pop(op_id, None)
        if status != UCS_OK and status >= _UCS_ERR_LAST and done is not None:
            done(status)
        elif done is not None:
            done(UCS_OK)

    def _on_complete(self, request: int | None, status: int, user_data: int | None) -> None:
        with self._lock:
            done = self._pending.pop(user_data or 0, None)
        if request:
            self._ucp.ucp_request_free(request)
        if done is not None:
            try:
                done(status)
            except Exception:  # noqa: BLE001 - never let an exception unwind into C
                import traceback

                traceback.print_exc()

    def post_rma(
        self,
        op: str,
        ep: int,
        local: int,
        n: int,
        remote: int,
        rkey: int,
        done: Callable[[int], None],
        memory_type: int | None = None,
    ) -> None:
        """One-sided ``get`` (remote -> local) or ``put`` (local -> remote) of ``n`` bytes."""
        name = {"get": "ucp_get_nbx", "put": "ucp_put_nbx"}[op]
        p, op_id = self._param(done, memory_type)
        self._started(name, getattr(self._ucp, name)(ep, local, n, remote, rkey, ctypes.byref(p)), op_id)

    def post_flush(self, ep: int, done: Callable[[int], None]) -> None:
        """Remote completion of every put posted on ``ep`` so far."""
        p, op_id = self._param(done, None)
        self._started("ucp_ep_flush_nbx", self._ucp.ucp_ep_flush_nbx(ep, ctypes.byref(p)), op_id)


_lib: UcpLib | None = None
_lib_lock = threading.Lock()


def load() -> UcpLib:
    """Bind to the libucp that ucxx uses (``import ucxx`` first: it loads the wheel's libraries)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            import libucx

            libs = libucx.load_library()
            ucs, ucp = libs[0], libs[3]
            if ucp is None or ucs is None:  # a system UCX (RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY)
                ucp = ctypes.CDLL("libucp.so", os.RTLD_NOLOAD | ctypes.RTLD_LOCAL)
                ucs = ctypes.CDLL("libucs.so", os.RTLD_NOLOAD | ctypes.RTLD_LOCAL)
            _lib = UcpLib(ucp, ucs)
        return _lib
