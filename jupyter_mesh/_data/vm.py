"""Same-host copies straight between two processes' memory: ``process_vm_readv``/``process_vm_writev``.

An ``RDMABuffer`` whose memory cannot move into shared memory (a ``memoryview``, ``bytearray``, numpy
array) is still one copy away from a reader on its host: the kernel copies between the two address
spaces, with no socket and no owner thread involved. Linux lets a process do that to another only
with ptrace access to it: same user, the target dumpable, and under Yama ``ptrace_scope`` 1 (Ubuntu's
default) only to its own descendants. We never widen that (``PR_SET_PTRACER`` would let every process
of the user ptrace the owner): where the kernel says no (``EPERM``), the buffer is served the ordinary
way (zmq) and that owner is not tried again.

The remote address and size never come from the wire: the reader takes them from the owner's liveness
table (``owner``), which only the owner writes, and checks the range against them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading

__all__ = ["Denied", "available", "copy", "denied", "deny"]


class Denied(Exception):
    """The kernel refused cross-process access to that owner (no ptrace permission)."""


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_calls: tuple[object, object] | None = None
_lock = threading.Lock()
_denied: set[tuple[int, int]] = set()  # (pid, start) of owners the kernel refused us


def _load() -> tuple[object, object] | None:
    global _calls
    if _calls is None and sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        fns = []
        for name in ("process_vm_readv", "process_vm_writev"):
            f = getattr(libc, name, None)
            if f is None:
                return None
            f.argtypes = [
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_ulong,
                ctypes.c_void_p,
                ctypes.c_ulong,
                ctypes.c_ulong,
            ]
            f.restype = ctypes.c_ssize_t
            fns.append(f)
        _calls = (fns[0], fns[1])
    return _calls


def available() -> bool:
    """Does this platform have the calls (Linux, glibc >= 2.15)?"""
    return _load() is not None


def denied(owner: tuple[int, int]) -> bool:
    return owner in _denied


def deny(owner: tuple[int, int]) -> None:
    with _lock:
        _denied.add(owner)


def copy(op: str, pid: int, local: int, remote: int, n: int) -> None:
    """Copy ``n`` bytes: ``get`` from ``remote`` in ``pid`` to ``local`` here, ``put`` the other way.

    Raises :class:`Denied` (no permission), ``ProcessLookupError`` (the process is gone) or ``OSError``
    (``EFAULT``: the range is not mapped in ``pid`` any more)."""
    calls = _load()
    if calls is None:
        raise Denied("process_vm_readv is not available on this platform")
    fn = calls[0] if op == "get" else calls[1]
    done = 0
    while done < n:
        here, there = _Iovec(local + done, n - done), _Iovec(remote + done, n - done)
        got = fn(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)  # type: ignore[operator]
        if got > 0:
            done += got
            continue
        err = ctypes.get_errno() if got < 0 else errno.EFAULT
        if err == errno.EINTR:
            continue
        if err in (errno.EPERM, errno.EACCES, errno.ENOSYS):
            raise Denied(os.strerror(err))
        if err == errno.ESRCH:
            raise ProcessLookupError(pid)
        raise OSError(err, os.strerror(err))
