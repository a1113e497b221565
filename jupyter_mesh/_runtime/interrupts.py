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

__all__ = ["held", "hold", "release", "take"]

_MAIN = threading.main_thread().ident
_SIGINT = 2
_previous: Any = None
_caught = False


def _record(signum: int, frame: Any) -> None:
    global _caught
    _caught = True


def held() -> bool:
    """Is SIGINT held now, on this thread (the main one)?"""
    return threading.get_ident() == _MAIN and _signal.getsignal(_SIGINT) is _record


def hold() -> bool:
    """Start holding SIGINT if this is the main thread (and not held already); True if it did."""
    global _previous
    if threading.get_ident() != _MAIN:
        return False
    previous = _signal.getsignal(_SIGINT)
    if previous is _record or not callable(previous):
        return False  # nested, or SIGINT ignored / not handled by Python: nothing to hold
    _previous = previous
    _signal.signal(_SIGINT, _record)
    return True


def release() -> None:
    """Stop holding; deliver a SIGINT that came meanwhile (the old handler usually raises).
    Idempotent: a second call only puts the same handler back."""
    global _caught
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
