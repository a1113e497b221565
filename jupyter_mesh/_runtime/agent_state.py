"""What a host agent knows about its procs, meshes and gathers, and the OS helpers it uses on them.

Plain data and functions; the agent (``agent.py``) owns the threads and the messages.
"""

from __future__ import annotations

import collections
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from .._core.context import host_key
from .._core.shape import Shape
from .._wire.channels import max_frame
from .._wire.protocol import VERSION, Kind
from .liveness import Liveness

__all__ = ["Gather", "HostedMesh", "ProcEntry", "alive", "describe_exit", "hello", "kill", "read_lines"]


@dataclass
class ProcEntry:
    mesh_id: str
    rank: int
    label: str
    pid: int = 0
    addr: str = ""
    alive: bool = True
    up: bool = False
    stopping: bool = False
    killed_by_user: bool = False
    last_seen: float = 0.0
    liveness: Liveness = field(default_factory=Liveness)  # busy or hung, once it stops answering
    fds: list[int] = field(default_factory=list)
    actor_tids: set[int] = field(default_factory=set)  # threads that run endpoints (liveness looks at them)
    exit_code: int | None = None
    exit_signal: int | None = None
    exit_cause: str = ""  # why it was killed, when not by itself (its fork server died)
    # its death as reported (failure kind, detail), set before ``alive`` turns False: a call relayed to
    # it later, before the caller heard of the death, fails with the same cause (``relay._broken``)
    ended: tuple[str, str] | None = None
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=30))


@dataclass
class HostedMesh:
    mesh_id: str
    name: str
    shape: Shape
    ranks: list[int]
    spawn_cfg: dict[str, Any] = field(default_factory=dict)  # the spawn_procs request: env, preload, paths
    waiters: list[tuple[tuple[str, int], set[int]]] = field(default_factory=list)  # start requests pending
    stop_replies: list[tuple[tuple[str, int], set[int] | None]] = field(default_factory=list)


@dataclass
class Gather:
    mesh_id: str
    sender: str  # where the gathered reply goes (the caller's reply box, or its inbox, or our parent agent)
    call_id: int
    outstanding: set[int]
    entries: list[tuple[int, int, Any, list[Any]]] = field(default_factory=list)
    children: set[str] = field(default_factory=set)  # agents below us in the cast's tree, not heard from yet
    up: str = ""  # in a tree, not at its top: our address, for the parent's gather (``to`` is the caller)
    caller: str = ""
    op: Any = None  # a reduce: the header's ``rd``
    endpoint: str = ""  # what was called (named in an error the gather itself makes)
    partials: list[tuple[int, Any, list[Any]]] = field(default_factory=list)  # (ok, payload, bufs) from below
    folded: list[int] = field(default_factory=list)  # the ranks those partials hold
    refused: str = ""  # why its reduce function's fold did not start (``fn_folds``: every slot taken)


def hello(cfg: dict[str, Any], addr: str, refused: str = "", **more: Any) -> dict[str, Any]:
    """``agent_up``: its keys never change between versions, so a controller of another version can
    read it and refuse this agent by name."""
    h = {
        "k": Kind.AGENT_UP,
        "v": VERSION,
        "h": cfg.get("host_index", 0),
        "addr": addr,
        "pid": os.getpid(),
        "hk": host_key(),
        "mf": max_frame(),  # the largest frame its TCP sockets take: the controller's must be the same
        "nonce": cfg.get("nonce", ""),
        **more,
    }
    if refused:
        h["refused"] = refused
    return h


def describe_exit(p: ProcEntry, code: int | None = None, sig: int | None = None) -> str:
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"was killed by {name}"
    if code is not None:
        return f"exited with code {code}"
    return "exited"


def kill(pid: int, sig: int) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def leads_own_session(pid: int) -> bool:
    """Does ``pid`` lead a session of its own (a seed, a seeded warm child: both ``setsid``)? Checked
    before killing a process that is not our child, so that a pid reused since it died is spared."""
    try:
        return os.getsid(pid) == pid
    except OSError:
        return False


def alive(pid: int) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def read_lines(fd: int, buf: bytearray) -> tuple[list[str], bool, bool]:
    """Read a proc's non-blocking output pipe: (complete lines, EOF, read anything?).

    A partial line waits in ``buf`` until its newline, 64 KiB, or EOF."""
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        return [], False, False
    except OSError:
        chunk = b""
    if chunk:
        buf += chunk
        cut = buf.rfind(b"\n")
        if cut < 0 and len(buf) < 1 << 16:
            return [], False, True
        end = cut + 1 if cut >= 0 else len(buf)
        text = bytes(buf[:end])
        del buf[:end]
        return text.decode(errors="replace").splitlines(), False, True
    text = bytes(buf)
    buf.clear()
    return text.decode(errors="replace").splitlines(), True, True
