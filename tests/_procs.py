"""Process bookkeeping for tests: find descendants, wait for pids to die (bounded)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any


def _ppid_map() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        out[int(name)] = int(fields[1])
    return out


def ppid(pid: int) -> int:
    """Its parent's pid; 0 if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def descendants(pid: int) -> set[int]:
    """Live (non-zombie) processes below ``pid``."""
    ppids = _ppid_map()
    found, frontier = set(), {pid}
    while frontier:
        nxt = {c for c, p in ppids.items() if p in frontier and c not in found}
        found |= nxt
        frontier = nxt
    return found


def open_pipes(pid: int) -> int:
    """How many pipes ``pid`` holds open (a proc: its own stdout, stderr and lifeline only)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:")
        except OSError:
            pass
    return n


def state(pid: int) -> str:
    """Its state letter (R, S, T, Z ...); "" if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def alive(pid: int) -> bool:
    return state(pid) not in ("", "Z")


def wait_dead(pids: set[int] | list[int], timeout: float) -> set[int]:
    """Wait until none of ``pids`` is alive; return those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = {p for p in left if alive(p)}
    return left


def wait_for(pred, timeout: float, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    return pred()


def template_of(agent: int, procs: set[int]) -> int:
    """The fork server of a host: the agent's child that is none of its procs (nor theirs)."""
    some = next(iter(procs))
    return next(p for p in descendants(agent) if p not in procs and p not in descendants(some))


def wait_stopped(pid: int, timeout: float = 2.0) -> bool:
    """After SIGSTOP: wait until every thread of ``pid`` is stopped (a group stop is not instant: a
    thread on a core runs on until it next enters the kernel)."""

    def all_stopped() -> bool:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
            states = []
            for t in tids:
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            return False
        return bool(states) and all(st in "Tt" for st in states)

    return bool(wait_for(all_stopped, timeout, 0.002))


@contextlib.contextmanager
def reaped_procs(host: Any, gpus: int, **spawn: Any) -> Iterator[Any]:
    """A proc mesh of ``gpus`` procs per host (a module fixture's), stopped at the end with every one of
    its procs checked gone."""
    pm = host.spawn_procs(per_host={"gpus": gpus}, **spawn)
    pids = set(pm.pids().values())
    yield pm
    pm.stop(timeout=5)
    assert not wait_dead(pids, 5.0), "procs leaked"


def templates_of(agent_pid: int) -> list[int]:
    """Live processes of the template (fork server) that ``agent_pid`` started, its warm child and procs
    included: they all keep its argv, which names the agent."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        # python -m jupyter_mesh._runtime.template SOCK LIFELINE AGENT_PID [SEED_LINK]
        if b"jupyter_mesh._runtime.template" in argv and argv[5:6] == [str(agent_pid).encode()] and state != "Z":
            out.append(int(d))
    return out
