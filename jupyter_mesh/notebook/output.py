"""Worker output in the notebook: which cell gets it, folding across ranks, flood control, the log store.

The controller calls :meth:`OutputRouter.sink` on its receive thread with each batch of lines a proc
wrote. The sink only stores and enqueues; a thread of its own does the rest, so a flood never delays
replies. Rules:

* Output belongs to the cell whose execution caused it: a rank's lines go to the cell that last sent
  it a call or broadcast (:meth:`OutputRouter.sent`), even once that cell finished (ipykernel writes
  into an earlier cell's output area when a message carries that cell's parent header). A rank no
  cell called yet (an actor's ``__init__`` printing as a spawn starts) prints into the running cell;
  between cells such lines are only kept for ``%mesh logs``.
* Before a cell shows its result, and before it ends, it waits (:meth:`OutputRouter.barrier`, at most
  a second) until the ranks it called confirm that their output so far has arrived: a marker each
  proc prints after it (``OUT_SYNC``), so prints come before the ``ValueMesh`` they led to.
* Identical lines from several ranks within ``window`` seconds fold into one: ``[gpus 0-3] loss 0.42``.
* A cell shows at most ``cell_lines`` lines (and lines of at most ``line_chars`` characters); past that
  it says how many it held back. The controller keeps the lines for ``ProcMesh.logs()`` / ``%mesh logs``.
"""

from __future__ import annotations

import collections
import itertools
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._wire.protocol import OUT_SYNC_PREFIX
from ..errors import fold_coords

__all__ = ["LogLine", "OutputRouter", "fold_label", "group_by_rank", "parse_label"]

Publish = Callable[[Any, str, str], None]
"""(parent header of the cell or None, "stdout" | "stderr", text) -> None"""

SYNC_PREFIX = OUT_SYNC_PREFIX


@dataclass(frozen=True)
class LogLine:
    t: float
    mesh: str
    rank: int
    label: str
    fd: int
    text: str


def parse_label(label: str) -> dict[str, int]:
    """``hosts=0,gpus=1`` -> ``{"hosts": 0, "gpus": 1}`` (empty for a 0-dim mesh)."""
    out: dict[str, int] = {}
    for part in label.split(","):
        k, sep, v = part.partition("=")
        if sep and v.lstrip("-").isdigit():
            out[k] = int(v)
    return out


def fold_label(labels: list[str]) -> str:
    """One prefix for the ranks that printed the same line: ``gpus 0-3``, ``hosts=1 gpus=2``
    (:func:`~jupyter_mesh.errors.fold_coords` of their coordinates)."""
    if len(labels) > 1 and not parse_label(labels[0]):
        return f"{len(labels)} ranks"
    return fold_coords([parse_label(lb) for lb in labels]) if labels else "rank 0"


@dataclass(eq=False)
class _Cell:
    parent: Any
    collect: bool = False  # --no-stream: hold lines, show them grouped by rank at the end
    shown: int = 0
    held_back: int = 0
    collected: list[LogLine] = field(default_factory=list)
    called: dict[str, set[int]] = field(default_factory=dict)  # mesh id -> ranks it sent calls to


SyncOutput = Callable[[str, list[int], str], int]
"""(mesh id, ranks, token) -> how many procs were asked to print the token's markers"""


