"""Holding Ctrl-C for a few microseconds where an interrupt would corrupt the runtime's state.

A ``KeyboardInterrupt`` can be raised between any two bytecodes of the main thread, including just
after a socket call returned a reply (the reply is then lost: a future hangs) or just after a call was
sent (the sender then thinks it was not sent and reuses its sequence number: the actor waits forever
for the gap). ``hold()`` swaps the SIGINT handler for one that only records the signal; ``release()``
puts the old handler back and runs it if a signal came meanwhile, so the interrupt lands just after
the critical stretch. Off the main thread nothing is needed (Python runs signal handlers on the main
thread only). The C-level ``_signal`` functions are used: ``signal.signal`` wraps them in enum
conversions that cost ~3 us a call here, on every call of the latency path.
"""

from __future__ import annotations

import _signal
import threading
from typing import Any

__all__ = ["held", "held_by", "hold", "release", "take"]

_MAIN = threading.main_thread().ident
_SIGINT = 2
_previous: Any = None
_caught = False


def _note_interrupt(signum: int, frame: Any) -> None:
    global _caught
    _caught = True


def held() -> bool:
    """Is SIGINT held now, on this thread (the main one)?"""
    return threading.get_ident() == _MAIN and _signal.getsignal(_SIGINT) is _note_interrupt


_off_main: dict[int, int] = {}  # other threads in a critical stretch (depth): an async cancel waits


def held_by(ident: int) -> bool:
    """Is thread ``ident`` (not the main one) in a critical stretch? Asked before aiming an
    asynchronous exception at it (a proc's actor threads are cancelled that way)."""
    return _off_main.get(ident, 0) > 0


def hold() -> bool:
    """Start holding SIGINT if this is the main thread (and not held already); True if it did.
    Off the main thread it marks the stretch for ``held_by`` (and is True as well)."""
    global _previous
    me = threading.get_ident()
    if me != _MAIN:
        _off_main[me] = _off_main.get(me, 0) + 1
        return True
    previous = _signal.getsignal(_SIGINT)
    if previous is _note_interrupt or not callable(previous):
        return False  # nested, or SIGINT ignored / not handled by Python: nothing to hold
    _previous = previous
    _signal.signal(_SIGINT, _note_interrupt)
    return True


def release() -> None:
    """Stop holding; deliver a SIGINT that came meanwhile (the old handler usually raises).
    Idempotent: a second call only puts the same handler back."""
    global _caught
    me = threading.get_ident()
    if me != _MAIN:
        depth = _off_main.get(me, 0) - 1
        if depth > 0:
            _off_main[me] = depth
        else:
            _off_main.pop(me, None)
        return
    previous = _previous
    _signal.signal(_SIGINT, previous)
    if _caught:
        _caught = False
        previous(_SIGINT, None)


def take() -> bool:
    """While held: did a SIGINT come since the last look? The answer consumes it (``release`` will
    not deliver it): for code that handles a second Ctrl-C itself."""
    global _caught
    caught, _caught = _caught, False
    return caught
