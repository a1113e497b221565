"""What an interrupt reports: a cancelled call's ranks acknowledge when they stopped (``cancelled``
messages from the procs), the interrupted caller waits a moment for them, then says where the call
stopped, how fast, and which ranks still run (native code that ignores signals) — and a second
interrupt while it waits (not a bounce: ``DEBOUNCE`` after the first) kills those procs, so ■ ■
always stops the work."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import MeshInterrupted, fold_coords
from . import interrupts

if TYPE_CHECKING:
    from .pending import Pending

__all__ = ["ACK_WAIT", "DEBOUNCE", "CancelAcks", "report", "spawn_interrupted"]

ACK_WAIT = 2.0  # seconds an interrupted caller waits for its ranks to say they stopped
DEBOUNCE = 0.3  # a second Ctrl-C sooner than this after the first is a bounce (or a storm), not a request


class CancelAcks:
    """Ranks of interrupted calls that have not said they stopped yet (only calls someone waits on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left: dict[int, tuple[set[int], threading.Event]] = {}

    def expect(self, call_id: int, ranks: list[int]) -> None:
        with self._lock:
            self._left[call_id] = (set(ranks), threading.Event())

    def acked(self, call_id: int, rank: int) -> None:
        """From the receive thread: ``rank`` stopped working on ``call_id`` (or had not started it)."""
        with self._lock:
            entry = self._left.get(call_id)
            if entry is None:
                return
            entry[0].discard(rank)
            if not entry[0]:
                entry[1].set()

    def wait(
        self, call_id: int, timeout: float, interrupted: Callable[[], bool], pressed: bool = True
    ) -> tuple[set[int], bool]:
        """Wait up to ``timeout`` for the ranks to stop, then forget the call: (ranks still running,
        whether the caller interrupted again meanwhile — a bounce within ``DEBOUNCE`` does not count).
        ``pressed=False``: no interrupt asked for the cancel (a timeout did), so the first one that
        comes meanwhile is the caller's first, not a second."""
        with self._lock:
            entry = self._left.get(call_id)
        start = time.monotonic()
        first = start if pressed else None  # when the first interrupt came
        again = False
        try:
            while entry is not None and entry[0]:
                now = time.monotonic()
                if now - start >= timeout:
                    break
                entry[1].wait(min(0.05, timeout - (now - start)))  # slices: a second Ctrl-C is only recorded
                if not interrupted():
                    continue
                if first is None:
                    first = time.monotonic()  # what it asks for (the cancel) is under way already
                elif time.monotonic() - first >= DEBOUNCE and entry[0]:
                    again = True
                    break
        finally:
            with self._lock:
                entry = self._left.pop(call_id, None)
        return (set(entry[0]) if entry else set()), again


def report(
    p: Pending,
    cancel: Callable[[], object],
    acks: CancelAcks,
    dead: Callable[[int], bool],
    kill: Callable[[list[int]], list[int]] | None,
    pressed: bool = True,
) -> MeshInterrupted:
    """Cancel ``p``, wait for its ranks to stop, and describe the outcome as the error to raise
    (``pressed=False``: the cancel is a timeout's, and no interrupt has come yet)."""
    ranks = sorted(p.outstanding)
    what = f"{p.actor}.{p.endpoint}"
    if not ranks:  # every rank had answered: the wait was on this process (a reduce function's fold)
        cancel()
        stuck = (
            f"; folding their results with the reduce op {p.reduce} had not ended, and goes on: a Python thread "
            "cannot be stopped (one that never returns keeps its thread until this process ends)"
            if p.reduce
            else ""
        )
        return MeshInterrupted(f"Interrupted: stopped waiting for {what}: every rank had answered already{stuck}")
    coords = {r: (p.ref.coords(r) if p.ref else {}) for r in ranks}
    t0 = time.monotonic()
    # Ctrl-C is held while we report (a storm of them must not break the cancel half-way); a second
    # one while we wait for the ranks is read from the hold, and kills what still runs
    held = interrupts.hold()
    killed: list[int] = []
    try:
        acks.expect(p.call_id, ranks)
        cancel()
        left, again = acks.wait(p.call_id, ACK_WAIT, interrupts.take if held else lambda: False, pressed)
        if again and kill is not None:
            killed = kill([r for r in sorted(left) if not dead(r)])
    finally:
        if held:
            interrupts.take()  # consumed here: the MeshInterrupted we return is the interrupt
            interrupts.release()
    left = {r for r in left if not dead(r) and r not in killed}
    took = time.monotonic() - t0
    where = _ranks(coords, ranks)
    if killed:
        return MeshInterrupted(
            f"Interrupted: cancelled {what} on {where}; interrupted again, so the procs of "
            f"{_ranks(coords, killed)} were killed. Respawn them with procs.respawn() or %mesh respawn."
        )
    if not left:
        return MeshInterrupted(f"Interrupted: cancelled {what} on {where}; all stopped in {took:.2f} s")
    return MeshInterrupted(
        f"Interrupted: cancelled {what} on {where}; {len(ranks) - len(left)} stopped, but "
        f"{_ranks(coords, sorted(left))} still run after {took:.1f} s (native code that ignores signals, an "
        "async endpoint blocked in sync code, or an actor with its own thread): their next calls wait behind it. To stop them, kill those procs "
        "(procs.kill(rank) / %mesh kill RANK) and respawn them; next time, a second interrupt "
        f"{DEBOUNCE:g}-{ACK_WAIT:g} s after the first does that.",
        [coords[r] for r in sorted(left)],
    )


def spawn_interrupted(p: Pending, lock: threading.Lock) -> MeshInterrupted:
    """Ctrl-C in a spawn's ``initialized.get()``: a constructor is not cancelled, so the wait stops and
    the spawn goes on (its future stays pending: a later ``get()`` waits again). Says which still run."""
    with lock:  # the receive thread takes ranks out as their constructors answer
        left = sorted(p.outstanding)
    coords = {r: (p.ref.coords(r) if p.ref else {}) for r in p.ranks}
    where = f"Interrupted: stopped waiting for the constructors of '{p.actor}' on {_ranks(coords, p.ranks)}"
    if not left:
        return MeshInterrupted(f"{where}; all had finished: its `.initialized.get()` gives their outcome.")
    return MeshInterrupted(
        f"{where}; {len(p.ranks) - len(left)} finished, {_ranks(coords, left)} still run (a constructor is not "
        f"cancelled; calls to '{p.actor}' wait behind it). Its `.initialized.get()` waits for them again; to "
        "stop them, kill those procs (procs.kill(rank) / %mesh kill RANK) and respawn them.",
        [coords[r] for r in left],
    )


def _ranks(coords: dict[int, dict[str, int]], ranks: list[int]) -> str:
    """``4 ranks (gpus 0-3)``, ``1 rank (gpus=2)``."""
    return f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''} ({fold_coords([coords.get(r, {}) for r in ranks])})"
