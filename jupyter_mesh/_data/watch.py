"""Bounds for in-flight data-plane transfers: a deadline each, and the owner's death on this host.

One daemon thread per process, started on first use, sleeps in ``select`` on the pidfds of the owners
that transfers wait on (same host and pid namespace only) until the earliest deadline: no polling. When
an owner exits, every transfer waiting on it fails at once with the error its ``died`` factory builds;
when a deadline passes, it fails with ``MeshTimeoutError(phase="transfer")``.
"""

from __future__ import annotations

import heapq
import itertools
import os
import select
import selectors
import threading
import time
from collections.abc import Callable

from ..errors import MeshTimeoutError

__all__ = ["Watch", "owner_alive", "process_start_time", "watch"]


def process_start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: with the pid, identifies one process across pid reuse."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _alive_by_proc(pid: int, start: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] not in ("Z", "X") and int(fields[19]) == start
    except (OSError, ValueError, IndexError):
        return False


_PIDFDS_MAX = 256
_pidfds: dict[tuple[int, int], int] = {}  # owners asked about: a pidfd each, -1 once seen dead
_pidfds_lock = threading.Lock()


def owner_alive(pid: int, start: int) -> bool:
    """Is that process (not a later one with its pid) still running? A zombie is not.

    Same-host transfers ask before and after every copy: reading ``/proc/<pid>/stat`` twice cost most
    of a small read (~2 x 40 µs on a busy VM), so the answer comes from a pidfd opened once per owner
    (readable once the process has exited), checked against the start time when opened."""
    key = (pid, start)
    fd = _pidfds.get(key)
    if fd is None:
        fd = _open_owner_pidfd(key)
    if fd < 0:
        return fd == -2 and _alive_by_proc(pid, start)  # -2: no pidfds here (old kernel)
    if select.select([fd], [], [], 0)[0]:
        with _pidfds_lock:
            if _pidfds.get(key) == fd:
                _pidfds[key] = -1
                os.close(fd)
        return False
    return True


def _open_owner_pidfd(key: tuple[int, int]) -> int:
    pid, start = key
    if not _alive_by_proc(pid, start):
        fd = -1
    else:
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            fd = -2
        if fd >= 0 and not _alive_by_proc(pid, start):  # the pid was reused between the two looks
            os.close(fd)
            fd = -1
    with _pidfds_lock:
        old = _pidfds.get(key)
        if old is not None:  # another thread was first
            if fd >= 0:
                os.close(fd)
            return old
        if len(_pidfds) >= _PIDFDS_MAX:  # forget the dead; live ones stay (a reader may be using the fd)
            for k in [k for k, v in _pidfds.items() if v < 0]:
                del _pidfds[k]
        if len(_pidfds) >= _PIDFDS_MAX:  # that many live owners: ask /proc for this one, uncached
            if fd >= 0:
                os.close(fd)
            return -2 if fd != -1 else -1
        _pidfds[key] = fd
    return fd


class Watch:
    """A transfer being watched; whoever ``claim()``s it first (completion, deadline, death) decides."""

    __slots__ = ("deadline", "died", "fail", "finished", "limit", "pid_key", "what")

    def __init__(
        self,
        limit: float,
        pid_key: tuple[int, int] | None,
        fail: Callable[[BaseException], None],
        what: str,
        died: Callable[[], BaseException],
    ):
        self.limit, self.deadline = limit, time.monotonic() + limit
        self.pid_key, self.fail, self.what, self.died = pid_key, fail, what, died
        self.finished = False

    def claim(self) -> bool:
        """True for the first caller only (the transfer's completion, its deadline or its owner's death)."""
        with _claim_lock:
            if self.finished:
                return False
            self.finished = True
            return True


_claim_lock = threading.Lock()


class _Watcher:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, Watch]] = []
        self._seq = itertools.count()
        self._by_owner: dict[tuple[int, int], set[Watch]] = {}
        self._pidfds: dict[tuple[int, int], int] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="jupyter-mesh-transfers", daemon=True)
        self._thread.start()

    def add(self, w: Watch) -> None:
        with self._lock:
            heapq.heappush(self._heap, (w.deadline, next(self._seq), w))
            if w.pid_key is not None:
                self._by_owner.setdefault(w.pid_key, set()).add(w)
                if w.pid_key not in self._pidfds:
                    self._open_pidfd(w.pid_key)
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def _open_pidfd(self, key: tuple[int, int]) -> None:
        pid, start = key
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            fd = -1
        if fd < 0 or not owner_alive(pid, start):  # already gone (or the pid is someone else's now)
            if fd >= 0:
                os.close(fd)
            self._pidfds[key] = -1
            return
        self._pidfds[key] = fd
        self._sel.register(fd, selectors.EVENT_READ, key)

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._heap and self._heap[0][2].finished:
                    self._discard(heapq.heappop(self._heap)[2])
                timeout = max(0.0, self._heap[0][0] - time.monotonic()) if self._heap else None
                dead = [k for k, fd in self._pidfds.items() if fd < 0]
            for owner in dead:
                self._owner_died(owner)
            for key, _ in self._sel.select(timeout):
                if key.data is None:
                    try:
                        while os.read(self._wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                else:
                    self._owner_died(key.data)
            now = time.monotonic()
            expired = []
            with self._lock:
                while self._heap and (self._heap[0][2].finished or self._heap[0][0] <= now):
                    w = heapq.heappop(self._heap)[2]
                    self._discard(w)
                    if w.claim():
                        expired.append(w)
            for w in expired:
                w.fail(MeshTimeoutError("transfer", w.limit, w.what))

    def _discard(self, w: Watch) -> None:
        if w.pid_key is not None:
            s = self._by_owner.get(w.pid_key)
            if s is not None:
                s.discard(w)

    def _owner_died(self, key: tuple[int, int]) -> None:
        with self._lock:
            fd = self._pidfds.pop(key, -1)
            waiting = self._by_owner.pop(key, set())
        if fd >= 0:
            self._sel.unregister(fd)
            os.close(fd)
        for w in waiting:
            if w.claim():
                w.fail(w.died())


_watcher: _Watcher | None = None
_watcher_lock = threading.Lock()
_watcher_pid = 0


def watch(
    timeout: float,
    owner: tuple[int, int] | None,
    fail: Callable[[BaseException], None],
    what: str,
    died: Callable[[], BaseException],
) -> Watch:
    """Call ``fail`` after ``timeout`` s, or as soon as ``owner`` (pid, start time) exits; unless done first."""
    global _watcher, _watcher_pid
    with _watcher_lock:
        if _watcher is None or _watcher_pid != os.getpid():
            _watcher, _watcher_pid = _Watcher(), os.getpid()
        w = Watch(timeout, owner, fail, what, died)
        _watcher.add(w)
    return w
