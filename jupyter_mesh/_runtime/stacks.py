"""Where every rank is right now: the Python stack of each thread, folded across ranks.

A proc answers a ``STACKS`` request from its receive thread, not from the actor's: an actor stuck in a
collective, a data loader or a deadlock is exactly what this is for, so its own thread cannot be asked.
``sys._current_frames()`` gives each thread's frame without stopping it. A thread holding the GIL in
native code for long keeps the receive thread from running: that rank does not answer, and the report
says so (``py-spy dump --native --pid N`` sees native frames; we do not require it).

Runtime threads that only wait (the receive thread, an idle actor waiting for mail, ZeroMQ's) are left
out unless asked for; identical stacks of several ranks are printed once (``ranks 0-6: ...``).
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._core.future import time_left
from .._wire.protocol import Kind
from ..errors import MeshError, MeshTimeoutError

if TYPE_CHECKING:
    from .._core.refs import ProcMeshRef
    from .client import Client
    from .records import MeshRecord

__all__ = ["RankStacks", "Stacks", "ask_stacks", "thread_stacks"]

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../jupyter_mesh
_STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
MAX_FRAMES = 60  # per thread, innermost kept: a deep recursion must not make the reply huge


def _ours(filename: str) -> bool:
    return filename.startswith(_PKG) or f"{os.sep}zmq{os.sep}" in filename


def thread_stacks() -> list[dict[str, Any]]:
    """This process's threads, each ``{"name", "id", "frames": [[file, line, function, source], ...],
    "user": bool}`` (outermost frame first); ``user``: some frame is neither our runtime's nor Python's."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # the thread answering this request
        frames: list[list[Any]] = []
        f: Any = frame
        while f is not None and len(frames) < MAX_FRAMES:
            code = f.f_code
            src = linecache.getline(code.co_filename, f.f_lineno, f.f_globals).strip()
            frames.append([code.co_filename, f.f_lineno, code.co_name, src[:200]])
            f = f.f_back
        frames.reverse()
        user = any(not (_ours(fn) or fn.startswith(_STDLIB) or fn.startswith("<frozen")) for fn, *_ in frames)
        out.append({"name": names.get(ident, f"thread {ident}"), "id": ident, "frames": frames, "user": user})
    return out


@dataclass
class RankStacks:
    rank: int
    coords: str
    threads: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""  # why this rank did not answer


@dataclass
class Stacks:
    """The stacks of a mesh's ranks; ``str()`` folds identical ones."""

    mesh: str
    ranks: list[RankStacks]
    all_threads: bool = False

    def _groups(self) -> list[tuple[list[RankStacks], str]]:
        by_text: dict[str, list[RankStacks]] = {}
        for r in self.ranks:
            by_text.setdefault(self._render(r), []).append(r)
        return [(rs, text) for text, rs in by_text.items()]

    def _render(self, r: RankStacks) -> str:
        if r.error:
            return f"    {r.error}\n"
        shown = [t for t in r.threads if self.all_threads or t["user"]]
        if not shown:
            return "    idle: no thread runs user code (waiting for calls)\n"
        lines = []
        for t in sorted(shown, key=lambda t: str(t["name"])):
            lines.append(f"    thread {t['name']}:\n")
            for fn, ln, func, src in t["frames"]:
                if not self.all_threads and _ours(fn):
                    continue  # our runtime's frames say nothing about where the user's code is
                lines.append(f"      {_short(fn)}:{ln} in {func}\n" + (f"        {src}\n" if src else ""))
        return "".join(lines)

    def __str__(self) -> str:
        parts = [f"stacks of '{self.mesh}' ({len(self.ranks)} ranks):\n"]
        for rs, text in self._groups():
            parts.append(f"  {_ranks_label(rs)}:\n{text}")
        return "".join(parts).rstrip("\n")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def ask_stacks(
    client: Client, ref: ProcMeshRef, rec: MeshRecord, ranks: list[int], timeout: float, all_threads: bool
) -> Stacks:
    """The controller's side: every thread's stack on ``ranks`` now, asked of each proc's receive thread
    at once; a rank that failed, or does not answer within ``timeout``, says why instead."""
    asked = {}
    for r in ranks:
        if r in rec.failures or not ref.proc_addrs[r]:
            continue
        asked[r] = client.request(ref.proc_addrs[r], {"k": Kind.STACKS}, what=f"stacks of rank {r}")
    deadline = time.monotonic() + timeout
    out = []
    for r in ranks:
        label = ",".join(f"{k}={v}" for k, v in ref.coords(r).items())
        fut = asked.get(r)
        if fut is None:
            f = rec.failures.get(r)
            out.append(RankStacks(r, label, error=f"failed: {f.detail if f else 'not running'}"))
            continue
        try:
            out.append(RankStacks(r, label, list(fut.get(time_left(deadline)))))
        except MeshTimeoutError:
            pid = rec.pids.get(r)
            out.append(
                RankStacks(
                    r,
                    label,
                    error=f"no answer within {timeout:g} s: proc {pid} holds the GIL (native code?) or is "
                    f"stopped; `py-spy dump --native --pid {pid}` on its host shows where",
                )
            )
        except MeshError as e:
            out.append(RankStacks(r, label, error=f"no answer: {e}"))
    return Stacks(ref.name, out, all_threads)


def _short(path: str) -> str:
    """A path as a person reads it: relative to the working directory when under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _ranks_label(rs: list[RankStacks]) -> str:
    ranks = sorted(r.rank for r in rs)
    if len(ranks) == 1:
        return f"rank {ranks[0]} ({rs[0].coords})"
    spans, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:]:
        if r != prev + 1:
            spans.append(f"{start}-{prev}" if prev > start else str(start))
            start = r
        prev = r
    spans.append(f"{start}-{prev}" if prev > start else str(start))
    return f"ranks {','.join(spans)}"
