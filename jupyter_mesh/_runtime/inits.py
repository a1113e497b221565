"""Actor constructors that take long: shown while they run, failed when they overrun ``init_timeout``.

``ProcMesh.spawn`` returns before any ``__init__`` has run. While one runs, its rank's state carries a
note ("initializing 'trainer' (42 s)") and calls to the actor wait behind it. An ``__init__`` that never
returns would otherwise leave the rank busy forever with no fault; with a time limit
(``spawn(..., init_timeout=s)`` or ``JUPYTER_MESH_INIT_TIMEOUT``) the ranks still constructing are
failed with a ``Failure`` of kind ``init`` and their procs killed: a thread stuck in ``__init__``
cannot be taken back, and a killed proc can be respawned. There is no limit by default: constructors
legitimately load checkpoints or wait for peers for many minutes, and the note shows how long.
The controller owns one ``Inits``.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Protocol

from .._wire import protocol
from ..errors import Failure, MeshValueError

if TYPE_CHECKING:
    from .._core.future import Future
    from .._core.refs import ActorMeshRef
    from .._core.state import StateTracker
    from .client import Client
    from .records import MeshRecords

__all__ = ["ENV", "Inits", "init_timeout"]

ENV = "JUPYTER_MESH_INIT_TIMEOUT"
REFRESH = 5.0  # seconds between two refreshes of the "initializing (N s)" notes in live views
_ticker_lock = threading.Lock()


def init_timeout(given: float | None) -> float | None:
    """The limit for one spawn: ``given``, else the environment's, else none (also for ``inf``)."""
    if given is None:
        raw = os.environ.get(ENV, "").strip()
        if not raw or raw.lower() in ("none", "inf"):
            return None
        try:
            given = float(raw)
        except ValueError:
            raise MeshValueError(f"{ENV}={raw!r} is not a number of seconds; unset it for no limit") from None
    if isinstance(given, bool) or not isinstance(given, (int, float)) or not given > 0:
        raise MeshValueError(f"init_timeout must be a positive number of seconds (or None), got {given!r}")
    return None if math.isinf(given) else float(given)


class InitsHost(Protocol):
    """What the constructor watch needs of the controller."""

    state: StateTracker
    client: Client
    meshes: MeshRecords

    @property
    def is_closed(self) -> bool: ...

    def proc_exit(self, mesh_id: str, rank: int, failure: Failure) -> None: ...


class Inits:
    """The controller's watch over actor constructors (one per controller)."""

    def __init__(self, host: InitsHost):
        self.host = host
        self._init_ticker: threading.Thread | None = None  # refreshes the notes while a constructor runs

    def watch_init(self, mesh: ActorMeshRef, fut: Future[None], timeout: float | None) -> None:
        """Show the constructors of ``mesh`` as running until ``fut`` (its spawn) completes; fail the
        ranks still constructing after ``timeout`` seconds."""
        mesh_id, ranks, name, key = mesh._ref.mesh_id, mesh._shape.ranks(), mesh._name, mesh._actor_id
        self.host.state.initializing(mesh_id, ranks, key, name)
        with _ticker_lock:
            if self._init_ticker is None:
                self._init_ticker = threading.Thread(target=self._tick_inits, name="jupyter-mesh-inits", daemon=True)
                self._init_ticker.start()
        fut.add_done_callback(lambda _f: self.host.state.initializing(mesh_id, ranks, key, done=True))
        if timeout is None:
            return
        timer = threading.Timer(timeout, self._init_overdue, (mesh, fut, timeout))
        timer.daemon = True
        timer.name = f"jupyter-mesh-init-timeout-{name}"
        timer.start()
        fut.add_done_callback(lambda _f: timer.cancel())

    def _tick_inits(self) -> None:
        """Widgets redraw on events only: while constructors run, say every few seconds how long."""
        while not self.host.is_closed:
            time.sleep(REFRESH)
            with _ticker_lock:
                if not self.host.state.refresh_inits():
                    self._init_ticker = None
                    return

    def constructed(self, mesh_id: str, ranks: list[int], actor_id: str) -> None:
        """From the client, as each rank's constructor answers (its spawn may still wait for others)."""
        self.host.state.initializing(mesh_id, ranks, actor_id, done=True)

    def _init_overdue(self, mesh: ActorMeshRef, fut: Future[None], timeout: float) -> None:
        """On a timer thread: fail (as ``init``) and kill the ranks whose ``__init__`` is still running."""
        ref = mesh._ref
        rec = self.host.meshes.get(ref.mesh_id)
        ranks = self.host.client.constructing(fut)
        if rec is None or rec.stopped or not ranks:
            return
        for r in ranks:  # recorded before the kill: the proc's death is then this failure, not a signal
            pid = rec.pids.get(r)
            detail = (
                f"__init__ of {mesh._class_name} (actor mesh '{mesh._name}') did not return within {timeout:g} s; "
                f"its proc {pid} was killed. Respawn the rank (ProcMesh.respawn) once the constructor can "
                "finish, or give a larger init_timeout"
            )
            self.host.proc_exit(ref.mesh_id, r, Failure(ref.name, ref.coords(r), "init", detail))
        for r in ranks:
            try:
                self.host.client.request(
                    ref.agent_addrs[ref.rank_host[r]],
                    protocol.kill_proc(ref.mesh_id, r, int(signal.SIGKILL)),
                    what=f"kill of rank {r} (its __init__ overran)",
                )
            except Exception:  # noqa: BLE001 - closing down: the agent kills its procs anyway
                return
