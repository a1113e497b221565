"""The agent as its procs' subreaper: a proc whose fork server was killed does not leave what it started.

Each proc leads a process group of its own, and whatever forked it (the template, or its warm child)
kills what is left of that group before it reaps the proc (``template._end_group``), or as it exits
itself (``_Server.leave``). A fork server killed by SIGKILL does neither: its procs die at once
(PR_SET_PDEATHSIG), and their children would live on. So the agent is a child subreaper
(PR_SET_CHILD_SUBREAPER): the procs of a dead fork server become its children, and it kills each one's
group before it reaps it. Only the group of a pid the fork server reported as a proc is killed, while
that proc is the agent's child and not reaped: its pid, the group's id, cannot be anyone else's.

A subreaper adopts every orphan below it, also while the procs live (a shell's background job whose
shell exited, a daemon's double fork): the agent reaps those as they end, and leaves them alone
otherwise. It starts no children but its template, which its ``Popen`` reaps.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

__all__ = ["Adopted"]

_PR_SET_CHILD_SUBREAPER = 36


class Adopted:
    """What this agent knows of the procs its fork servers forked, to end their groups if it adopts them."""

    def __init__(self) -> None:
        self.leaders: set[int] = set()  # the procs forked and not reaped by their fork server: group ids
        self._lock = threading.Lock()  # (the I/O thread reaps; a shutdown, from another thread, too)
        try:
            self.on = ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0
        except Exception:  # noqa: BLE001 - not Linux: orphans go to init, as without this
            self.on = False

    def forked(self, pid: int) -> None:
        with self._lock:
            self.leaders.add(pid)

    def reaped(self, pid: int) -> None:
        """Its fork server reaped it (and ended its group): the pid is free for anyone from now on."""
        with self._lock:
            self.leaders.discard(pid)

    def reap(self, spare: int) -> None:
        """Reap every adopted child that ended, killing what is left of its group first if it was a
        proc. ``spare``: the template, reaped by its ``Popen`` (while it is a zombie, those the kernel
        lists after it wait for the next call)."""
        if not self.on:
            return
        with self._lock:
            # those gone already were reaped by someone else (their fork server, whose report is on its
            # way; init, for a seed's warm child's): never ours to adopt, their pids are anyone's now
            self.leaders = {pid for pid in self.leaders if _exists(pid)}
            while True:
                try:
                    info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # (not reaped yet)
                except ChildProcessError:
                    return
                if info is None or info.si_pid == spare:
                    return
                pid = info.si_pid
                if pid in self.leaders:
                    self.leaders.discard(pid)
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:  # no group left (or it never made one)
                        pass
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass

    def settle(self, spare: int, timeout: float) -> None:
        """Reap until no proc known here is a child of ours any more (they were killed), or ``timeout``:
        at the agent's exit, one that still dies would be adopted by init, its group left."""
        deadline = time.monotonic() + timeout
        while True:
            self.reap(spare)
            with self._lock:
                left = [pid for pid in self.leaders if _is_child(pid)]
            if not left or time.monotonic() > deadline:
                return
            time.sleep(0.01)


def _is_child(pid: int) -> bool:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's: it exists)
        pass
    return True
