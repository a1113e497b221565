"""The exit code a program ends with when jupyter_mesh decides it: 1 for an unhandled failure it never
looked at (fail fast). The controller's atexit handler sets it; a handler registered when jupyter_mesh
is imported ends the process with it, so after the atexit handlers the program registered since, also
those registered before the controller started (atexit runs the latest first)."""

from __future__ import annotations

import atexit
import os
import sys

__all__ = ["exit_at_end"]

_code: int | None = None


def exit_at_end(code: int) -> None:
    """The program exits with ``code`` once the other atexit handlers ran."""
    global _code
    _code = code


def _exit_last() -> None:
    if _code is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_code)


atexit.register(_exit_last)
