"""Worker output the controller keeps for ``ProcMesh.logs()`` and ``%mesh logs``, bounded in bytes.

A flood must not take the controller's memory with it (20,000 lines of 64 KiB once held 1.5 GiB,
still after ``stop()``), so the store is capped three ways: each rank keeps its latest
``JUPYTER_MESH_LOG_BYTES`` (default 8 MiB); all ranks together at most ``JUPYTER_MESH_LOG_BYTES_TOTAL``
(default 256 MiB), over which the biggest ranks lose their oldest lines first; a line longer than
``LINE_MAX`` is cut, with a marker that says how much. A stopped mesh keeps only a short tail
(``STOPPED_TAIL``), enough to look at its last words. Sizes count characters plus a per-line
overhead, so a flood of short lines is bounded too.
"""

from __future__ import annotations

import collections
import heapq
import os
import threading

from .._wire.protocol import OUT_SYNC_PREFIX

__all__ = ["LINE_MAX", "WorkerLogs", "cut_line"]

LINE_MAX = 8 << 10  # characters of one line kept and printed
LINE_OVERHEAD = 32  # what a kept line costs beyond its text, as counted against the caps
STOPPED_TAIL = 64 << 10  # per rank, once its mesh stopped

Entry = tuple[float, int, int, str]  # (arrival time, rank, fd, text)


def _env_bytes(name: str, default: int) -> int:
    try:
        return max(1 << 10, int(os.environ.get(name, default)))
    except ValueError:
        return default


def cut_line(line: str) -> str:
    """``line``, or its first ``LINE_MAX`` characters with a marker saying how many more there were."""
    if len(line) <= LINE_MAX:
        return line
    return f"{line[:LINE_MAX]}… [cut {len(line) - LINE_MAX} bytes]"


class _RankLog:
    __slots__ = ("lines", "size")

    def __init__(self) -> None:
        self.lines: collections.deque[Entry] = collections.deque()
        self.size = 0

    def drop_to(self, limit: int) -> int:
        """Drop the oldest lines until at most ``limit`` is held; returns how much was freed."""
        freed = 0
        while self.size > limit and self.lines:
            n = len(self.lines.popleft()[3]) + LINE_OVERHEAD
            self.size -= n
            freed += n
        return freed


class WorkerLogs:
    """Lines per (mesh, rank), arrival-ordered, under a per-rank and an overall byte cap."""

    def __init__(self, per_rank: int | None = None, total: int | None = None):
        self.per_rank = per_rank or _env_bytes("JUPYTER_MESH_LOG_BYTES", 8 << 20)
        self.total = total or _env_bytes("JUPYTER_MESH_LOG_BYTES_TOTAL", 256 << 20)
        self.size = 0
        self._logs: dict[str, dict[int, _RankLog]] = {}
        self._stopped: set[str] = set()
        self._lock = threading.Lock()

    def add(self, mesh_id: str, rank: int, fd: int, lines: list[str], now: float) -> None:
        with self._lock:
            ranks = self._logs.setdefault(mesh_id, {})
            log = ranks.get(rank)
            if log is None:
                log = ranks[rank] = _RankLog()
            cap = STOPPED_TAIL if mesh_id in self._stopped else self.per_rank
            for line in lines:
                if OUT_SYNC_PREFIX in line:  # a marker the notebook waits for, not the user's output
                    line, _, _token = line.partition(OUT_SYNC_PREFIX)
                    if not line:
                        continue
                log.lines.append((now, rank, fd, line))
                n = len(line) + LINE_OVERHEAD
                log.size += n
                self.size += n
            if log.size > cap:
                self.size -= log.drop_to(cap)
            if self.size > self.total:
                self._trim_total()

    def _trim_total(self) -> None:
        """Over the overall cap: the biggest ranks lose their oldest lines first, down to 90 % of
        the cap (so a steady flood does not pay for this on every line)."""
        target = self.total * 9 // 10
        heap = [(-log.size, id(log), log) for ranks in self._logs.values() for log in ranks.values() if log.size]
        heapq.heapify(heap)
        while self.size > target and heap:
            _, _, log = heapq.heappop(heap)
            second = -heap[0][0] if heap else 0
            # down to the next biggest rank, or less if that is enough; a tie still loses a bite
            keep = max(log.size - (self.size - target), min(second, log.size * 15 // 16), 0)
            self.size -= log.drop_to(keep)
            if log.size:
                heapq.heappush(heap, (-log.size, id(log), log))

    def stopped(self, mesh_id: str) -> None:
        """The mesh stopped: keep only a short tail of each rank (late lines are held to it too)."""
        with self._lock:
            self._stopped.add(mesh_id)
            for log in self._logs.get(mesh_id, {}).values():
                self.size -= log.drop_to(STOPPED_TAIL)
                log.lines = collections.deque(log.lines)  # a deque keeps the blocks it grew to: shed them

    def lines(self, mesh_id: str, rank: int | None) -> list[Entry]:
        with self._lock:
            ranks = self._logs.get(mesh_id, {})
            if rank is not None:
                log = ranks.get(rank)
                return list(log.lines) if log is not None else []
            per_rank = [list(log.lines) for log in ranks.values()]
        return list(heapq.merge(*per_rank, key=lambda x: x[0]))  # every rank, in arrival order

    def held(self, mesh_id: str | None = None) -> int:
        """Bytes held (as counted against the caps), of one mesh or of all."""
        with self._lock:
            if mesh_id is None:
                return self.size
            return sum(log.size for log in self._logs.get(mesh_id, {}).values())
