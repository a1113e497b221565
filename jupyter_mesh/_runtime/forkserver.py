"""The agent's handle on its host's fork server (the template process, ``template.py``).

It starts the template (and a new one when it dies), asks it for forks over their private socket,
remembers the forks not answered yet, and tells from outside whether a template that is slow to
answer is stopped (SIGSTOP, a debugger) rather than busy (importing torch, or a preload that waits on
a compiler for minutes). What to do about it is the agent's call.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from .agent_state import ProcEntry, describe_exit, kill, leads_own_session
from .liveness import Liveness, read_stat
from .packets import recv
from .template import launch
from .template_seed import seed_pid

__all__ = ["ForkServer"]


QUICK_DEATH_S = 10.0
"""A template that dies this soon after its start counts toward a crash loop (``ForkServer.died``)."""
MAX_BACKOFF = 8.0  # (the host recovers this soon once the cause is fixed, a module on disk say)


class ForkServer:
    def __init__(
        self,
        key_hex: str,
        lifeline_r: int,
        preload: list[str],
        warm: Sequence[str] = (),
        started: tuple[subprocess.Popen[bytes], socket.socket] | None = None,
    ):
        """``started``: a template this process launched already (``template.launch``), adopted."""
        self._key_hex, self._lifeline_r = key_hex, lifeline_r
        self.preload = list(preload)  # what every template of this host imports (meshes add to it)
        self.warm = list(warm)  # what it imports when this host has it installed (``jobs.warm``)
        self.pending: dict[int, ProcEntry] = {}  # fork token -> the proc it is for, until "forked"
        self._asked: dict[int, float] = {}  # token -> when that fork was asked for
        self._tokens = iter(range(1, 1 << 62))
        self._watch: Liveness | None = None  # its signs of life while forks are overdue
        self.quick_deaths = 0  # templates in a row that died soon after their start (``died``)
        self.down_until = 0.0  # while it is down (a crash loop backs off): when the next one starts
        self.down_cause = ""
        self.start(started)

    def start(self, started: tuple[subprocess.Popen[bytes], socket.socket] | None = None) -> None:
        """(Re)start the template; the caller registers ``sock`` with its selector."""
        proc, ours = started or launch(self._lifeline_r)
        self.started_at, self.down_until, self.down_cause = time.monotonic(), 0.0, ""
        self.serving = proc.pid  # the process that forks: its warm child once that took over (``template``)
        self.warming = 0  # that warm child while it imports (held forks wait for it)
        self.ending: dict[str, Any] | None = None  # the template's last word: its warm child died (how, when)
        # the key first, before anyone else can send on this socket: a fork before it makes keyless procs
        socket.send_fds(ours, [json.dumps({"op": "key", "key": self._key_hex}).encode()], [])
        self.sock, self.proc = ours, proc
        if self.preload:
            self.send({"op": "preload", "modules": self.preload, "token": 0})
        if self.warm:  # after the named ones: a fork waits for both, and they are what it needs
            self.send({"op": "preload", "modules": self.warm, "token": 0, "if_installed": True})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, obj: dict[str, Any], fds: list[int] = ()) -> None:  # type: ignore[assignment]
        socket.send_fds(self.sock, [json.dumps(obj).encode()], list(fds))

    def load(self, modules: list[str]) -> None:
        """Import ``modules`` now, and in every later template."""
        self.preload += [m for m in modules if m not in self.preload]
        if not self.down:
            self.send({"op": "preload", "modules": modules, "token": 0})

    @property
    def down(self) -> bool:
        """Between a crash loop's templates: forks fail with ``down_cause`` until ``down_until``."""
        return self.down_until > 0.0

    def died(self, cause: str, now: float) -> float:
        """It died (reaped, with ``cause``): how long to wait before the next one, 0 for at once. A
        template that dies soon after its start, before it ever forked (a preload or an environment it
        cannot start with), would die again: after the second such death in a row the next start
        waits, 1 s and then twice as long each time (at most ``MAX_BACKOFF``), rather than restarting
        as fast as it dies (a core spent, its error printed hundreds of times a minute)."""
        self.quick_deaths = self.quick_deaths + 1 if now - self.started_at < QUICK_DEATH_S else 0
        if self.quick_deaths < 2:
            return 0.0
        delay = min(MAX_BACKOFF, 2.0 ** (self.quick_deaths - 2))
        self.down_until = now + delay
        self.down_cause = (
            f"{cause}; it died {self.quick_deaths} times in a row within {QUICK_DEATH_S:.0f} s of its start, "
            f"so the next one starts in {delay:.0f} s. The agent's stderr has the template's error: check "
            "the job's preload and environment"
        )
        return delay

    def fork(self, p: ProcEntry, cfg: dict[str, Any], fds: list[int]) -> None:
        token = next(self._tokens)
        self.pending[token] = p
        self._asked[token] = time.monotonic()
        if self.down:  # failed with the cause by the agent's next tick (``give_up_waiting``)
            return
        try:
            self.send({"op": "fork", "token": token, "cfg": cfg}, fds)
        except OSError:  # it died and the agent has not read its EOF yet: when it does, the
            pass  # agent fails this start with the cause (it is pending) and starts a new template

    def forked(self, token: int) -> ProcEntry | None:
        """The template answered fork ``token``: the proc it was for (None if forgotten)."""
        self.quick_deaths = 0  # it works: a death from now on is no crash loop (a kill by hand, say)
        self._asked.pop(token, None)
        return self.pending.pop(token, None)

    def recv(self) -> dict[str, Any] | None:
        """One message from the template; None when it is gone."""
        msg, fds = recv(self.sock)  # (after a reset too: its last word says how its warm child died)
        for fd in fds:  # it sends none
            os.close(fd)
        return msg

    def overdue(self, now: float, timeout: float) -> str | None:
        """With forks unanswered for more than ``timeout`` while it is stopped: why; else None (none
        overdue, or it is running: a slow preload is not a fault)."""
        oldest = min(self._asked.values(), default=now)
        if now - oldest <= timeout:
            self._watch = None
            return None
        w = self._watch
        if w is None:  # silence counts from the oldest fork asked for
            w = self._watch = Liveness()
            w.answered(oldest)
        w.sample(self.serving, now)
        pid, state = self.serving, w.state
        if state not in ("T", "t") and self.warming:  # or the warm child the held forks wait for
            st = read_stat(self.warming)
            pid, state = self.warming, st[0] if st else ""
        if state in ("T", "t"):
            who = f"its host's fork server (template, pid {pid})"
            if pid == self.warming and pid == seed_pid():
                who = f"its job's seed (pid {pid}), which imports the warm list for every host,"
            elif pid != self.proc.pid:  # serving after its takeover, or warming up for it
                who = f"its host's fork server (the template's warm child, pid {pid})"
            return (
                f"{who} is stopped (SIGSTOP or a debugger: "
                f"state {state}) and did not fork for {now - oldest:.1f} s; resume it (SIGCONT) and spawn again"
            )
        return None

    def give_up_waiting(self) -> list[ProcEntry]:
        """The procs whose forks are still unanswered (their starts are failed by the caller); a fork
        that comes later anyway is killed at once, as its proc is marked stopping by then."""
        self._asked.clear()
        return [p for p in self.pending.values() if p.alive]

    def reap(self) -> str:
        """After its socket closed: wait for it, forget its forks, and say how it ended."""
        try:
            code = self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(2.0)
        who, end = f"template, pid {self.pid}", self.ending
        if end is not None:  # it ended because its warm child, the one that forked, died: say that
            code = end["code"]
            who = f"the template's warm child, pid {int(end['pid'])}"
            if end.get("when"):
                who += f", {str(end['when'])[:200]}"
        if code is None:  # (``when`` says why it is not known)
            how = "ended"
        else:
            how = describe_exit(ProcEntry("", 0, ""), code if code >= 0 else None, -code if code < 0 else None)
        self.sock.close()
        self.pending.clear()
        self._asked.clear()
        return f"its host's fork server ({who}) {how}, taking its procs with it"

    def stop(self) -> None:
        if self.down:
            return  # reaped already
        if self.serving != self.proc.pid and leads_own_session(self.serving):
            # a warm child from the job's seed is not the template's child: it ends when it reads the
            # template's EOF, its procs' groups first (``template_seed``), which a stopped one never
            # would: resumed. (Killed, it took its procs along before anyone ended their groups)
            kill(self.serving, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(5)
