"""How a cancel reaches the call an actor runs (or skips one still queued), and what a call cut by the
proc's SIGTERM answers. A part of ``actor_host.ActorHost`` (a base class of it), which sets the state
read here in its ``__init__``.

A cancel of the running call interrupts it where it is: an async endpoint's task is cancelled; a sync
endpoint on the proc's main thread gets the cancel signal, which ends even a blocking call; one on a
thread of its own gets ``KeyboardInterrupt`` at its next Python instruction (later, while the runtime is
in a critical stretch or an import).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol

from .._wire.protocol import BROKEN, NO_REPLY, Kind
from .._wire.serialize import dumps
from .._wire.transport import Message, Transport
from ..errors import Failure
from . import cancel_signal, interrupts

__all__ = ["ActorCancels"]


class _Runtime(Protocol):
    """What cancelling needs of the proc's runtime (``actor_host.ProcSide`` has all of it)."""

    transport: Transport
    mesh_name: str
    rank: int
    coords: dict[str, int]

    def hold_cut(self, answer: Callable[[], None]) -> None: ...
    def reply(self, h: dict[str, Any], ok: int, payload: bytes, bufs: list[Any]) -> None: ...


class ActorCancels:
    """Cancels of an actor's calls; ``ActorHost`` sets the fields below."""

    runtime: _Runtime
    name: str
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    on_main: bool
    closing: bool
    _lock: threading.Lock
    _current: tuple[str, int] | None
    _stopping: tuple[str, int] | None
    _task: asyncio.Task[Any] | None
    _cancelled: set[tuple[str, int]]
    _started: dict[str, int]
    _interrupted: bool

    def cancel(self, sender: str, call_id: int) -> None:
        """From the receive thread: stop call ``(sender, call_id)`` if it runs, skip it if queued."""
        key = (sender, call_id)
        with self._lock:
            if self._current != key:
                # a sender's call ids grow in the order its calls run here: at or below the last one
                # started, this call already ran (its cancel came late), so there is nothing to skip
                if call_id > self._started.get(sender, 0):
                    self._cancelled.add(key)  # skipped when it comes up: nothing of it will run
                done = True
            else:
                done = False
                self._stopping = key  # acknowledged when it ends (``_leave``)
                self._interrupt()
        if done:
            self._ack_cancel(key)

    def cancelling(self) -> bool:
        """Is a cancel aimed at the running call (or the proc stopping)? Its KeyboardInterrupt is then ours."""
        with self._lock:
            return self.closing or (self._stopping is not None and self._stopping == self._current)

    def _interrupt(self) -> None:
        """Stop the call that runs now (caller holds ``_lock``)."""
        if self._task is not None:
            self.loop.call_soon_threadsafe(self._task.cancel)
        elif self.on_main:  # a sync endpoint on the main thread: a signal ends even a blocking call
            self._interrupted = True
            signal.pthread_kill(self.thread.ident or 0, cancel_signal.CANCEL_SIGNAL)
        else:  # a sync endpoint on its own thread: KeyboardInterrupt at its next Python instruction
            self._interrupted = True
            self._raise_in_thread()

    def _raise_in_thread(self) -> None:
        """KeyboardInterrupt in this actor's own thread, unless it is in a critical stretch of the
        runtime or inside an import right now: then a moment later (caller holds ``_lock``)."""
        ident = self.thread.ident or 0
        if not self._interrupted:
            return
        if interrupts.held_by(ident) or cancel_signal.importing(sys._current_frames().get(ident)):
            cancel_signal.retry_later(self._retry_raise)
            return
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))

    def _retry_raise(self) -> None:
        with self._lock:
            self._raise_in_thread()

    def _ack_cancel(self, key: tuple[str, int]) -> None:
        """Tell the canceller that this rank no longer works on its call (it waits to report that)."""
        try:
            self.runtime.transport.send(key[0], Message({"k": Kind.CANCELLED, "i": key[1], "rk": self.runtime.rank}))
        except Exception:  # noqa: BLE001 - the canceller is gone: nobody to tell
            pass

    def _cut_by_sigterm(self, h: dict[str, Any]) -> None:
        if h["rm"] == NO_REPLY:
            return
        rt = self.runtime
        failure = Failure(
            rt.mesh_name,
            rt.coords,
            "signal",
            f"proc {os.getpid()} got SIGTERM during {self.name}.{h['ep']} and has not exited since (its exit "
            "handlers or an actor's __cleanup__ still run)",
            signal=signal.SIGTERM,
            rank=rt.rank,
        )
        rt.hold_cut(lambda: rt.reply(h, BROKEN, dumps(failure)[0], []))
