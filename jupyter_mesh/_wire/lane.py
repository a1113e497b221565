"""The same-host lane: a small signed message goes from the sending thread's system call straight to the
reading thread's socket, with no ZeroMQ I/O thread on either side.

ZeroMQ moves every message through an I/O thread in the sender and one in the receiver: each way a
message wakes three threads, and on this 2-core VM a cross-core wake-up costs tens of µs (bare pyzmq over
``ipc://``: 100-170 µs a round trip; the same round trip over unix datagrams: ~25 µs;
``benchmarks/NOTES.md``). So an inbox may also listen on a unix **datagram** socket next to its
``ipc://`` socket, in the same private 0700 directory (only this user can reach it, as the ipc socket).
Its address then ends with :data:`MARK`, which tells senders the lane exists.

What travels is exactly what ZeroMQ would carry, the signed frames ``[signature, header, payload]``,
decoded, authenticated and replay-checked the same way (``Transport.decode``). The datagram is
``<u16 n><u32 len>*n`` followed by the frames, written with one ``sendmsg`` (no copy on our side).
A message goes over the lane only when it has no out-of-band buffers, fits :data:`MAX_BYTES`, and the
socket takes it at once; otherwise (the receiver's queue full, the receiver gone, a larger message) it
goes through ZeroMQ as before, so nothing ever blocks on a busy peer. The two ways can reorder one
sender's messages: lanes are only on inboxes whose readers do not depend on arrival order (actor inboxes
order calls by their per-link sequence numbers; reply boxes match one reply to one call). What waits on
both ways when the reader looks is merged by the sender's counter (``lane_merge``), or the replay
window would drop an older message that a newer one overtook by more than ``replay.WINDOW``.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import Any

__all__ = ["MARK", "MAX_BYTES", "Lane", "LaneSender", "lane_path", "usable"]

MARK = "+l"  # an ipc:// inbox address ending with this has a lane at ``lane_path(address)``
MAX_BYTES = 60 * 1024  # bigger messages go through ZeroMQ (the default socket send buffer is ~208 KiB)
_SUFFIX = ".dg"
_MAX_PATH = 107  # sun_path holds 108 bytes, the last one a NUL
_U16 = struct.Struct("<H")
_LENS = [struct.Struct("<H" + "I" * n) for n in range(8)]
_LENS3 = _LENS[3]


def lane_path(address: str) -> str | None:
    """The datagram socket of an inbox address, or None if it has no lane."""
    if not address.endswith(MARK) or not address.startswith("ipc://"):
        return None
    return address[len("ipc://") :] + _SUFFIX


def usable(address: str) -> bool:
    """Can an inbox at ``address`` (an ``ipc://`` path ending with :data:`MARK`) have a lane?"""
    p = lane_path(address)
    return p is not None and len(p.encode()) <= _MAX_PATH


class Lane:
    """The receiving end, bound next to an ``ipc://`` inbox; read by that inbox's one reader thread."""

    def __init__(self, address: str):
        path = lane_path(address)
        assert path is not None
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            self.sock.bind(path)  # in the inbox's private directory: fails if anything is there already
        except OSError:
            self.sock.close()
            raise
        self.fd = self.sock.fileno()
        self._buf = bytearray(MAX_BYTES + 1)
        self._view = memoryview(self._buf)
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)
        self.dropped = 0  # datagrams that were not frames of ours (truncated, malformed)
        # one message read from each way, waiting while an older one of its sender goes first
        # (``lane_merge.take``)
        self.held_zmq: list[Any] | None = None
        self.held_dgram: list[Any] | None = None
        self.closed = False

    def pending(self) -> bool:
        """Is a datagram waiting? (never blocks)"""
        return bool(self._poll.poll(0))

    def holds(self) -> bool:
        """Did ``lane_merge.take`` read a message that it has not returned yet?"""
        return self.held_zmq is not None or self.held_dgram is not None

    def recv_frames(self) -> list[bytes] | None:
        """The frames of the next datagram, or None if none is waiting (or it was not well formed)."""
        try:
            n = self.sock.recv_into(self._buf, 0, socket.MSG_TRUNC)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return None  # closed under us (the process is stopping)
        if n > MAX_BYTES or n < 2:
            self.dropped += 1
            return None
        view = self._view
        (count,) = _U16.unpack_from(view, 0)
        if count == 3:  # signature, header, payload: every message that takes the lane from us
            _, a, b, c = _LENS3.unpack_from(view, 0)
            if 14 + a + b + c != n:
                self.dropped += 1
                return None
            a += 14
            b += a
            return [bytes(view[14:a]), bytes(view[a:b]), bytes(view[b:n])]
        if not 1 <= count < len(_LENS):
            self.dropped += 1
            return None
        lens = _LENS[count].unpack_from(view, 0)[1:]
        at = 2 + 4 * count
        if at + sum(lens) != n:
            self.dropped += 1
            return None
        frames = []
        for ln in lens:
            frames.append(bytes(view[at : at + ln]))
            at += ln
        return frames

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class _Mine:
    """A sending thread's socket, closed when the thread ends (its locals go) or the sender closes."""

    __slots__ = ("__weakref__", "sock")

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def __del__(self) -> None:
        self.sock.close()


class LaneSender:
    """The sending end: one unbound datagram socket per sending thread, for every lane of the session."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: weakref.WeakSet[_Mine] = weakref.WeakSet()  # not a list: a thread's socket ends with it
        self._lock = threading.Lock()
        self._closed = False
        self._paths: dict[str, str] = {}  # address -> its lane's path (``lane_path``), as they are used

    def _sock(self) -> socket.socket | None:
        mine: _Mine | None = getattr(self._local, "mine", None)
        if mine is None:
            with self._lock:
                if self._closed:
                    return None
                mine = _Mine(
                    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
                )
                self._all.add(mine)
            self._local.mine = mine
        return mine.sock

    def send(self, address: str, frames: Sequence[Any]) -> bool:
        """Send ``frames`` over ``address``'s lane if it has one and takes them now; False: use ZeroMQ."""
        if len(frames) >= len(_LENS):
            return False
        path = self._paths.get(address)
        if path is None:
            path = lane_path(address)
            if path is None:
                return False
            if len(self._paths) >= 4096:  # addresses of gone peers: forgotten now and then
                self._paths.clear()
            self._paths[address] = path
        lens = [f.nbytes if type(f) is memoryview else len(f) for f in frames]
        if sum(lens) > MAX_BYTES - 2 - 4 * len(frames):
            return False
        s = self._sock()
        if s is None:
            return False
        try:
            s.sendmsg([_LENS[len(frames)].pack(len(frames), *lens), *frames], (), 0, path)
        except OSError:
            # EAGAIN: the receiver's queue is full (ZeroMQ queues it without blocking us);
            # ECONNREFUSED/ENOENT: the receiver is gone (ZeroMQ's way reports that as before)
            return False
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            mine = list(self._all)
        for m in mine:
            m.sock.close()
