"""What runs on new procs before ``spawn_procs`` returns them (Monarch's options): a ``bootstrap``
function, and ``proc_bind``, each proc's CPU binding (``cpus`` / ``physcpubind``: a CPU list as taskset
takes it; ``cpunodebind``: NUMA nodes, bound to their CPUs). Both run as one small actor per proc."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._core.actor import Actor, current_rank, endpoint
from ..errors import MeshValueError

__all__ = ["ProcSetup", "check_proc_bind"]

_CPU_KEYS = ("cpus", "physcpubind")
_NODE_KEYS = ("cpunodebind",)
_KNOWN = {*_CPU_KEYS, *_NODE_KEYS, "membind"}


def check_proc_bind(proc_bind: Sequence[Mapping[str, str]] | None, per_host: Mapping[str, int]) -> None:
    """As Monarch: one binding per proc of a host, with keys it knows."""
    if proc_bind is None:
        return
    n = 1
    for size in per_host.values():
        n *= size
    if len(proc_bind) != n:
        raise MeshValueError(f"proc_bind length ({len(proc_bind)}) must equal procs_per_host ({n})")
    for b in proc_bind:
        unknown = set(b) - _KNOWN
        if unknown:
            raise MeshValueError(f"proc_bind keys {sorted(unknown)} are unknown; use {sorted(_KNOWN)}")


def _cpu_list(text: str) -> set[int]:
    """``"0-3,8"`` -> {0, 1, 2, 3, 8} (the kernel's and taskset's list form)."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _bind(binding: Mapping[str, str]) -> None:
    cpus: set[int] = set()
    for key in _CPU_KEYS:
        if key in binding:
            cpus |= _cpu_list(binding[key])
    for key in _NODE_KEYS:
        for node in _cpu_list(binding.get(key, "")):
            with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
                cpus |= _cpu_list(f.read())
    if not cpus:
        return
    for tid in os.listdir("/proc/self/task"):  # every thread of the proc; threads made later inherit it
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass


class ProcSetup(Actor):
    """Binds its proc (``proc_bind``, by the proc's index on its host), then runs ``bootstrap``."""

    def __init__(self, binds: Sequence[Mapping[str, str]] | None, host_dims: int, fn: Callable[[], Any] | None):
        self.binds, self.host_dims, self.fn = binds, host_dims, fn

    @endpoint
    async def run(self) -> None:
        if self.binds:
            point = current_rank()
            labels = list(point)[self.host_dims :]  # the per-host dims: the proc's index on its host
            index = 0
            for label in labels:
                index = index * point.extent[label] + point[label]
            _bind(self.binds[index])
        if self.fn is not None:
            out = self.fn()
            if inspect.isawaitable(out):
                await out
