"""Ranks a failed or cancelled run left behind in native code, and new procs for them.

When a worker dies, torchrun's agent tears the whole worker group down. On a mesh the other ranks of
a failed run mostly stop by themselves at once (gloo: "Connection closed by peer"), but a rank that
waits for a rank that is gone in the rendezvous (``init_process_group``) sits in native code until
gloo's 30-minute timeout, where no interrupt reaches it, and every later call to its actor queues
behind it. :func:`busy_ranks` finds such ranks (a free ``SPMDActor`` answers a probe at once) and
:func:`restart_ranks` gives them new procs, their actors re-created, as torchrun would.
"""

from __future__ import annotations

import itertools
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._api.mesh import ActorMesh
from .._api.proc_mesh import ProcMesh
from .._core.future import Future, time_left
from .._core.state import MeshEvent, ProcState
from ..errors import MeshError, MeshTimeoutError, fold_coords

if TYPE_CHECKING:
    from .actor import SPMDActor

__all__ = ["GRACE", "busy_ranks", "describe", "note", "restart_ranks"]

GRACE = 2.0  # seconds a rank may take to answer the probe (a run that just ended still cleans up)


def _points(mesh: ActorMesh[Any] | ProcMesh) -> list[dict[str, int]]:
    """The coordinates of every member, in rank order (index i of the view is the i-th)."""
    sizes = mesh.sizes
    return [dict(zip(sizes, combo)) for combo in itertools.product(*(range(n) for n in sizes.values()))]


def busy_ranks(actors: ActorMesh[SPMDActor], grace: float = GRACE) -> list[int]:
    """Indices (in the mesh's view) of ranks whose actor is still busy after ``grace`` seconds."""
    probes: list[Future[bool]] = [actors.slice(**p).ready.call_one() for p in _points(actors)]
    deadline = time.monotonic() + grace
    busy = []
    for i, probe in enumerate(probes):
        try:
            probe.get(time_left(deadline))
        except MeshTimeoutError:
            busy.append(i)
            probe.cancel()  # skipped when the actor comes to it (if its proc lives on)
        except MeshError:  # a dead rank is not busy: the run's own error says so
            pass
    return busy


def restart_ranks(proc_mesh: ProcMesh, ranks: Sequence[int], timeout: float = 15.0) -> list[int]:
    """Kill the procs of ``ranks`` (indices in ``proc_mesh``'s view) and respawn them; returns the
    global ranks respawned. Their actors are re-created; anything else they held is gone."""
    global_ranks = list(proc_mesh.pids())
    wanted = {global_ranks[i] for i in ranks}
    failed: set[int] = set()
    seen = threading.Event()

    def on_event(ev: MeshEvent) -> None:  # on the runtime's thread: only note it
        if ev.kind == "failed" and ev.rank in wanted:
            failed.add(ev.rank)
            if failed >= wanted:
                seen.set()

    unsubscribe = proc_mesh.subscribe(on_event)
    try:
        for i in ranks:
            try:
                proc_mesh.kill(i, signal.SIGKILL)
            except MeshError:  # gone meanwhile: respawn covers it
                pass
        already = {r.rank for r in proc_mesh.state().ranks if r.state == ProcState.FAILED}
        failed.update(already & wanted)
        if not failed >= wanted:
            seen.wait(timeout)  # a killed proc is seen when its pipe closes (ms)
    finally:
        unsubscribe()
    return proc_mesh.respawn([i for i in ranks if global_ranks[i] in failed])


def describe(mesh: ActorMesh[Any] | ProcMesh, ranks: Sequence[int]) -> str:
    """``ranks gpus 0,1,3`` for indices in the mesh's view."""
    points = _points(mesh)
    return f"rank{'s' if len(ranks) != 1 else ''} {fold_coords([points[i] for i in ranks])}"


def note(text: str) -> None:
    """A line for the person running the program (a notebook shows it in the running cell)."""
    print(f"jupyter_mesh.spmd: {text}", file=sys.stderr, flush=True)
