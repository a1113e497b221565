"""``breakpoint()`` in a proc: a pdb whose terminal is the controller.

``install`` points ``sys.breakpointhook`` and ``pdb.set_trace`` here. The pdb runs on the thread that
called it (an actor's), so only that actor stops: the proc's receive thread goes on answering pings,
cancels and other actors' mail. Each time pdb wants a line it sends what it printed (its prompt
last) to the controller as a ``debug`` event and waits for a ``debug_in`` line, which the receive
thread hands over (``deliver``). Events go through the agent, like the proc's output.

A debugger's life on the wire: ``paused`` (where) -> the controller answers with source lines it
has that the proc may lack (notebook cells) -> ``out`` at every prompt -> ``resumed`` when pdb lets
the actor run on (``c``, ``n`` until its next stop, ``q``). A cancel of the call (the notebook's
interrupt) ends the pause with KeyboardInterrupt in the endpoint, as it would end a running call.
"""

from __future__ import annotations

import asyncio
import bdb
import io
import itertools
import linecache
import os
import pdb
import queue
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import IO, Any, cast

from .._core.context import context
from .._wire.protocol import OK, Kind, reply_header
from .._wire.serialize import dumps
from .._wire.transport import Message, Transport

__all__ = ["RemotePdb", "deliver", "install", "post_mortem"]

SOURCE_WAIT_S = 10.0  # how long a pause waits for the controller to take it (with source lines)
OUT_MAX = 32_000  # characters of pdb output in one event; beyond that its start is left out
SKIP = ["jupyter_mesh.*", "asyncio.*", "threading"]  # modules pdb never stops in
_POLL_S = 0.25  # a paused actor thread wakes this often, so a cancel (an async exception) can reach it

_send: Callable[[dict[str, Any]], None] | None = None
_sessions: dict[str, queue.SimpleQueue[dict[str, Any]]] = {}  # sid -> lines for that paused pdb
_ids = itertools.count(1)
_post_mortem = False  # an endpoint that raises stops in pdb at the raise, before its error is sent


def install(send: Callable[[dict[str, Any]], None]) -> None:
    """In a proc: ``breakpoint()`` and ``pdb.set_trace()`` pause the calling actor for the controller.
    ``send(header)`` sends a ``debug`` event to the controller (the proc adds mesh and rank)."""
    global _send
    _send = send
    sys.breakpointhook = breakpointhook
    pdb.set_trace = set_trace


def deliver(header: dict[str, Any], transport: Transport) -> None:
    """From the receive thread: a ``debug_in`` for a paused debugger (ignored if it is not paused),
    or (``pm``, no ``sid``) post-mortem debugging on or off, acknowledged: calls sent after the
    answer find it set (they may reach the actor another way than this message did)."""
    global _post_mortem
    if "pm" in header and "sid" not in header:
        _post_mortem = bool(header["pm"])
        if "i" in header and "s" in header:
            transport.send(header["s"], Message(reply_header(header["i"], OK), dumps(_post_mortem)[0]))
        return
    inbox = _sessions.get(str(header.get("sid")))
    if inbox is not None:
        inbox.put(header)


def breakpointhook(*args: Any, **kwargs: Any) -> None:
    if os.environ.get("PYTHONBREAKPOINT") == "0":
        return
    set_trace(sys._getframe(1))


def set_trace(frame: FrameType | None = None, *, header: str | None = None) -> None:
    """``pdb.set_trace`` in a proc: pause this actor for the controller's debugger."""
    dbg: pdb.Pdb = RemotePdb(_send) if _send is not None else pdb.Pdb()  # not installed: the ordinary pdb
    if header is not None:
        dbg.message(header)
    dbg.set_trace(frame or sys._getframe(1))


def post_mortem(e: BaseException) -> None:
    """On the actor's thread, an endpoint raised ``e``: if post-mortem debugging is on, stop in pdb
    where it was raised until the user continues (the caller gets the error after that)."""
    if not _post_mortem or _send is None or isinstance(e, (KeyboardInterrupt, asyncio.CancelledError, bdb.BdbQuit)):
        return
    tb = e.__traceback__
    if tb is None:
        return
    dbg = RemotePdb(_send, post_mortem=True)
    dbg.message(f"post-mortem: {type(e).__name__}: {e}")
    dbg.reset()
    try:
        dbg.interaction(None, tb)
    except KeyboardInterrupt:  # a cancel of the call (its reply is the error already caught)
        pass


