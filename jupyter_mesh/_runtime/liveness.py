"""Busy or hung: what the agent makes of a proc that stopped answering its pings.

A proc's pong is sent by its receive thread, which needs the GIL. An endpoint in a long C call that
holds the GIL (a numerical kernel, pickling a huge object, ``ctypes.PyDLL``) silences the proc
without it being stuck, and killing it would lose real work. So silence alone does not condemn a
proc: the agent asks the kernel (``/proc/<pid>/stat`` and its threads') whether it makes progress.

* **busy**: it uses CPU (at least ``MIN_CPU`` of a core over ``WINDOW``), or one of its threads is in
  uninterruptible I/O (D), or running (R) on two samples in a row (once proves nothing: a thread
  waiting for the GIL wakes every 5 ms, and on a loaded machine waits in R for a core). It is left
  alone; the controller is told, a few times a minute.
* **hung**: stopped (T, t: SIGSTOP, a debugger), a zombie, gone, or silent with no such sign of life
  for the whole heartbeat timeout (a native deadlock: its actor thread stuck on a lock). It is killed,
  as before. An actor thread that holds the GIL while it waits in the kernel on something else (a
  timer, a child process, a pipe or socket: its ``wchan``) is busy: it will return.

Plain data and functions, no messages: ``agent.py`` decides what to send.
"""

from __future__ import annotations

import os
from collections.abc import Collection

__all__ = ["MIN_CPU", "NOTE_EVERY", "WINDOW", "Liveness", "read_stat"]

MIN_CPU = 0.05  # CPU (fraction of a core) that counts as progress: far more than GIL and socket wake-ups
WINDOW = 1.0  # seconds over which CPU use is measured (the kernel counts it in 10 ms ticks)
NOTE_EVERY = 5.0  # seconds between two "busy" notes to the controller for one proc

_TICK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


# an actor thread blocked here is idle (waiting for its next message) or waiting for the GIL (or a
# lock): no sign of life; blocked anywhere else (a timer, a child, a pipe, a socket) it waits in native
# code on something that will come back, like ``ctypes.PyDLL(None).sleep(5)`` or ``system()``
_IDLE_OR_LOCKED = ("poll_schedule", "futex", "ep_poll", "do_epoll_wait")


def read_stat(pid: int, actor_tids: Collection[int] = ()) -> tuple[str, float, str, str] | None:
    """(state of the main thread, CPU seconds of all threads, states of every thread, why an actor
    thread waits), or None if gone.

    An actor thread (one that runs endpoints: the proc tells us which) asleep in the kernel anywhere
    but its own mailbox or a lock counts as state ``w``: it waits in native code for something that
    returns. Other threads (a user's background thread in ``time.sleep``) prove nothing."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after "pid (comm)": state is field 3, utime and stime fields 14 and 15 (man 5 proc)
    state, cpu = fields[0], (int(fields[11]) + int(fields[12])) / _TICK
    threads, waits = [], ""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    st = f.read().rsplit(")", 1)[1].split()[0]
                if st == "S" and int(tid) in actor_tids:
                    with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                        wchan = f.read().strip()
                    if wchan and wchan != "0" and not any(w in wchan for w in _IDLE_OR_LOCKED):
                        st, waits = "w", wchan
                threads.append(st)
            except (OSError, IndexError, ValueError):
                continue  # a thread that just ended
    except OSError:
        pass
    return state, cpu, "".join(threads) or state, waits


class Liveness:
    """One proc's signs of life between pongs, sampled by the agent's heartbeat tick."""

    __slots__ = ("cpu", "noted", "progress", "rate", "running", "sampled", "state", "threads", "waits")

    def __init__(self) -> None:
        self.cpu: float | None = None  # CPU seconds at the start of the current window
        self.sampled = 0.0  # when the window started
        self.running = False  # a thread was running (R) at the last sample
        self.progress = 0.0  # last time it showed life: a pong, CPU used, a thread running or in I/O
        self.rate = 0.0  # CPU used between the last two samples, in cores
        self.state = "?"  # main thread's state at the last sample ("gone" once it disappeared)
        self.threads = ""  # every thread's state at the last sample
        self.noted = 0.0  # when the controller was last told that it is busy (0: not told)
        self.waits = ""  # where an actor thread waits in the kernel (its wchan), if it waits in native code

    def answered(self, when: float) -> None:
        if when > self.progress:  # a new pong: the next silence measures from scratch
            self.progress, self.cpu, self.running = when, None, False

    def sample(self, pid: int, now: float, actor_tids: Collection[int] = ()) -> None:
        st = read_stat(pid, actor_tids)
        if st is None:
            self.state, self.threads, self.rate = "gone", "", 0.0
            return
        state, cpu, threads, self.waits = st
        if self.cpu is None:
            self.cpu, self.sampled = cpu, now
        elif now - self.sampled >= WINDOW:
            self.rate = max(0.0, cpu - self.cpu) / (now - self.sampled)
            self.cpu, self.sampled = cpu, now
            if self.rate >= MIN_CPU:
                self.progress = now
        running = "R" in threads
        if state not in "TtZX" and ("D" in threads or "w" in threads or (running and self.running)):
            self.progress = now
        self.running, self.state, self.threads = running, state, threads

    def hung(self, now: float, timeout: float) -> bool:
        return self.state in ("T", "t", "Z", "X", "gone") or now - self.progress > timeout

    def why_hung(self, now: float) -> str:
        if self.state in ("T", "t"):
            return "it is stopped (SIGSTOP or a debugger: state T)"
        if self.state in ("Z", "X", "gone"):
            return "it is exiting"
        return (
            f"it made no progress for {now - self.progress:.1f} s (no thread running, sleeping on a timer or "
            "in I/O, no CPU used: a deadlock, in native code)"
        )

    def busy_note(self, silent: float) -> str:
        """What the controller shows for a busy proc, e.g. "no answer for 12 s, busy in native code ..."."""
        return f"no answer for {silent:.0f} s, {self.why_busy()}"

    def why_busy(self) -> str:
        if "D" in self.threads and self.rate < MIN_CPU:
            return "waiting for I/O (state D)"
        if "w" in self.threads and self.rate < MIN_CPU:
            return f"waiting in native code while it holds the GIL (in {self.waits})"
        return f"busy in native code holding the GIL (CPU {100 * self.rate:.0f} %)"
