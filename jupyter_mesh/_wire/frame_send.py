"""How one signed message's frames go onto a ZeroMQ socket: each of the caller's buffers copied once.

The caller's buffers are the caller's memory: value semantics say the caller may change them once a
send returns. ZeroMQ could send them from that memory, but the send would then have to wait until
ZeroMQ let go of it, i.e. until the whole message was written out (over CURVE, ~0.3 s for 64 MiB here)
or until its peer was declared dead when it reads nothing (SIGSTOP). A copy costs a memcpy and the send returns at once:
~10 ms for 64 MiB into pages already touched (``_WarmCopies``), ~35 ms into a fresh allocation. Between procs of one host large buffers travel through shared
memory instead (``_shm``) and never get here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import zmq

__all__ = ["owned", "send_frames"]

_SNDMORE = int(zmq.SNDMORE)
WARM_MIN = 1 << 20
"""The caller's buffers from this size on are copied into a reused buffer (``_WarmCopies``); smaller
ones by ZeroMQ (its own allocation: a few page faults at most)."""


class _WarmCopies:
    """Buffers that the caller's large frames are copied into, each reused once ZeroMQ let go of it.

    A fresh allocation of 64 MiB costs ~16k page faults on its first write, which made the copy 3-4
    times a memcpy. At most ``keep`` free buffers stay (the last ones used), and at most ``max_bytes``
    are lent to ZeroMQ at once: past that (a peer that reads nothing holds its messages until it is
    declared dead and its socket closed) a frame is copied by ZeroMQ, as a small one is.

    A send never waits here: it runs under the socket's lock (which the heartbeats and the socket's
    close need) and, for a cast, the calls' lock. A wait for memory there stalled a whole controller
    behind one stopped proc (helper-56)."""

    def __init__(self, keep: int = 2, max_bytes: int = 512 << 20):
        self.keep, self.max_bytes = keep, max_bytes
        self._lock = threading.Lock()
        self._free: list[bytearray] = []
        self._lent: list[tuple[bytearray, zmq.MessageTracker]] = []

    def frame(self, data: Any) -> zmq.Frame:
        src = memoryview(data)
        if not src.c_contiguous:
            return zmq.Frame(src.tobytes(), copy=False)
        src = src.cast("B")
        n = src.nbytes
        buf = self._take(n)
        if buf is None:
            return zmq.Frame(src, copy=True)
        view = memoryview(buf)[:n]
        view[:] = src
        frame = zmq.Frame(view, copy=False, track=True)
        with self._lock:
            self._lent.append((buf, frame.tracker))
        return frame

    def _take(self, n: int) -> bytearray | None:
        """A free buffer for ``n`` bytes, a new one, or None (``max_bytes`` are lent already)."""
        with self._lock:
            self._lent, back = [(b, t) for b, t in self._lent if not t.done], [b for b, t in self._lent if t.done]
            self._free = (self._free + back)[-self.keep :]
            fits = [b for b in self._free if n <= len(b) <= 2 * n]
            if fits:
                buf = min(fits, key=len)
                self._free.remove(buf)
                return buf
            if sum(len(b) for b, _ in self._lent) + n > self.max_bytes:
                return None
        return bytearray(n)


_copies = _WarmCopies()


def send_frames(sock: zmq.Socket[Any], frames: Sequence[Any]) -> None:
    """Send ``frames`` (signature, header, payload, then buffers) as one message. Returns once ZeroMQ
    holds what it needs: the caller may change its buffers then."""
    if len(frames) <= 3:  # frame by frame with a plain int flag: send_multipart's enum arithmetic costs ~2 us
        for f in frames[:-1]:
            sock.send(f, _SNDMORE)
        sock.send(frames[-1])
        return
    if _all_owned(frames):  # a relay's, or ``owned``: refcounted, shareable
        sock.send_multipart(frames, copy=False)
        return
    last = len(frames) - 1
    for i, f in enumerate(frames):
        # bytes are immutable and frames ZeroMQ's own: sent as they are; the caller's buffers copied
        sock.send(_owned(f), 0 if i == last else _SNDMORE, copy=False)


def owned(frames: Sequence[Any]) -> list[Any]:
    """``frames`` with each of the caller's buffers copied once into a frame ZeroMQ owns: for a message
    sent to several peers (a cast to several agents), which then share one copy."""
    return [*frames[:3], *(_owned(f) for f in frames[3:])]


def _owned(f: Any) -> bytes | zmq.Frame:
    if isinstance(f, (bytes, zmq.Frame)):
        return f
    if memoryview(f).nbytes >= WARM_MIN:
        return _copies.frame(f)
    return zmq.Frame(f, copy=True)


def _all_owned(frames: Sequence[Any]) -> bool:
    """Are all buffer frames ``zmq.Frame``s (received off a socket, or ``owned``)? Those can be re-sent as
    they are, to any number of peers, with no copy: ZeroMQ counts their references."""
    return all(isinstance(f, zmq.Frame) for f in frames[3:])
