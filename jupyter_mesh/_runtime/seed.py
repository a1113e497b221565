"""A local job's *seed*: the one process that imports the warm list (torch & co.) for all its hosts.

``LocalJob(hosts=8)`` runs eight agents on one machine, and each host's template would import torch in
its own warm child: eight imports at once, ~7.5 s of a 2-core machine before the first proc forks
(one alone: ~1.4 s). The seed imports the list once, as soon as the job starts; then each template
asks it for a warm child instead of making its own. The seed forks one, already warm, and hands it
nothing but the socket the template sent along: the template gives its warm child the agent's socket,
its lifeline and the session key itself (``template.py``), so the seed never holds any of them. From
then on it is the warm child of that host, as without a seed.

Links are file descriptors only: the job sends the seed one end of a socket pair per agent
(``link``, SCM_RIGHTS) and gives the agent the other (``pass_fds``, ``JUPYTER_MESH__SEED``); the agent
passes it to each template it starts. Nothing is on the file system, so no other process can ask.

A seeded warm child is the seed's child, not its template's: the seed reaps it and tells the template
its exit status (``{"op": "exit"}``), and the two watch each other through their socket (EOF: the
other is gone). A host whose agent is gone (EOF on its link) loses its warm children too (each ends
with its template, its procs' groups first; the seed resumes a stopped one, so that it does), and the seed
ends when its job does (EOF on its control socket), after the job's agents: it gives its children a
moment to end with their templates (``END_WAIT``), resumed if stopped, and kills what is left, which
would otherwise hold the job's output for ever.

A seed that is gone, or started in another environment than the template (``mismatch``), costs speed
only: the template warms up alone, as on any other host. A stopped seed is a stopped fork server: the
spawns that wait on it fail, naming it, after the agent's fork timeout; resume it and spawn again.
One still stopped when its controller dies (``kill -9``) never reads that EOF: the orphaned agents end
it (``end_for_dead_controller``).
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .agent_state import kill, leads_own_session
from .packets import recv, send_or_ignore
from .template_seed import LINK_ENV, fingerprint

__all__ = ["LINK_ENV", "Seed", "enabled", "fingerprint", "mismatch"]

END_WAIT = 3.0
"""Seconds the seed gives its warm children to end once its job is gone, before it kills them (``_end``)."""


def enabled() -> bool:
    """On unless ``JUPYTER_MESH_SEED=0``: a job of one host has nothing to share, and starts none."""
    return os.environ.get("JUPYTER_MESH_SEED", "1").strip().lower() not in ("0", "false", "no", "off")


def mismatch(mine: dict[str, Any], theirs: Any) -> str:
    """Why a template whose ``fingerprint`` is ``theirs`` cannot take this seed's children ('' if it can)."""
    if not isinstance(theirs, dict):
        return "no fingerprint"
    for what in ("exe", "path", "cwd"):
        if theirs.get(what) != mine[what]:
            return f"another {what}"
    env = theirs.get("env")
    if not isinstance(env, dict):
        return "no environment"
    diff = sorted(set(env.items()) ^ set(mine["env"].items()))
    return f"another environment ({', '.join(sorted({k for k, _ in diff}))[:200]})" if diff else ""


