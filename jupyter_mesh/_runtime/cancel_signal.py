"""Cancelling a sync endpoint of the proc's first actor, which runs on the proc's main thread: a signal
aimed at that thread makes a blocking call there (sleep, select, sockets, lock waits) return EINTR
and run our handler, which raises ``KeyboardInterrupt`` if that call is still the one cancelled (the
flag is cleared when a call ends, so a late signal does nothing). Only the main thread runs Python
signal handlers, hence only the first actor gets this; the others get an asynchronous exception.

Never inside an import (the module would stay half-initialized: a half-imported torch breaks the proc)
nor inside a critical stretch of the runtime (a sequence number would be lost): then it retries 20 ms
later.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Protocol

from . import interrupts

__all__ = ["CANCEL_SIGNAL", "Cancellable", "importing", "install", "retry_later", "set_main_actor"]

CANCEL_SIGNAL = signal.SIGUSR2
RETRY = 0.02  # seconds


class Cancellable(Protocol):
    _interrupted: bool  # a cancel is aimed at the call running now
    thread: threading.Thread


_main_actor: Cancellable | None = None


def install() -> None:
    """From the main thread, at start: handle the cancel signal."""
    signal.signal(CANCEL_SIGNAL, _on_cancel_signal)


def set_main_actor(host: Cancellable) -> None:
    """``host`` is the actor that runs on the main thread: the one the signal cancels."""
    global _main_actor
    _main_actor = host


def _on_cancel_signal(signum: int, frame: Any) -> None:
    host = _main_actor
    if host is None or not host._interrupted:
        return
    if interrupts.held() or importing(frame):
        retry_later(_resignal, host)
        return
    host._interrupted = False
    raise KeyboardInterrupt


def _resignal(host: Cancellable) -> None:
    if host._interrupted:
        signal.pthread_kill(host.thread.ident or 0, CANCEL_SIGNAL)


def retry_later(fn: Any, *args: Any) -> None:
    t = threading.Timer(RETRY, fn, args)
    t.daemon = True
    t.start()


def importing(frame: Any) -> bool:
    """Is ``frame`` (or a caller of it) inside the import machinery?"""
    depth = 0
    while frame is not None and depth < 400:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame, depth = frame.f_back, depth + 1
    return False
