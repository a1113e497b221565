"""Remote errors shown in a cell like native tracebacks: remote frames first, with rank and actor.

``ActorError`` and ``SupervisionError`` carry the remote side as data (``failures``); here that becomes
a structured traceback (a list of ANSI strings, what IPython shows for any exception): one block per
distinct remote traceback, naming every rank that raised it, then the cell's own frames, then one
summary line. Installed with ``shell.set_custom_exc`` so the runtime's error classes stay free of
any notion of IPython.
"""

from __future__ import annotations

import asyncio
import os
import types
from typing import Any

from .._core.future import INTERRUPTED
from ..errors import ActorError, SupervisionError, format_coords
from .output import SYNC_PREFIX

__all__ = ["install", "remote_blocks"]

_RED, _CYAN, _BOLD, _RESET = "\x1b[0;31m", "\x1b[0;36m", "\x1b[1m", "\x1b[0m"

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_ASYNCIO_DIR = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep

_HINT = {
    ActorError: "The actors are still alive: fix the input or the endpoint and call again.",
}


def _rule(title: str) -> str:
    return f"{_CYAN}{'-' * 8} {title} {'-' * max(4, 70 - len(title))}{_RESET}"


def _ranks(coords_list: list[Any]) -> str:
    shown = "; ".join(format_coords(c) for c in coords_list[:8])
    more = f" (+{len(coords_list) - 8} more)" if len(coords_list) > 8 else ""
    return f"[{shown}{more}]"


def remote_blocks(e: BaseException) -> list[str]:
    """The remote part: identical tracebacks from several ranks appear once, naming all of them."""
    blocks: list[str] = []
    if isinstance(e, ActorError):
        folded: dict[str, list[Any]] = {}
        for f in e.failures:
            text = f.traceback.rstrip() or f"{f.exc_type}: {f.message}"
            folded.setdefault(text, []).append(f)
        for text, fs in folded.items():
            where = f"{fs[0].actor}.{fs[0].endpoint} on {_ranks([f.coords for f in fs])}"
            blocks.append(_rule(f"remote traceback: {where}") + "\n" + text)
    elif isinstance(e, SupervisionError):
        lines = [f"  {f.describe(phrase=False)}  ({f.kind})" for f in e.failures[:16]]
        if len(e.failures) > 16:
            lines.append(f"  ... and {len(e.failures) - 16} more")
        head = f"mesh '{e.failures[0].mesh}': {len(e.failures)} rank(s) failed" + (f" {e.context}" if e.context else "")
        blocks.append(_rule(head) + "\n" + "\n".join(lines))
        tails: dict[tuple[str, str], list[Any]] = {}
        for sf in e.failures:
            tail = "\n".join(ln for ln in sf.traceback.rstrip().splitlines() if SYNC_PREFIX not in ln)
            if tail.strip():  # an actor's own failure carries its traceback; a proc's, its last output
                what = f"remote traceback: {sf.actor}" if sf.actor else "last output"
                tails.setdefault((what, tail), []).append(sf.coords)
        for (what, text), coords in tails.items():
            blocks.append(_rule(f"{what} of {_ranks(coords)}") + "\n" + text)
    return blocks


def _summary(e: BaseException) -> str:
    if isinstance(e, ActorError):
        first = e.failures[0]
        what = f"{first.exc_type}: {first.message}" if first.message else first.exc_type
        of = f" of {e.total}" if e.total else ""
        where = f"{first.actor}.{first.endpoint} on {len(e.failures)}{of} rank(s)"
        return f"{_RED}{_BOLD}ActorError{_RESET}: {what} (raised in {where})\n{_HINT[ActorError]}"
    assert isinstance(e, SupervisionError)
    last = str(e).rstrip().splitlines()[-1]  # "What to do: ..."
    return f"{_RED}{_BOLD}SupervisionError{_RESET}: {len(e.failures)} rank(s) of mesh '{e.failures[0].mesh}' failed\n{last}"


def _user_frames(tb: types.TracebackType | None, stop: tuple[str, ...] = (_PACKAGE_DIR,)) -> types.TracebackType | None:
    """The traceback up to where it enters jupyter_mesh (or ``stop``): our internals are no help to the user."""
    kept = []
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(stop):
        kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _handler(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> list[str]:
    local = shell.InteractiveTB.structured_traceback(etype, value, _user_frames(tb), tb_offset=tb_offset)
    # IPython's last entry is "ExcType: str(value)", which repeats the remote traceback: replace it
    frames = local[:-1] if len(local) > 1 else []
    stb = [*remote_blocks(value), _rule("local traceback (the cell that waited)"), *frames, _summary(value)]
    shell._showtraceback(etype, value, stb)
    return stb


def _interrupted_await(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None) -> list[str]:
    """A cell cancelled by Ctrl-C / ■ while it awaited something other than a mesh call (those say
    more: ``MeshInterrupted``): the cell's own frames and one line, not asyncio's internals."""
    user = _user_frames(tb, (_PACKAGE_DIR, _ASYNCIO_DIR))
    local = shell.InteractiveTB.structured_traceback(etype, value, user, tb_offset=tb_offset)
    frames = local[:-1] if len(local) > 1 else []
    stb = [*frames, f"{_RED}{_BOLD}Interrupted{_RESET}: the cell was cancelled while it awaited"]
    shell._showtraceback(etype, value, stb)
    return stb


def _dispatch(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> list[str]:
    if isinstance(value, asyncio.CancelledError):
        if value.args != (INTERRUPTED,):  # someone else's cancel: IPython's usual traceback
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return []
        return _interrupted_await(shell, etype, value, tb, tb_offset)
    return _handler(shell, etype, value, tb, tb_offset)


def install(shell: Any) -> None:
    shell.set_custom_exc((ActorError, SupervisionError, asyncio.CancelledError), _dispatch)