class Seed:
    """The job's handle on its seed process: started first, linked to each agent, ended last."""

    def __init__(self, warm: Sequence[str], env: Mapping[str, str] | None) -> None:
        self._ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __spec__.name, str(theirs.fileno()), json.dumps(list(warm))],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,  # the agents' own: a template in another environment is refused (``mismatch``)
                start_new_session=True,  # a notebook interrupt is not for it
            )
        except BaseException:
            self._ctl.close()
            raise
        finally:
            theirs.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def link(self) -> socket.socket:
        """A new link for one agent: the agent's end (to pass to it, then close here)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            socket.send_fds(self._ctl, [b'{"op": "link"}'], [theirs.fileno()])
        except OSError:  # it is gone: the agent's template finds the link dead, and warms up alone
            pass
        finally:
            theirs.close()
        return ours

    def stop(self) -> None:
        """End it, after the agents (it ends its warm children left over: ``_end``)."""
        self._ctl.close()
        try:
            self.proc.wait(END_WAIT + 2.0)
        except subprocess.TimeoutExpired:  # still importing, or stopped: it has nothing to save
            self.proc.kill()
            self.proc.wait(5.0)


# -- the seed process ---------------------------------------------------------------------------------
class _Seeder:
    def __init__(self, ctl: socket.socket) -> None:
        from . import template

        self.template = template
        self.ctl = ctl
        self.links: dict[int, socket.socket] = {}  # fd -> link to an agent (and its templates)
        self.children: dict[int, socket.socket] = {}  # warm child pid -> the link that asked for it
        self.r, self.w = template.wake_pipe()
        self.mine = fingerprint()

    def serve(self) -> None:
        while True:
            watch = [self.r, self.ctl.fileno(), *self.links]
            try:
                ready, _, _ = select.select(watch, [], [])
            except InterruptedError:
                continue
            if self.r in ready:
                self._reap()
            if self.ctl.fileno() in ready:
                self._from_job()
            for fd in ready:
                link = self.links.get(fd)
                if link is not None:
                    self._from_template(link)

    def _from_job(self) -> None:
        msg, fds = recv(self.ctl)
        if msg is None:  # the job ended (its agents first), or its program died: so do its hosts
            self._end()
            os._exit(0)
        for fd in fds:
            self.links[fd] = socket.socket(fileno=fd)

    def _end(self) -> None:
        """End the warm children: each ends with its template, its procs' groups first (``leave`` in
        ``template.py``), and is given ``END_WAIT`` for it (if the job's program died, its agents are ending
        the templates meanwhile); a stopped one is resumed. Then what is left is killed. Killed at once,
        they took their procs along (PR_SET_PDEATHSIG) before anyone ended those groups."""
        for pid in self.children:
            kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + END_WAIT
        while self.children and deadline > time.monotonic():
            select.select([self.r], [], [], max(0.0, deadline - time.monotonic()))  # (SIGCHLD writes to it)
            self._reap()
        for pid in self.children:  # (its agent stopped, say)
            kill(pid, signal.SIGKILL)

    def _from_template(self, link: socket.socket) -> None:
        msg, fds = recv(link)
        if msg is None:  # its agent and templates are gone: so is their host
            del self.links[link.fileno()]
            for pid, lk in list(self.children.items()):
                if lk is link:  # each sees its template's end and ends, with its procs' groups (a SIGKILL
                    # would leave those); a stopped one would never see it: resumed (reaped all the same,
                    # reported to nobody)
                    kill(pid, signal.SIGCONT)
                    del self.children[pid]
            link.close()
            return
        if not isinstance(msg, dict) or msg.get("op") != "warm" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return
        hand = socket.socket(fileno=fds[0])
        why = mismatch(self.mine, msg.get("fingerprint"))
        if why:
            send_or_ignore(link, {"op": "refused", "why": why})
            hand.close()
            return
        pid = os.fork()
        if pid == 0:
            self._become_warm_child(hand)
        hand.close()
        self.children[pid] = link
        send_or_ignore(link, {"op": "forked", "pid": pid})

    def _become_warm_child(self, hand: socket.socket) -> None:
        signal.set_wakeup_fd(-1)  # (the server sets its own; the seed's pipe is closed here)
        os.close(self.r)
        os.close(self.w)
        self.ctl.close()
        for link in self.links.values():
            link.close()
        # a proc forked by it returns through here (SystemExit, to finalize as at a normal exit)
        self.template.serve_from_seed(hand)
        os._exit(0)

    def _reap(self) -> None:
        try:
            while os.read(self.r, 512):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            link = self.children.pop(pid, None)
            if link is not None:
                code = os.waitstatus_to_exitcode(status)
                send_or_ignore(link, {"op": "exit", "pid": pid, "code": code})


def end_for_dead_controller(pid: int) -> None:
    """Run by an agent whose controller died (``kill -9``): end the job's seed (``pid``), which a stop
    would otherwise keep from reading its control socket's EOF for ever. Only a process that still is
    a seed leading its own session is killed, not whatever took over a reused pid."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = b"\0" + f.read()
    except OSError:
        return  # gone already
    if f"\0-m\0{__spec__.name}\0".encode() in cmdline and leads_own_session(pid):
        kill(pid, signal.SIGKILL)


def main() -> None:
    ctl = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ended by its job (EOF), or killed
    from . import template

    errors = template.preload(json.loads(sys.argv[2]), if_installed=True)
    if errors:  # each warm child imports what failed again, and reports it to its agent
        print("jupyter-mesh seed: warm import failed: " + "; ".join(errors), file=sys.stderr)
    template.base_imports()
    try:
        _Seeder(ctl).serve()
    except OSError as e:  # pragma: no cover - nothing to serve any more
        if e.errno not in (errno.EBADF, errno.EPIPE):
            raise
    os._exit(0)


if __name__ == "__main__":
    main()