class _Output(io.TextIOBase):
    """pdb's stdout: kept until pdb asks for a line, then sent with its prompt."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)

    def take(self) -> str:
        out, self.parts = "".join(self.parts), []
        if len(out) > OUT_MAX:  # one control message stays small (the smallest frame limit is 64 KiB)
            cut = len(out) - OUT_MAX
            out = f"[{cut} characters of pdb output left out]\n" + out[cut:]
        return out


class _Input(io.TextIOBase):
    """pdb's stdin: each line asked for sends the output so far and waits for the controller's line."""

    def __init__(self, dbg: RemotePdb):
        self.dbg = dbg

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return self.dbg.next_line()


class RemotePdb(pdb.Pdb):
    """A pdb on an actor's thread whose terminal is the controller (see the module's docstring)."""

    def __init__(self, send: Callable[[dict[str, Any]], None], post_mortem: bool = False):
        self._send = send
        self._pm = post_mortem
        self._out = _Output()
        self.sid = f"{os.getpid()}-{next(_ids)}"
        host = context().actor.host
        self.actor_name = str(getattr(host, "name", "") or threading.current_thread().name)
        self._inbox: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._early: list[dict[str, Any]] = []  # lines that came while the pause waited for sources
        # no SIGINT handler of its own (the proc's signals are the runtime's), no ~/.pdbrc
        # and no stops in the runtime's frames: stepping out of an endpoint goes on to the next user code
        super().__init__(
            stdin=cast(IO[str], _Input(self)), stdout=cast(IO[str], self._out), skip=SKIP, nosigint=True, readrc=False
        )
        self.use_rawinput = False

    def _event(self, ev: str, **extra: Any) -> None:
        try:
            self._send({"k": Kind.DEBUG, "sid": self.sid, "ev": ev, "an": self.actor_name, **extra})
        except Exception:  # noqa: BLE001 - the controller is gone: the lifeline ends this proc
            pass

    def interaction(self, frame: FrameType | None, traceback: Any) -> None:
        if frame is None and traceback is not None:  # post-mortem: where it raised
            last = traceback
            while last.tb_next is not None:
                last = last.tb_next
            where = f"{last.tb_frame.f_code.co_filename}:{last.tb_lineno}"
        else:
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
        _sessions[self.sid] = self._inbox
        left = False  # pdb returned to the program (not a cancel's KeyboardInterrupt out of it)
        try:
            self._event("paused", where=where, pm=self._pm)
            if self._wait_for_sources():
                super().interaction(frame, traceback)
            else:  # nobody took the pause: better run on than stop for good
                print(
                    f"jupyter_mesh: {self.actor_name} reached a breakpoint at {where}, but no controller answered "
                    f"within {SOURCE_WAIT_S:g} s; it runs on",
                    file=sys.stderr,
                )
                self.set_continue()
            left = True
        finally:
            _sessions.pop(self.sid, None)
            # ``n``, ``s``, ``r``, ``until``: it will stop again soon, as the same debugger
            stepping = left and not self._pm and not self.quitting and self.stoplineno != -1
            self._event("resumed", out=self._out.take(), step=stepping)

    def _cmdloop(self) -> None:
        # pdb's own loop turns KeyboardInterrupt into a new prompt; here it is a cancel of the call:
        # it leaves pdb (and the trace function) and ends the endpoint like any cancelled call
        self.allow_kbdint = True
        self.cmdloop()
        self.allow_kbdint = False

    def _wait_for_sources(self) -> bool:
        """Source lines the controller has and this proc may not (code defined in a notebook cell),
        so listings show them. The controller answers every pause this way: False if it did not
        within SOURCE_WAIT_S (it does not know this proc's mesh)."""
        try:
            while True:
                item = self._inbox.get(timeout=SOURCE_WAIT_S)
                if "src" not in item:
                    self._early.append(item)
                    continue
                for filename, lines in (item.get("src") or {}).items():
                    if isinstance(lines, list) and not linecache.getlines(filename):
                        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
                return True
        except queue.Empty:
            return False

    def next_line(self) -> str:
        """pdb's next command: send what it printed (ending in its prompt) and wait for the answer."""
        self._event("out", out=self._out.take())
        while True:
            if self._early:
                item = self._early.pop(0)
            else:
                try:
                    item = self._inbox.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
            if "line" in item:
                return str(item["line"]).rstrip("\n") + "\n"
