"""A remote exception as data: what the caller needs to show it like a local one (type, message, the
traceback as text and as frames, the exception itself when it pickles), and the same for each exception
of its chain (``raise ... from e``, or raised while handling another). Built in the proc at raise time,
so the text is right even when the exception class does not exist on the caller's side; rebuilt on the
caller's side with the chain restored (pickling an exception drops ``__cause__`` and ``__context__``)."""

from __future__ import annotations

import linecache
import traceback
from types import TracebackType
from typing import Any

from .._wire.serialize import dumps, loads

__all__ = ["error_info", "exception_of", "render_traceback", "safe_str"]

MAX_CHAIN = 8  # links of a chain kept (a longer one is cut, said so in its text)
CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _link(e: BaseException, tb: TracebackType | None) -> dict[str, Any]:
    """One exception without its chain: type, message, frames, last line, and pickled if it pickles."""
    try:
        tail = "".join(traceback.format_exception_only(type(e), e))
    except BaseException:  # noqa: BLE001 - an exception that cannot even be formatted
        tail = f"{type(e).__qualname__}: {safe_str(e)}\n"
    try:
        exc_bytes: bytes | None = dumps(e)[0]
    except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
        exc_bytes = None
    return {
        "type": type(e).__qualname__,
        "msg": safe_str(e),
        "exc": exc_bytes,
        "frames": [(f.filename, f.lineno, f.name, f.line or "") for f in traceback.extract_tb(tb)],
        "tail": tail,
    }


def _chain(e: BaseException) -> list[dict[str, Any]]:
    """``e``'s causes and contexts, nearest first, each with how it relates to the one before it
    (``rel``: cause or context), as Python's own traceback printing walks them."""
    out: list[dict[str, Any]] = []
    seen = {id(e)}
    cur: BaseException | None = e
    while cur is not None and len(out) < MAX_CHAIN:
        if cur.__cause__ is not None:
            nxt, rel = cur.__cause__, "cause"
        elif cur.__context__ is not None and not cur.__suppress_context__:
            nxt, rel = cur.__context__, "context"
        else:
            break
        if id(nxt) in seen:
            break
        seen.add(id(nxt))
        out.append({**_link(nxt, nxt.__traceback__), "rel": rel})
        cur = nxt
    return out


def error_info(e: BaseException, endpoint: str, skip_frames: int = 1) -> dict[str, Any]:
    tb = e.__traceback__
    for _ in range(skip_frames):  # start the traceback at the user's code, not our dispatcher
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(e), e, tb))
    except BaseException:  # noqa: BLE001 - an exception that cannot even be formatted
        text = f"{type(e).__qualname__}: {safe_str(e)}\n"
    try:
        chain = _chain(e)
    except BaseException:  # noqa: BLE001 - the text above still has it
        chain = []
    return {**_link(e, tb), "tb": text, "endpoint": endpoint, "chain": chain}


def _render_link(link: dict[str, Any]) -> str:
    out = []
    if link.get("frames"):
        out.append("Traceback (most recent call last):\n")
        for filename, lineno, name, line in link["frames"]:
            out.append(f'  File "{filename}", line {lineno}, in {name}\n')
            line = line or linecache.getline(filename, lineno or 0).strip()
            if line:
                out.append(f"    {line}\n")
    out.append(link.get("tail") or f"{link['type']}: {link['msg']}\n")
    return "".join(out)


def render_traceback(info: dict[str, Any]) -> str:
    """Re-render the remote frames here, filling source lines from this process's linecache (code
    defined in a notebook cell exists only in the kernel's linecache, not on the worker), the chain
    first, as Python prints it."""
    if not info.get("frames"):
        return ""
    parts = []
    for link in reversed(info.get("chain") or []):
        parts.append(_render_link(link))
        parts.append(CAUSE if link.get("rel") == "cause" else CONTEXT)
    parts.append(_render_link(info))
    return "".join(parts)


def _load(blob: bytes | None) -> BaseException | None:
    if blob is None:
        return None
    try:
        e = loads(blob)
    except Exception:  # noqa: BLE001 - the class may not exist here; the text is enough
        return None
    return e if isinstance(e, BaseException) else None


def exception_of(info: dict[str, Any]) -> BaseException | None:
    """The remote exception itself, when it unpickles here, with its chain restored as far as those
    unpickle too (``__cause__`` / ``__context__``)."""
    top = _load(info.get("exc"))
    cur = top
    for link in info.get("chain") or []:
        if cur is None:
            break
        nxt = _load(link.get("exc"))
        if nxt is None:
            break
        if link.get("rel") == "cause":
            cur.__cause__ = nxt  # also sets __suppress_context__, as ``raise ... from`` does
        else:
            cur.__context__ = nxt
        cur = nxt
    return top


def safe_str(e: BaseException) -> str:
    try:
        return str(e)
    except BaseException:  # noqa: BLE001 - an exception whose __str__ raises
        return f"<{type(e).__qualname__}: str() failed>"
