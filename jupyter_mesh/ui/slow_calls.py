"""Long calls: which ranks have not answered a call waited on for long, and where each of them is.

Once the calls out on a mesh have run longer than ``slow_call_after`` seconds (``jupyter_mesh.config``,
default 10; 0 turns it off), each rank left is located: *paused at file:line* when it is in the
debugger, else the innermost frame of user code in its stack (``ProcMesh.stacks``, asked of the proc's
receive thread: a rank stuck in a collective answers), or why it did not answer. One :class:`Waits`
per process keeps the answer per mesh and asks again at most every ``REFRESH`` seconds, so the cell
waiting on the call and the views (widget, sidebar) share one look at the ranks.
"""

from __future__ import annotations

import linecache
import threading
import time

from .._core.state import MeshState, ProcState
from .wire import WaitWire, cell_names

__all__ = ["REFRESH", "Waits", "slow_after", "waits"]

REFRESH = 2.0  # seconds between two looks at the ranks of a long call
STACKS_WAIT = 2.0  # how long a rank may take to say where it is
MAX_LOCATED = 16  # ranks located per mesh (the first ones left): a long list says no more


def slow_after() -> float:
    """``slow_call_after`` now, in seconds (0: off)."""
    from ..config import get_global_config

    try:
        return max(0.0, float(get_global_config().get("slow_call_after") or 0))
    except (TypeError, ValueError):
        return 0.0


def _label(state: MeshState, rank: int) -> str:
    r = state.ranks[rank] if rank < len(state.ranks) else None
    return ",".join(f"{k}={v}" for k, v in r.coords.items()) if r is not None and r.coords else f"rank {rank}"


def _top_frame(threads: list[dict[str, object]]) -> str:
    """The innermost frame of user code (outside Python's library), of the thread that runs some ('' if
    none does)."""
    from .._runtime.stacks import _STDLIB, _ours, _short

    for t in sorted(threads, key=lambda t: (t.get("name") != "MainThread", str(t.get("name")))):
        if not t.get("user"):
            continue
        frames = [f for f in t.get("frames") or [] if isinstance(f, list) and not _ours(str(f[0]))]  # type: ignore[attr-defined]
        mine = [f for f in frames if not str(f[0]).startswith(_STDLIB)]  # the user's line, not threading's
        if frames:
            fn, line, func, src = (mine or frames)[-1]
            # a function defined in a notebook cell: its source is in this process's linecache, not the proc's
            src = src or linecache.getline(str(fn), int(line)).strip()[:200]
            return f"{_short(str(fn))}:{line} in {func}" + (f": {src}" if src else "")
    return ""


class Waits:
    """Where the ranks left of each mesh's long calls are, looked at most every ``refresh`` seconds."""

    def __init__(self, refresh: float = REFRESH):
        self.refresh = refresh
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, list[WaitWire]]] = {}  # mesh id -> (when, waits)

    def slow(self, state: MeshState) -> bool:
        after = slow_after()
        return state.progress is not None and after > 0 and state.progress.elapsed >= after and not state.stopped

    def cached(self, state: MeshState) -> list[WaitWire] | None:
        """What was seen last for this mesh's long calls (None: not slow, or not looked at yet)."""
        if not self.slow(state):
            return None
        with self._lock:
            seen = self._seen.get(state.mesh_id)
        if seen is None:
            return None
        left = set(state.progress.left) if state.progress else set()
        return [w for w in seen[1] if w["rank"] in left]

    def look(self, state: MeshState, force: bool = False) -> list[WaitWire] | None:
        """Locate the ranks left now (blocks up to ``STACKS_WAIT``), unless looked at within ``refresh``."""
        if not self.slow(state):
            with self._lock:
                self._seen.pop(state.mesh_id, None)
            return None
        with self._lock:
            seen = self._seen.get(state.mesh_id)
        if seen is not None and not force and time.monotonic() - seen[0] < self.refresh:
            return self.cached(state)
        assert state.progress is not None
        left = list(state.progress.left[:MAX_LOCATED])
        out: dict[int, str] = {}
        ask = []
        for r in left:
            rs = state.ranks[r] if r < len(state.ranks) else None
            if rs is not None and rs.state is ProcState.PAUSED:
                out[r] = rs.note or "paused in the debugger"
            elif rs is not None and rs.state in (ProcState.FAILED, ProcState.STOPPED):
                out[r] = f"{rs.state.value}: {rs.failure.detail if rs.failure else ''}".rstrip(": ")
            else:
                ask.append(r)
        if ask:
            from ..lowlevel import proc_mesh

            try:
                stacks = proc_mesh(state.mesh_id).stacks(ask, timeout=STACKS_WAIT)
                for rs in stacks.ranks:
                    out[rs.rank] = (
                        rs.error or _top_frame(rs.threads) or "no user code running (its reply is on the way)"
                    )
            except Exception as e:  # noqa: BLE001 - the mesh went meanwhile: say so, keep the view
                for r in ask:
                    out[r] = f"unknown ({type(e).__name__}: {e})"
        waits = [WaitWire(rank=r, label=_label(state, r), where=cell_names(out.get(r, ""))) for r in left]
        with self._lock:
            self._seen[state.mesh_id] = (time.monotonic(), waits)
        return waits


_waits: Waits | None = None
_waits_lock = threading.Lock()


def waits() -> Waits:
    """The process's one :class:`Waits` (the cell's view and the hub share it)."""
    global _waits
    with _waits_lock:
        if _waits is None:
            _waits = Waits()
        return _waits
