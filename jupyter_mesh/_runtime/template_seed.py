"""A template's side of its job's seed (``seed.py``): the link its agent passes it, and the warm child
the seed forks for it instead of one of its own.

The agent takes the link from its environment (``take_seed_link``) and passes it to each template it
starts. The template asks the seed for a warm child (``SeedSide._ask_seed``); the seed forks one and
says so, and later how it ended, since the seed, not the template, is its parent. The template and its
seeded warm child watch each other through their socket: EOF, the other is gone.
"""

from __future__ import annotations

import os
import select
import socket
import stat
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from .packets import recv, send_or_ignore

__all__ = ["LINK_ENV", "SeedSide", "fingerprint", "seed_link", "seed_pid", "take_seed_link"]


LINK_ENV = "JUPYTER_MESH__SEED"
"""An agent's link to its job's seed (``seed.py``), ``FD:PID``; popped by ``agent_main``."""

_seed_link = ""
"""In an agent of a ``LocalJob`` of several hosts: its link to the job's seed (``seed.py``), passed to
every template it starts, as ``FD:PID`` (the seed's pid: the agent watches it for a stop); '' if none."""


def seed_link() -> str:
    """In an agent: its link to the job's seed, ``FD:PID``, to pass to a template; '' if none."""
    return _seed_link


def seed_pid() -> int:
    """In an agent: the pid of its job's seed (``seed.py``), 0 if none."""
    return int(_seed_link.split(":")[1]) if _seed_link else 0


def take_seed_link() -> None:
    """Adopt the seed link the job passed (``LINK_ENV``), and drop the name: procs must not see it."""
    global _seed_link
    value = os.environ.pop(LINK_ENV, "")
    try:
        fd, pid = (int(v) for v in value.split(":"))
        if not stat.S_ISSOCK(os.fstat(fd).st_mode) or pid <= 0:
            raise ValueError(value)
    except (ValueError, OSError):
        return  # none, or not ours: the template warms up alone
    _seed_link = f"{fd}:{pid}"


def fingerprint() -> dict[str, Any]:
    """What a warm child takes from the job's seed rather than its template, and must match (``seed.py``):
    the interpreter, import path, directory and environment (a module imported elsewhere is another one)."""
    return {"exe": sys.executable, "path": sys.path, "cwd": os.getcwd(), "env": dict(os.environ)}


class SeedSide:
    """The seed's part of a template's server (mixed into ``template._Server``, whose attributes these
    are): ask the seed for a warm child, hear from it, and end when the other side of that pair is gone."""

    sock: socket.socket  # to the agent
    warming: socket.socket | None
    warm_pid: int
    seed: socket.socket | None
    seed_pid: int
    seeded: bool
    handed: socket.socket | None
    hand: socket.socket | None
    seed_exits: dict[int, int]

    if TYPE_CHECKING:

        def _ending(self, code: int | None, when: str = "") -> None: ...
        def tell(self, obj: dict[str, Any], sock: socket.socket | None = None) -> None: ...
        def leave(self, code: int = 0) -> NoReturn: ...

    def _ask_seed(self) -> bool:
        """Ask the seed for a warm child (it answers on ``warming``: hello, or EOF if it cannot)."""
        if self.seed is None:
            return False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sent = send_or_ignore(self.seed, {"op": "warm", "fingerprint": fingerprint()}, [theirs.fileno()])
        theirs.close()
        if not sent:
            ours.close()
            self._drop_seed()
            return False
        self.warming, self.seeded, self.warm_pid = ours, True, self.seed_pid
        # the agent watches the seed for a stop while forks wait, until the child says hello
        self.tell({"op": "warming", "pid": self.seed_pid})
        return True

    def _drop_seed(self) -> None:
        if self.seed is not None:
            self.seed.close()
            self.seed = None

    def _from_seed(self) -> None:
        assert self.seed is not None
        msg, fds = recv(self.seed)
        for fd in fds:
            os.close(fd)
        if msg is None:  # gone; a request it had not answered ends in ``warming``'s EOF
            self._drop_seed()
        elif msg.get("op") == "forked":  # our warm child's pid, maybe before its hello: watch it, not the seed
            if self.seeded and self.warming is not None and self.warm_pid == self.seed_pid:
                self.warm_pid = int(msg["pid"])
                self.tell({"op": "warming", "pid": self.warm_pid})
        elif msg.get("op") == "exit":
            self.seed_exits[int(msg["pid"])] = int(msg["code"])
        elif msg.get("op") == "refused":
            print(f"jupyter-mesh template: the job's seed refused: {msg.get('why')}; warming up alone", file=sys.stderr)

    def _seed_exit(self, pid: int, timeout: float = 2.0) -> int | None:
        """The exit status of the seed's child ``pid``, which the seed reports once it reaped it."""
        import time

        deadline = time.monotonic() + timeout
        while pid not in self.seed_exits and self.seed is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.seed], [], [], left)[0]:
                break
            self._from_seed()
        return self.seed_exits.pop(pid, None)

    def _seeded_child_died(self) -> None:
        """The seeded warm child that forks for this host is gone (EOF): say how, and end, as when a
        warm child of our own dies."""
        assert self.handed is not None
        msg, fds = recv(self.handed)
        for fd in fds:
            os.close(fd)
        if msg is None:
            self._ending(self._seed_exit(self.warm_pid))
            self.leave()

    def _template_gone(self) -> None:
        """In a seeded warm child: the template died (its socket's EOF). A warm child of the template
        ends with it by PDEATHSIG (``die_with``); this one, the seed's child, ends here, and so do its
        procs and what they started."""
        assert self.hand is not None
        msg, fds = recv(self.hand)
        for fd in fds:
            os.close(fd)
        if msg is None:
            self.leave()
