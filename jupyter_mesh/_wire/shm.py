"""Shared memory between processes of one host: message segments and shared regions.

Two uses, both one copy:

* **Message segments.** A large out-of-band buffer of a message to a peer on the same host is written
  into a fresh ``/dev/shm`` segment (one copy, by ``pwrite``: no page faults in the sender) and only
  the segment's name travels, inside the signed header. The receiver maps it, unlinks the name at once
  and hands the mapping to the unpickler: the tensor it builds lives in that mapping, no second copy.
  Names carry a per-session prefix so the controller and the agents can sweep what a dead receiver
  never claimed (:func:`sweep`). In steady state a sender reuses its own segments instead
  (``shm_pool``): no page is allocated, populated or freed per message; these one-shot named
  segments are the fallback when its pool budget is spent.
* **Shared regions** for ``RDMABuffer``: a CPU tensor's storage is moved into fd-backed shared memory
  once, in place (what ``Tensor.share_memory_()`` does), and a reader on the same host maps that file
  through ``/proc/<owner pid>/fd/<fd>`` and copies straight from or into it. The file has no name, so
  nothing can leak: it goes away with the last process that maps it.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import mmap
import os
import re
import secrets
import stat
import threading
from collections import OrderedDict
from typing import Any

from . import shm_pool

__all__ = [
    "SEGMENT_MIN",
    "RegionMap",
    "leftovers",
    "open_segment",
    "release",
    "session_prefix",
    "stash",
    "sweep",
    "unstash",
    "write_segment",
]

SHM_DIR = "/dev/shm"
# Buffers at least this large go through a segment when the peer is on this host; below it the
# socket is as fast and a segment's create/map/unlink costs more than it saves.
SEGMENT_MIN = 1 << 20
_NAME = re.compile(r"^jm[0-9a-f]{10}-[0-9a-f]+-[0-9a-f]+$")
_counter = itertools.count()


def session_prefix(key: bytes) -> str:
    """``jm<10 hex>-``: the same in every process of a session (they share the key), unguessable."""
    return "jm" + hashlib.sha256(b"jupyter_mesh shm" + key).hexdigest()[:10] + "-"


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


# -- message segments ----------------------------------------------------------------------------------
collisions = 0  # names that already existed when a segment was created (someone took them first)


def _create(prefix: str) -> tuple[str, int]:
    """A new segment file, ours alone: O_EXCL (never someone else's file of that name), mode 0600,
    and a name nobody can predict (64 random bits after the session's secret prefix)."""
    global collisions
    for _ in range(8):
        name = f"{prefix}{os.getpid():x}-{next(_counter):x}{secrets.token_hex(8)}"
        try:
            return name, os.open(f"{SHM_DIR}/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            collisions += 1
    raise FileExistsError(f"{SHM_DIR}: eight fresh segment names were all taken already; is someone squatting?")


def write_segment(prefix: str, data: Any) -> tuple[str, int]:
    """Copy ``data`` (a contiguous buffer) into a new segment; returns (name, nbytes)."""
    mv = memoryview(data).cast("B")
    n = mv.nbytes
    name, fd = _create(prefix)
    try:
        os.ftruncate(fd, n)
        done = 0
        while done < n:  # pwrite copies straight into the page cache: no faults on our side
            done += os.pwrite(fd, mv[done:], done)
    except BaseException:
        os.unlink(f"{SHM_DIR}/{name}")
        raise
    finally:
        os.close(fd)
    return name, n


def open_segment(prefix: str, name: str, nbytes: int) -> mmap.mmap:
    """Map a segment written by :func:`write_segment` and unlink its name; the mapping is the buffer."""
    if not (isinstance(name, str) and name.startswith(prefix) and _NAME.match(name)):
        raise ValueError(f"not a segment of this session: {name!r}")
    path = f"{SHM_DIR}/{name}"
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        os.unlink(path)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
            # not one our session wrote: another user made that name first; never map their bytes
            raise ValueError(f"segment {name} belongs to uid {st.st_uid} with mode {st.st_mode & 0o777:o}: refused")
        if st.st_size != nbytes:
            raise ValueError(f"segment {name} has {st.st_size} bytes, the header says {nbytes}")
        return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)


def stash(prefix: str, buffers: list[Any]) -> tuple[list[list[Any]], list[Any]]:
    """Move the large buffers of a message into segments: (header entries, buffers still to send).
    A pooled segment (``shm_pool``) when one is free, else a one-shot named one."""
    entries: list[list[Any]] = []
    rest: list[Any] = []
    pool = None
    try:
        for i, b in enumerate(buffers):
            mv = memoryview(b)
            if mv.nbytes >= SEGMENT_MIN and mv.contiguous:
                pool = pool or shm_pool.sender_pool()
                pooled = pool.put(mv) if pool is not None else None
                if pooled is not None:
                    entries.append([i, *pooled])
                    continue
                name, n = write_segment(prefix, mv)
                entries.append([i, name, n])
            else:
                rest.append(b)
    except BaseException:  # (/dev/shm full): the message is not sent; what it already holds is freed
        release(entries)
        raise
    return entries, rest


def release(entries: list[list[Any]]) -> None:
    """Free the segments :func:`stash` took for a message that was never sent (nobody will open them)."""
    pool = None
    for e in entries:
        if len(e) == 3:
            try:
                os.unlink(f"{SHM_DIR}/{e[1]}")
            except OSError:
                pass
        elif len(e) == 7:
            pool = pool or shm_pool.sender_pool()
            if pool is not None:
                pool.give_back(e[1:])


def unstash(prefix: str, entries: list[list[Any]], frames: list[Any]) -> list[Any]:
    """The inverse of :func:`stash` on the receiving side: every buffer back in its place."""
    out: list[Any] = []
    it = iter(frames)
    slots = {int(e[0]): e[1:] for e in entries}
    for pos in range(len(frames) + len(slots)):
        if pos in slots:
            slot = slots[pos]
            if len(slot) == 2:
                out.append(open_segment(prefix, slot[0], int(slot[1])))
            elif len(slot) == 6 and all(type(x) is int for x in slot):
                out.append(shm_pool.receiver_maps().view(*slot))
            else:
                raise ValueError(f"a bad segment entry {slot!r}")
        else:
            out.append(next(it))
    return out


def leftovers(prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except OSError:
        return []


def sweep(prefix: str) -> int:
    """Unlink every segment of the session (at shutdown: nobody is left to claim them)."""
    removed = 0
    for name in leftovers(prefix):
        try:
            os.unlink(f"{SHM_DIR}/{name}")
            removed += 1
        except OSError:
            pass
    return removed


# -- shared regions (RDMABuffer on one host) ----------------------------------------------------------
def share_tensor_storage(t: Any) -> tuple[int, int, int, int] | None:
    """Move ``t``'s storage into fd-backed shared memory, in place; (fd, inode, storage bytes, offset).

    None when the storage cannot be shared (not on the CPU, not resizable, a file mapping...): the
    buffer is then served by another backend.
    """
    try:
        storage = t.untyped_storage()
        fd, size = storage._share_fd_cpu_()
        return int(fd), os.fstat(fd).st_ino, int(size), t.storage_offset() * t.element_size()
    except Exception:  # noqa: BLE001 - any failure means "not shareable", never an error
        return None


class RegionMap:
    """The reader's cache of mappings of other processes' shared regions, keyed by (pid, inode).

    ``get`` returns the mapping with its address; the caller holds the mapping while it copies, so an
    eviction by another thread never unmaps memory under a copy.
    """

    def __init__(self, capacity: int = 32):
        self._maps: OrderedDict[tuple[int, int], tuple[mmap.mmap, Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity

    def get(self, pid: int, fd: int, inode: int, size: int) -> tuple[Any, int]:
        key = (pid, inode)
        with self._lock:
            hit = self._maps.get(key)
            if hit is not None and len(hit[0]) >= size:  # a larger size than mapped: fstat checks it below
                self._maps.move_to_end(key)
                return hit[1], hit[2]
        f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        try:
            st = os.fstat(f)
            if st.st_ino != inode or st.st_size < size:
                raise FileNotFoundError(f"the region's file (fd {fd} of pid {pid}) was released")
            m = mmap.mmap(f, size, flags=mmap.MAP_SHARED)
        finally:
            os.close(f)
        view = (ctypes.c_char * size).from_buffer(m)  # an export: keeps the mapping while referenced
        entry = (m, view, ctypes.addressof(view))
        with self._lock:
            self._maps[key] = entry
            while len(self._maps) > self._capacity:
                self._close(self._maps.popitem(last=False)[1][0])
        return view, entry[2]

    def forget(self, pid: int, inode: int) -> None:
        with self._lock:
            entry = self._maps.pop((pid, inode), None)
        if entry is not None:
            self._close(entry[0])

    @staticmethod
    def _close(m: mmap.mmap) -> None:
        try:
            m.close()
        except BufferError:  # still exported (a copy in flight): unmapped when the last user lets go
            pass
