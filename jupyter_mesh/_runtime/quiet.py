"""Which procs the agent need not ping this tick: the idle ones, told from ``/proc`` without waking them.

A ping wakes four threads in two processes (the proc's ZeroMQ I/O thread and receive thread, the
agent's) and costs a few hundred microseconds of CPU on a loaded host; 256 idle procs pinged four times
per heartbeat timeout cost ~10 % of a core for nothing. Yet an idle proc cannot change: nothing
reaches its Python without going through its ZeroMQ I/O thread, which signals the receiving thread
through an eventfd, a ``read``/``write`` the kernel counts in ``/proc/<pid>/io`` (``syscr``,
``syscw``) even when that thread never gets the GIL. So a proc that

* answered our last ping,
* did no I/O between the moment that ping was sent and now except the ping's own exchange,
* has every thread asleep where an idle proc's threads sleep (``idle_shaped``: a call that came just
  before the ping may hold the GIL now without any I/O), and
* is not stopped (``/proc/<pid>/stat``: not ``T``, ``t``, ``Z``, ``X``; a stopped proc does no I/O),

is as alive as its pong said, and stays so while its I/O counters and CPU time stay put: the agent
counts it as having answered and sends nothing. A proc with any traffic (a call, a cast, a notice) is pinged every tick as
before; so is one whose ``/proc`` files cannot be read. Two limits, both bounded by a ping every
``QUIET_PING_EVERY`` ticks regardless: a thread of the proc that hangs without any I/O (a user's
background thread taking the GIL into a native deadlock), and a message that reached the proc in the
same burst as a ping (ZeroMQ signals once per burst) and then hung it. Both need a hang that
leaves every thread asleep where an idle proc's threads sleep. That ping was the idle mesh's largest
cost (a ping and its pong cost an idle proc 0.2-0.4 ms of CPU on this VM, four threads woken: every
12 s at 256 procs, ~1 % of a core), so it is bounded in two steps: after traffic (when a call may just
have hung it) the proc goes ``FIRST_QUIET_PING`` ticks at the most without a ping (12-16, 9-12 s by
default), and once that ping found it still idle, ``QUIET_PING_EVERY`` (90-120 ticks, 67-90 s). Each
proc's comes at a tick of its own (a phase from its pid): procs that went idle together are not all
pinged in one tick.

One descriptor pair per proc stays open (``pread`` of an open ``/proc`` file costs ~1-5 us, opening
it ~50 us); a proc that is gone reads as an error and is pinged, and ``prune`` closes its files. A
known-idle proc whose two files read exactly as when it went idle is idle still, without parsing.
"""

from __future__ import annotations

import os
from collections.abc import Collection

__all__ = ["FIRST_QUIET_PING", "QUIET_PING_EVERY", "QuietProcs"]

# ticks an idle proc goes without a ping at the most: 3/4 of it to all of it, by its pid (a phase)
FIRST_QUIET_PING = 16  # after traffic (4 heartbeat timeouts)
QUIET_PING_EVERY = 120  # after a ping that found it idle all along (30 heartbeat timeouts)

_STOPPED = ("T", "t", "Z", "X")


