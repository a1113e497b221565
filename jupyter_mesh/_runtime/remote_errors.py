"""A remote exception as data: what the caller needs to show it like a local one (type, message, the
traceback as text and as frames, the exception itself when it pickles). Built in the proc at raise
time, so the text is right even when the exception class does not exist on the caller's side."""

from __future__ import annotations

import traceback
from typing import Any

from .._wire.serialize import dumps

__all__ = ["error_info", "safe_str"]


def error_info(e: BaseException, endpoint: str, skip_frames: int = 1) -> dict[str, Any]:
    tb = e.__traceback__
    for _ in range(skip_frames):  # start the traceback at the user's code, not our dispatcher
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(e), e, tb))
        tail = "".join(traceback.format_exception_only(type(e), e))
    except BaseException:  # noqa: BLE001 - an exception that cannot even be formatted
        text = tail = f"{type(e).__qualname__}: {safe_str(e)}\n"
    frames = [(f.filename, f.lineno, f.name, f.line or "") for f in traceback.extract_tb(tb)]
    try:
        exc_bytes: bytes | None = dumps(e)[0]
    except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
        exc_bytes = None
    return {
        "type": type(e).__qualname__,
        "msg": safe_str(e),
        "tb": text,
        "exc": exc_bytes,
        "endpoint": endpoint,
        "frames": frames,
        "tail": tail,
    }


def safe_str(e: BaseException) -> str:
    try:
        return str(e)
    except BaseException:  # noqa: BLE001 - an exception whose __str__ raises
        return f"<{type(e).__qualname__}: str() failed>"
