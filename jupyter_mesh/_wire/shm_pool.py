"""Reused shared-memory segments for large message buffers between processes of one host.

A fresh segment per message costs far more than the copy into it: the kernel allocates and frees
every page (64 MiB: 16k pages), and the receiver maps and populates them again. Here a sender keeps
its segments (anonymous ``memfd`` files: no name, nothing to leak in ``/dev/shm``) and a receiver
keeps its mappings of them, so a message in steady state is one ``pwrite`` into pages that already
exist and mappings that are already populated.

A segment is reused only once its receiver let go of it. Its first page is a control word: the
sender writes a new generation number there before it writes the data; the receiver hands the
unpickler a view whose finalizer writes 0 back when the last object over it (a tensor, an array, a
memoryview) is freed. The sender takes only segments whose word is 0, so a buffer still visible to
a previous receiver is never written. A receiver that dies holding one leaves it busy: it stays out
of use, and the pool budget (``JUPYTER_MESH_SHM_POOL``, MiB per sending process, 0 turns pooling
off) makes the sender fall back to one-shot named segments (``shm.write_segment``).

The receiver opens a segment through ``/proc/<sender pid>/fd/<fd>`` (same user only) and checks its
inode, both from the signed header, as shared regions (``RegionMap``) do.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import stat
import struct
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any

__all__ = ["CTL", "ReceiverMaps", "SenderPool", "receiver_maps", "sender_pool"]

CTL = mmap.PAGESIZE  # the control page before the data (page-aligned data, as mmap wants)
_FREE = 0
_RETIRED = (1 << 64) - 1  # the sender closed it: receivers drop their mapping
_WORD = struct.Struct("<Q")
_MiB = 1 << 20


def _budget() -> int:
    try:
        return max(0, int(float(os.environ.get("JUPYTER_MESH_SHM_POOL", "512")) * _MiB))
    except ValueError:
        return 512 * _MiB


class _Segment:
    __slots__ = ("cap", "ctl", "fd", "inode", "last")

    def __init__(self, cap: int):
        self.fd = os.memfd_create("jupyter-mesh-seg", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, CTL + cap)
            self.ctl = mmap.mmap(self.fd, CTL, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.inode = os.fstat(self.fd).st_ino
        self.cap = cap
        self.last = time.monotonic()

    def word(self) -> int:
        return int(_WORD.unpack_from(self.ctl, 0)[0])

    def close(self) -> None:
        _WORD.pack_into(self.ctl, 0, _RETIRED)
        self.ctl.close()
        os.close(self.fd)


class SenderPool:
    """This process's segments, reused once their receiver released them (see the module doc)."""

    IDLE_S = 30.0  # a free segment unused this long is closed on the next put

    def __init__(self, budget: int | None = None):
        self.budget = _budget() if budget is None else budget
        self.pid = os.getpid()
        self._segs: list[_Segment] = []
        self._lock = threading.Lock()
        self._gen = itertools.count(1)
        self.reused = self.created = self.declined = 0  # counters, for tests and benchmarks

    def put(self, data: Any) -> list[int] | None:
        """Copy ``data`` into a free segment; its header entry ``[pid, fd, inode, cap, n, gen]``, or
        None when the budget is spent on segments still held (the caller sends a one-shot segment)."""
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if n == 0 or n > self.budget:
            return None
        with self._lock:
            seg = self._take(n)
            if seg is None:
                return None
            gen = next(self._gen)
            _WORD.pack_into(seg.ctl, 0, gen)  # busy from here: no other put takes it
            seg.last = time.monotonic()
        try:
            done = 0
            while done < n:  # into pages that exist already (after the first use): no allocation
                done += os.pwrite(seg.fd, mv[done:], CTL + done)
        except BaseException:
            _WORD.pack_into(seg.ctl, 0, _FREE)
            raise
        return [self.pid, seg.fd, seg.inode, seg.cap, n, gen]

    def give_back(self, entry: list[int]) -> None:
        """Free the segment of ``entry`` (from :meth:`put`) whose message was never sent."""
        _, fd, inode, _, _, gen = entry
        with self._lock:
            for seg in self._segs:
                if seg.fd == fd and seg.inode == inode and seg.word() == gen:
                    _WORD.pack_into(seg.ctl, 0, _FREE)

    def _take(self, n: int) -> _Segment | None:
        now = time.monotonic()
        best: _Segment | None = None
        for s in self._segs:
            if n <= s.cap <= 2 * n and s.word() == _FREE and (best is None or s.cap < best.cap):
                best = s
        if best is not None:
            self.reused += 1
            return best
        cap = -(-n // CTL) * CTL
        for s in sorted(self._segs, key=lambda s: s.last):  # make room: idle ones, then the oldest free
            over = sum(x.cap for x in self._segs) + cap > self.budget
            if (over or now - s.last > self.IDLE_S) and s.word() == _FREE:
                self._segs.remove(s)
                s.close()
        if sum(x.cap for x in self._segs) + cap > self.budget:
            self.declined += 1
            return None
        seg = _Segment(cap)
        self._segs.append(seg)
        self.created += 1
        return seg

    def close(self) -> None:
        with self._lock:
            for s in self._segs:
                s.close()
            self._segs.clear()


def _release(m: mmap.mmap, gen: int) -> None:
    """The last object over a received buffer is gone: the sender may write that segment again."""
    try:
        if not m.closed and _WORD.unpack_from(m, 0)[0] == gen:
            _WORD.pack_into(m, 0, _FREE)
    except (ValueError, OSError):
        pass


class ReceiverMaps:
    """This process's mappings of its peers' pooled segments, keyed by (sender pid, inode)."""

    def __init__(self, capacity: int = 8, max_bytes: int = 1024 * _MiB):
        self._maps: OrderedDict[tuple[int, int], mmap.mmap] = OrderedDict()
        self._lock = threading.Lock()
        self.capacity, self.max_bytes = capacity, max_bytes

    def view(self, pid: int, fd: int, inode: int, cap: int, n: int, gen: int) -> Any:
        """A writable buffer over the ``n`` bytes of that segment's message ``gen``; when the last object
        over it is freed, the segment goes back to its sender."""
        if not (0 < n <= cap < 1 << 40 and pid > 0 and fd >= 0 and gen > 0):
            raise ValueError(f"a bad pooled segment entry {[pid, fd, inode, cap, n, gen]}")
        key = (pid, inode)
        with self._lock:
            self._drop_retired()
            m = self._maps.get(key)
            if m is not None:
                self._maps.move_to_end(key)
        if m is None:
            m = self._open(pid, fd, inode, cap)
            with self._lock:
                self._drop_dead()
                self._maps[key] = m
                self._evict()
        if len(m) < CTL + cap or _WORD.unpack_from(m, 0)[0] != gen:
            raise ValueError(f"segment {pid}/{fd} does not hold message {gen} (stale or replayed)")
        view = (ctypes.c_char * n).from_buffer(m, CTL)
        weakref.finalize(view, _release, m, gen)
        return view

    @staticmethod
    def _open(pid: int, fd: int, inode: int, cap: int) -> mmap.mmap:
        f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        try:
            st = os.fstat(f)
            if st.st_ino != inode or st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
                raise ValueError(f"fd {fd} of pid {pid} is not the segment the header names")
            if st.st_size < CTL + cap:
                raise ValueError(f"segment {pid}/{fd} has {st.st_size} bytes, the header says {CTL + cap}")
            return mmap.mmap(f, CTL + cap, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(f)

    def _drop_retired(self) -> None:
        for key, m in list(self._maps.items()):
            if _WORD.unpack_from(m, 0)[0] == _RETIRED:
                del self._maps[key]
                _close(m)

    def _drop_dead(self) -> None:
        """Mappings of senders that exited (theirs would otherwise stay until evicted)."""
        for key, m in list(self._maps.items()):
            if not os.path.exists(f"/proc/{key[0]}"):
                del self._maps[key]
                _close(m)

    def _evict(self) -> None:
        while len(self._maps) > 1 and (
            len(self._maps) > self.capacity or sum(len(m) for m in self._maps.values()) > self.max_bytes
        ):
            _close(self._maps.popitem(last=False)[1])


def _close(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a received object still lives over it: unmapped when that goes
        pass


_state_lock = threading.Lock()
_sender: SenderPool | None = None
_receiver: ReceiverMaps | None = None


def sender_pool() -> SenderPool | None:
    """This process's pool (a forked child starts its own); None when pooling is off."""
    global _sender
    with _state_lock:
        if _sender is None or _sender.pid != os.getpid():
            _sender = SenderPool()
        return _sender if _sender.budget > 0 else None


def receiver_maps() -> ReceiverMaps:
    global _receiver
    with _state_lock:
        if _receiver is None:
            _receiver = ReceiverMaps()
        return _receiver