class _Proc:
    __slots__ = ("at_ping", "base", "io_fd", "limit", "ping_time", "raw", "settled", "skipped", "stat_fd")

    def __init__(self, pid: int) -> None:
        self.stat_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.io_fd = os.open(f"/proc/{pid}/io", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(self.stat_fd)
            raise
        self.at_ping: tuple[int, int] | None = None  # I/O counters just before the last ping
        self.ping_time = 0.0  # when that ping was sent
        self.base: tuple[int, int, int] | None = None  # I/O and CPU while known idle (None: not known idle)
        self.skipped = 0  # ticks without a ping since it was last pinged
        self.limit = FIRST_QUIET_PING  # ... at the most, this idle spell
        self.settled = False  # its last forced ping found it idle all along (no traffic since)
        self.raw: tuple[bytes, bytes] | None = None  # both files as read when it was found idle

    def unchanged(self) -> bool:
        """Both files read byte for byte as when it was found idle (then it is idle still: the state,
        the CPU time and the I/O counters are among those bytes)."""
        try:
            return (os.pread(self.stat_fd, 1024, 0), os.pread(self.io_fd, 512, 0)) == self.raw
        except OSError:
            return False

    def read(self) -> tuple[int, int, int] | None:
        """(syscr, syscw, CPU ticks of all its threads), or None when it is stopped, a zombie, gone,
        or unreadable; ``raw`` keeps what was read."""
        try:
            stat = os.pread(self.stat_fd, 1024, 0)
            fields = stat.rsplit(b")", 1)[1].split()
            if fields[0].decode() in _STOPPED:
                return None
            io = os.pread(self.io_fd, 512, 0)
        except (OSError, IndexError):
            return None
        self.raw = (stat, io)
        lines = io.split(b"\n", 4)  # rchar, wchar, syscr, syscw, ... (man 5 proc)
        if len(lines) < 5 or not (lines[2].startswith(b"syscr:") and lines[3].startswith(b"syscw:")):
            return None
        # after "pid (comm)": utime and stime are fields 14 and 15 (man 5 proc)
        return int(lines[2][6:]), int(lines[3][6:]), int(fields[11]) + int(fields[12])

    def close(self) -> None:
        os.close(self.stat_fd)
        os.close(self.io_fd)


# where the threads of an idle proc sleep: its actor and receive threads in ZeroMQ's poll, ZeroMQ's
# own in epoll, the lifeline thread on its pipe. A thread anywhere else (running, waiting for the GIL
# or a lock, sleeping on a timer, in native code) may be doing something: not idle.
_IDLE_WCHANS = ("poll_schedule_timeout", "do_sys_poll", "do_epoll_wait", "ep_poll", "pipe_read", "pipe_wait")


def idle_shaped(pid: int) -> bool:
    """Every thread of ``pid`` sleeps where an idle proc's threads sleep (read once per idle spell:
    a message that reached it just before the ping may have started a call that holds the GIL
    without any further I/O, and only its thread's state shows it)."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split(None, 1)[0] != b"S":
                    return False
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                wchan = f.read().strip()
            if not any(w in wchan for w in _IDLE_WCHANS):
                return False
    except (OSError, IndexError):
        return False
    return True


class QuietProcs:
    """The agent's heartbeat thread asks ``idle(pid, ...)`` before each ping; only that thread uses it."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._procs: dict[int, _Proc] = {}
        # the I/O one ping exchange causes in a proc, learned: the least seen over an answered ping
        # (a ping cannot cost less than itself; a burst that coalesced one more cheaply only makes
        # the next exchange look busy, so the proc is pinged once more)
        self.exchange: tuple[int, int] | None = None

    def idle(self, pid: int, last_pong: float, now: float) -> bool:
        """True: skip the ping, the proc is idle and was alive at its last pong. False: ping it now
        (the caller does, right after)."""
        if not self.enabled:
            return False
        q = self._procs.get(pid)
        if q is None:
            try:
                q = self._procs[pid] = _Proc(pid)
            except OSError:
                self.enabled = bool(self._procs)  # no /proc/<pid>/io here at all: ping as before
                return False
        if q.base is not None and q.skipped < q.limit and q.unchanged():
            q.skipped += 1  # no I/O and no CPU since it was found idle (the common case: no parsing)
            return True
        io = q.read()
        if io is None:
            q.settled = False  # stopped or unreadable
        else:
            if q.base is not None:
                if io != q.base:
                    q.settled = False  # traffic
                elif q.skipped < q.limit:
                    q.skipped += 1  # no I/O and no CPU since it was found idle (some other field changed)
                    return True
                else:
                    q.settled = True  # its forced ping, now: idle all along
            if q.at_ping is not None and last_pong >= q.ping_time:  # answered the ping sent at at_ping
                diff = (io[0] - q.at_ping[0], io[1] - q.at_ping[1])
                if diff != self.exchange:
                    q.settled = False  # more than the ping's own exchange: traffic, perhaps
                if self.exchange is None or diff < self.exchange:
                    self.exchange = diff  # learned; not trusted yet for this proc
                elif diff == self.exchange:
                    if idle_shaped(pid):
                        most = QUIET_PING_EVERY if q.settled else FIRST_QUIET_PING
                        q.base, q.at_ping, q.skipped, q.limit = io, None, 1, most - pid % (most // 4)
                        return True  # (this tick counts)
                    q.settled = False  # a thread is up to something: a message in the ping's burst
        q.base, q.at_ping, q.ping_time, q.skipped = None, io[:2] if io else None, now, 0
        return False

    def prune(self, alive: Collection[int]) -> None:
        """Close the files of procs no longer running."""
        for pid in [p for p in self._procs if p not in alive]:
            self._procs.pop(pid).close()

    def close(self) -> None:
        self.prune(())
