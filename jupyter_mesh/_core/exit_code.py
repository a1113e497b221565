"""The exit code a program ends with when jupyter_mesh decides it: 1 for an unhandled failure it never
looked at (fail fast). The controller's atexit handler sets it; the process ends with it once every
atexit handler ran, also those registered before jupyter_mesh was imported (``logging``'s, the
program's own: atexit runs the latest first, so a handler of ours ending the process would skip them).
That is while the interpreter tears its modules down, after it flushed stdout and stderr: an object
kept here ends the process when it is dropped."""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

__all__ = ["exit_at_end"]

_code: int | None = None
_at_teardown: Any = None


class _ExitWhenDropped:
    """Ends the process with ``code`` when the interpreter drops it (tearing this module down)."""

    def __init__(self, code: int):
        self.code, self._exit, self._streams = code, os._exit, (sys.stdout, sys.stderr)

    def __del__(self) -> None:
        for stream in self._streams:
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing more to say there
                pass
        self._exit(self.code)


def exit_at_end(code: int) -> None:
    """The program exits with ``code`` once the other atexit handlers ran."""
    global _code
    _code = code


def _exit_last() -> None:
    global _at_teardown
    if _code is not None:
        _at_teardown = _ExitWhenDropped(_code)  # atexit handlers registered before ours run after it


atexit.register(_exit_last)
