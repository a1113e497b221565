"""The client's one call table: its calls in flight and what it knows of ranks (failed, stopped, moved,
their sequence numbers), under one lock; and the hooks a controller plugs into its client.

``outcomes.Outcomes`` (replies become values or errors) and ``supervision.Supervision`` (ranks break,
move or stop) both act on this table; ``client.Client`` sends calls and owns all three. Before, the
three were one class through mixins that shared private attributes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import Failure
from .pending import PendingTable

if TYPE_CHECKING:
    from .._core.refs import ActorMeshRef, ProcMeshRef

__all__ = ["CallTable", "ClientHooks"]


@dataclass
class ClientHooks:
    """What a controller plugs into its client; a proc's own client has none of them."""

    # (mesh_id, ranks, +1 | -1): calls to ranks started / finished; the controller tracks busy/idle
    activity: Callable[[str, list[int], int], None] | None = None
    # (actor mesh, spawn payload, buffers): the controller keeps them to re-create actors on respawn
    on_spawn: Callable[[ActorMeshRef, bytes, list[Any]], None] | None = None
    # (mesh_id): a proc mesh was stopped; the controller trims the output it keeps of it
    on_stopped: Callable[[str], None] | None = None
    # runs before every call and spawn: the controller raises unhandled failures there (fail fast)
    before_call: Callable[[], None] | None = None
    # (mesh_id, ranks, actor id): those ranks' constructors of that actor returned (or failed)
    constructed: Callable[[str, list[int], str], None] | None = None
    # (actor mesh, ranks): a call or broadcast to those ranks was just sent, from this thread; the
    # notebook tells by it which cell's output a rank prints, and warns of actors of a redefined class
    sent: Callable[[ActorMeshRef, list[int]], None] | None = None
    # (actor mesh, class): actors of that class are being spawned (the notebook's %mesh reload)
    spawned: Callable[[ActorMeshRef, type], None] | None = None
    # (actor id, proc ranks): ``ActorMesh.stop()`` of those actors: their owner no longer hears of those procs
    actors_stopping: Callable[[str, list[int]], None] | None = None
    # a second interrupt kills the procs still running a cancelled call
    kill_ranks: Callable[[ProcMeshRef, list[int]], list[int]] | None = None


class CallTable:
    """Calls in flight by id, and per rank what later calls must know, all under ``lock`` (replies are
    recorded on the receive thread and on callers' threads at once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # the table, the sequence counters, and the client's send order
        self.pending = PendingTable()
        self.failed: dict[tuple[str, int], Failure] = {}  # (mesh id, rank) -> why it broke
        self.stopped: set[str] = set()  # proc mesh ids
        self.seq: dict[str, list[int]] = {}  # actor id -> the next sequence number per rank
        self.actor_mesh: dict[str, str] = {}  # actor id -> proc mesh id
        self.moved: dict[tuple[str, int], str] = {}  # respawned ranks' new addresses
        self.lost_peers: dict[str, str] = {}  # agents gone for good -> why
        # the ranks of a call a death failed (the dead, and those still running it): (mesh id, rank) -> until
        # when (monotonic). Their death's own note soon after (a host's ranks die one by one; an agent's
        # gather may tell of a death before its note does) is part of what the call's caller was told
        self.doomed: dict[tuple[str, int], float] = {}

    def finish(self, call_id: int) -> None:
        """Forget a call (answered, timed out, or given up on)."""
        with self.lock:
            self.pending.pop(call_id, None)