class OutputRouter:
    """Routes worker lines to the running cell, folds them and limits floods."""

    def __init__(
        self,
        publish: Publish,
        *,
        window: float = 0.05,
        cell_lines: int = 2000,
        line_chars: int = 2000,
    ):
        self._publish = publish
        self.sync_output: SyncOutput | None = None  # set by the kernel's front (lowlevel.sync_output)
        self.window, self.cell_lines, self.line_chars = window, cell_lines, line_chars
        self._owner: dict[tuple[str, int], _Cell] = {}  # (mesh name, rank) -> the cell that last called it
        self._meshes: list[str] = []  # names seen, in order: the prefix names the mesh once there are several
        self._queue: collections.deque[tuple[_Cell, LogLine]] = collections.deque()
        self._cond = threading.Condition()
        self._cell: _Cell | None = None
        self._flush_req = 0
        self._flush_done = 0
        self._syncs: dict[str, list[Any]] = {}  # token -> [remaining markers, Event]
        self._notices: list[str] = []  # said while no cell ran: shown in the next one
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="jupyter-mesh-output", daemon=True)
        self._thread.start()

    # -- the calling thread ----------------------------------------------------------------------
    def sent(self, mesh_id: str, mesh: str, ranks: list[int]) -> None:  # (proc mesh id and name)
        """A call or broadcast went to ``ranks`` (on the thread that sent it): their output is the
        running cell's from now on, until another cell calls them."""
        cell = self._cell
        if cell is None:
            return  # sent between cells (a sidebar action): the rank keeps its cell
        self._owner.update(zip(zip(itertools.repeat(mesh), ranks), itertools.repeat(cell)))  # no Python per rank
        cell.called.setdefault(mesh_id, set()).update(ranks)

    # -- receive thread ------------------------------------------------------------------------
    def sink(self, mesh: str, rank: int, label: str, fd: int, lines: list[str]) -> None:
        now = time.time()
        if mesh not in self._meshes:
            self._meshes.append(mesh)
        batch, tokens = [], []
        for text in lines:
            if SYNC_PREFIX in text:  # the sync line may end a line the user left unterminated
                text, _, token = text.partition(SYNC_PREFIX)
                tokens.append(token)
                if not text:
                    continue
            batch.append(LogLine(now, mesh, rank, label, fd, text))
        cell = self._owner.get((mesh, rank)) or self._cell
        if batch and cell is not None:  # nobody's: only the controller's log keeps it
            with self._cond:
                self._queue.extend((cell, ln) for ln in batch)
                self._cond.notify()
        for token in tokens:  # after the lines before them are queued: a flush then includes them
            self._sync_seen(token)

    def _sync_seen(self, token: str) -> None:
        with self._cond:
            st = self._syncs.get(token)
            if st is None:
                return
            st[0] -= 1
            if st[0] <= 0:
                st[1].set()

    # -- the kernel's side -----------------------------------------------------------------------
    def begin_cell(self, parent: Any) -> None:
        """A cell starts: output from now on is shown in it."""
        with self._cond:
            self._cell = _Cell(parent)
            notices, self._notices = self._notices, []
        for text in notices:
            self._publish(parent, "stderr", text)

    def notify(self, text: str) -> None:
        """A message for the user (a failure nobody waited on): in the running cell, else the next."""
        with self._cond:
            cell = self._cell
            if cell is None:
                self._notices.append(text)
                return
        self._publish(cell.parent, "stderr", text)

    def end_cell(self, timeout: float = 2.0) -> None:
        """The cell finished: show what its ranks printed so far (before the kernel reports idle),
        then detach. Their later lines still go to it."""
        self.barrier()
        self.flush(timeout)
        with self._cond:
            cell, self._cell = self._cell, None
        if cell is not None and cell.held_back:
            self._publish(
                cell.parent,
                "stderr",
                f"[jupyter_mesh] {cell.held_back} more worker lines not shown here; "
                "`%mesh logs --tail 100` shows the latest ones\n",
            )

    def set_collect(self, collect: bool) -> None:
        """``%%mesh --no-stream``: hold this cell's worker lines until :meth:`take_collected`."""
        with self._cond:
            if self._cell is not None:
                self._cell.collect = collect

    def take_collected(self) -> list[LogLine]:
        self.flush()
        with self._cond:
            if self._cell is None:
                return []
            out, self._cell.collected = self._cell.collected, []
            self._cell.collect = False
            return out

    def publish(self, name: str, text: str) -> None:
        """Write into the running cell (used for grouped output)."""
        cell = self._cell
        self._publish(cell.parent if cell else None, name, text)

    def expect_sync(self, token: str, markers: int) -> threading.Event:
        """Wait handle for ``markers`` sync lines carrying ``token`` (procs print them when a
        ``%%mesh`` cell ends there, so the cell can wait until their output has arrived)."""
        ev = threading.Event()
        with self._cond:
            self._syncs[token] = [markers, ev]
        return ev

    def forget_sync(self, token: str) -> None:
        with self._cond:
            self._syncs.pop(token, None)

    def barrier(self, timeout: float = 1.0) -> None:
        """Return once what the ranks this cell called printed so far is shown (or ``timeout``
        passed: a proc busy in native code holding its GIL cannot answer; its lines come later)."""
        cell, sync = self._cell, self.sync_output
        if cell is None or sync is None or not cell.called or threading.current_thread() is self._thread:
            return
        token = uuid.uuid4().hex
        done = self.expect_sync(token, 0)
        asked = 0
        try:
            for mesh_id, ranks in list(cell.called.items()):
                asked += sync(mesh_id, sorted(ranks), token)
            with self._cond:
                st = self._syncs[token]
                st[0] += 2 * asked  # markers on stdout and stderr; some may have come already
                if st[0] <= 0:
                    done.set()
                else:  # set by a marker that came before the count was known
                    done.clear()
            done.wait(timeout)
        finally:
            self.forget_sync(token)
        self.flush(timeout)

    def flush(self, timeout: float = 2.0) -> None:
        """Return once every line received so far has been published (or ``timeout`` passed)."""
        if threading.current_thread() is self._thread:
            return
        with self._cond:
            self._flush_req += 1
            want = self._flush_req
            self._cond.notify()
            self._cond.wait_for(lambda: self._flush_done >= want or self._closed, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(2.0)

    # -- the output thread ---------------------------------------------------------------------
    def _run(self) -> None:
        pending: list[tuple[_Cell, LogLine]] = []
        first = 0.0
        while True:
            with self._cond:
                while not self._queue and not self._closed and self._flush_req == self._flush_done:
                    wait = None if not pending else max(0.0, first + self.window - time.monotonic())
                    if wait == 0.0:
                        break
                    self._cond.wait(wait)
                if self._closed:
                    return
                if self._queue and not pending:
                    first = time.monotonic()
                pending.extend(self._queue)
                self._queue.clear()
                flush_to = self._flush_req
            if pending and (flush_to != self._flush_done or time.monotonic() >= first + self.window):
                by_cell: dict[_Cell, list[LogLine]] = {}
                for cell, ln in pending:
                    by_cell.setdefault(cell, []).append(ln)
                for cell, lines in by_cell.items():
                    try:
                        self._emit(cell, lines)
                    except Exception as e:  # noqa: BLE001 - never let the output thread die
                        print(f"jupyter_mesh: output routing failed: {e!r}", file=sys.__stderr__)
                pending = []
            if flush_to != self._flush_done:
                with self._cond:
                    self._flush_done = flush_to
                    self._cond.notify_all()

    def _emit(self, cell: _Cell, lines: list[LogLine]) -> None:
        if cell.collect:
            cell.collected.extend(lines)
            return
        room = self.cell_lines - cell.shown
        if room <= 0:
            cell.held_back += len(lines)
            return
        out: dict[int, list[str]] = {1: [], 2: []}
        for fd, prefix, text in self._fold(lines):
            out[fd].append(f"[{prefix}] {text}")
        for fd, name in ((1, "stdout"), (2, "stderr")):
            rows = out[fd]
            if not rows:
                continue
            room = self.cell_lines - cell.shown
            if len(rows) > room:
                cell.held_back += len(rows) - room
                rows = rows[:room]
                rows.append(
                    f"[jupyter_mesh] output truncated after {self.cell_lines} lines in this cell "
                    "(the rest is kept: `%mesh logs`)"
                )
            cell.shown += len(rows)
            self._publish(cell.parent, name, "".join(self._cut(r) + "\n" for r in rows))

    def _cut(self, row: str) -> str:
        if len(row) <= self.line_chars:
            return row
        return row[: self.line_chars] + f"... [{len(row) - self.line_chars} more characters]"

    def _fold(self, lines: list[LogLine]) -> list[tuple[int, str, str]]:
        """Group identical lines of different ranks; a rank's n-th repeat of a line joins the others'
        n-th repeat, so each rank's lines keep their order."""
        groups: dict[tuple[str, int, str, int], list[LogLine]] = {}
        seen: dict[tuple[str, int, str, int], int] = collections.defaultdict(int)
        for ln in lines:
            k = (ln.mesh, ln.fd, ln.text, ln.rank)
            n = seen[k]
            seen[k] = n + 1
            groups.setdefault((ln.mesh, ln.fd, ln.text, n), []).append(ln)
        several = len(self._meshes) > 1
        out = []
        for (mesh, fd, text, _n), members in groups.items():
            prefix = fold_label([m.label for m in members])
            out.append((fd, f"{mesh} {prefix}" if several else prefix, text))
        return out


def group_by_rank(lines: list[LogLine]) -> str:
    """``--no-stream``: each rank's lines under one heading; ranks with the same lines share it."""
    by_rank: dict[tuple[str, int], list[LogLine]] = {}
    for ln in lines:
        by_rank.setdefault((ln.mesh, ln.rank), []).append(ln)
    same: dict[tuple[str, ...], list[str]] = {}
    for members in by_rank.values():
        body = tuple(("! " if m.fd == 2 else "") + m.text for m in members)
        same.setdefault(body, []).append(members[0].label)
    out = []
    for body, labels in same.items():
        out.append(f"--- [{fold_label(labels)}] ---\n")
        out.extend(line + "\n" for line in body)
    return "".join(out)
