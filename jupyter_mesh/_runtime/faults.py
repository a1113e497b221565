"""Who hears of a failure. A rank whose proc died is its proc mesh's owner's business: the actor that
spawned the procs (``__supervise__``), else this program's fault hook, unless a call of ours was told
already. An actor that died (its ``__init__`` raised, an error no caller received) is reported by its
proc to whoever spawned its actor mesh (``ACTOR_FAULT``), and routed the same way: the spawning actor
here, else the fault hook. A proc mesh lent to actors (passed to one) is theirs to supervise: its rank
failures reach the actors here that spawned actor meshes on it. Fail fast (the default hook in
scripts) keeps what it saw, to raise it at the next API call. The controller owns one ``Faults``.
"""

from __future__ import annotations

import dataclasses
import threading
import traceback
from typing import TYPE_CHECKING, Any, Protocol

from .._wire.serialize import loads
from ..errors import Failure, MeshFailure, SupervisionError
from . import hooks

if TYPE_CHECKING:
    from .._wire.transport import Message
    from .client import Client
    from .records import MeshRecord, MeshRecords

__all__ = ["Faults"]


class FaultsHost(Protocol):
    """What the routing of failures needs of the controller."""

    client: Client
    meshes: MeshRecords
    embedded: bool
    killed_on_request: set[tuple[str, int]]


class Faults:
    """Routes failures to their owner or the fault hook; holds the failure fail fast will raise."""

    def __init__(self, host: FaultsHost):
        self.host = host
        self.pending: SupervisionError | None = None  # fail fast: raised at the next API call
        self._lock = threading.Lock()
        # actor meshes spawned from this proc (embedded controller only): actor id -> (the actor that
        # spawned it, its proc mesh id, its name, the ranks of that proc mesh it is on: None for all).
        # That actor's __supervise__ hears of their failures
        self.owners: dict[str, tuple[Any, str, str, frozenset[int] | None]] = {}
        self.stopped: dict[str, set[int]] = {}  # actor id -> proc ranks where ``ActorMesh.stop()`` ended them
        self.lent: set[str] = set()  # our proc meshes passed to actors: they supervise what they spawn there
        emb = hooks.embedding()
        if host.embedded and emb is not None:
            emb.watch_failures(self.notice_failed)

    # -- ownership ----------------------------------------------------------------------------------
    def spawning(self, actor_id: str, mesh_id: str, name: str = "", ranks: frozenset[int] | None = None) -> None:
        """An actor mesh (``name``, on ``ranks`` of the proc mesh, None: all) is being spawned from this
        thread: in a proc, the actor running here owns it."""
        emb = hooks.embedding()
        if self.host.embedded and emb is not None:
            owner = emb.current_owner()
            if owner is not None:
                self.owners[actor_id] = (owner, mesh_id, name, ranks)

    def actors_stopping(self, actor_id: str, ranks: list[int]) -> None:
        """``ActorMesh.stop()`` of an actor mesh spawned from here, on those procs: a later death of one of
        them is not that mesh's failure (its actors ended already), as in Monarch."""
        if actor_id in self.owners:
            self.stopped.setdefault(actor_id, set()).update(ranks)

    def _per_actor_mesh(self, mesh_id: str, failure: Failure, owner: Any = None) -> list[tuple[Any, Failure]]:
        """A proc of ``mesh_id`` failed: the failure as each actor mesh spawned from here on it has it
        (named after it: ``mesh_name``), with its owner, as Monarch tells one ``__supervise__`` per
        actor mesh. ``owner``, the proc mesh's own, hears of it under the proc mesh's name if it
        spawned no actor mesh there. An actor mesh on a slice without the failed proc does not hear
        of it (its actors live), as in Monarch."""
        out = [
            (o, dataclasses.replace(failure, actor=name))
            for aid, (o, m, name, ranks) in list(self.owners.items())
            if m == mesh_id
            and name
            and (ranks is None or failure.rank in ranks)
            and failure.rank not in self.stopped.get(aid, ())
        ]
        if owner is not None and not any(o is owner for o, _ in out):
            out.append((owner, failure))
        return out

    def lend(self, mesh_id: str) -> None:
        """A proc mesh of ours is being pickled for an actor: failures there are its to handle too."""
        if mesh_id in self.host.meshes:
            self.lent.add(mesh_id)

    # -- rank failures (a proc died) ------------------------------------------------------------------
    def rank_failed(self, rec: MeshRecord, rank: int, failure: Failure, told: bool, hook_only: bool = False) -> None:
        """Who handles a proc's failure: the actor that owns the mesh, else the fault hook if no call was
        told (and the mesh was not lent to actors, who supervise what they spawned on it).
        ``hook_only``: a second look, once a call thought told turned out not to be (an owner has it)."""
        if (rec.ref.mesh_id, rank) in self.host.killed_on_request:
            return
        if failure.rank is None:  # which rank of the mesh, for MeshFailure.crashed_ranks
            failure = dataclasses.replace(failure, rank=rank)
        emb = hooks.embedding()
        if rec.owner is not None and emb is not None:
            if hook_only:
                return
            for owner, f in self._per_actor_mesh(rec.ref.mesh_id, failure, rec.owner):
                emb.supervise(owner, SupervisionError([f], f"in mesh '{rec.ref.name}' that it owns"))
            return
        if not told and rec.ref.mesh_id not in self.lent:
            self._to_hook(MeshFailure([failure], "while nothing was waiting on it"))

    def notice_failed(self, mesh_id: str, rank: int, failure: Any) -> None:
        """In a proc: a rank of a proc mesh another process owns failed (its notice). Actors here that
        spawned actor meshes on it hear of it, once per actor mesh (a mesh of our own is ``rank_failed``'s)."""
        if mesh_id in self.host.meshes or not isinstance(failure, Failure):
            return
        emb = hooks.embedding()
        if emb is None:
            return
        if failure.rank is None:
            failure = dataclasses.replace(failure, rank=rank)
        for owner, f in self._per_actor_mesh(mesh_id, failure):
            emb.supervise(owner, SupervisionError([f], f"in mesh '{failure.mesh}' it spawned actors on"))

    # -- actor failures (the proc lives on) -----------------------------------------------------------
    def actor_fault(self, msg: Message, frames: list[Any]) -> None:
        """``ACTOR_FAULT`` from a proc: an actor of a mesh spawned from here failed."""
        h = msg.header
        try:
            failure = loads(msg.payload, msg.buffers)
        except Exception:  # noqa: BLE001 - signed by one of our procs, but a class may not load here
            return
        actor_id, rank = h.get("a"), h.get("rk")
        if not isinstance(failure, Failure) or not isinstance(actor_id, str) or type(rank) is not int:
            return
        emb = hooks.embedding()
        owned = self.owners.get(actor_id)
        if owned is not None and emb is not None:
            emb.supervise(owned[0], SupervisionError([failure], f"in actor mesh '{failure.actor}' that it owns"))
            return
        if h.get("told") or (not h.get("ut") and self.host.client.waits_on_actor(actor_id, rank)):
            return  # the caller has it, as a SupervisionError or in its cell
        self._to_hook(MeshFailure([failure], "while nothing was waiting on it"))

    def _to_hook(self, err: MeshFailure) -> None:
        try:
            hooks.fault_hook(err)
        except Exception:  # noqa: BLE001 - a broken hook must not break supervision
            traceback.print_exc()

    # -- fail fast ------------------------------------------------------------------------------------
    def hold(self, err: SupervisionError) -> bool:
        """What fail fast saw, merged with what it saw before (each failure once). True if nothing was
        held before: the program has seen every earlier one (or there was none)."""
        with self._lock:
            prev = self.pending
            seen = {_key(f) for f in (prev.failures if prev else [])}
            new = [f for f in err.failures if _key(f) not in seen]
            self.pending = MeshFailure([*(prev.failures if prev else []), *new], err.context)
            return prev is None

    def handled(self, mesh: str, ranks: dict[int, dict[str, int]]) -> None:
        """The user respawned ``ranks`` (rank -> coords) of proc mesh ``mesh``: their failures (the
        procs', and their actors', re-created with them) are handled, so fail fast no longer raises
        them; another rank's failure stays held."""
        coords = [sorted(c.items()) for c in ranks.values()]

        def of_them(f: Failure) -> bool:
            if f.mesh != mesh:
                return False
            return f.rank in ranks if f.rank is not None else bool(f.coords) and sorted(f.coords.items()) in coords

        with self._lock:
            prev = self.pending
            if prev is None:
                return
            left = [f for f in prev.failures if not of_them(f)]
            if len(left) != len(prev.failures):
                self.pending = MeshFailure(left, prev.context) if left else None

    def raise_pending(self) -> None:
        """Raise an unhandled failure at the next API call (once), as fail-fast promises."""
        if self.pending is None:
            return
        with self._lock:
            err, self.pending = self.pending, None
        if err is not None:
            raise err


def _key(f: Failure) -> tuple[Any, ...]:
    """One failure once: of which mesh (and actor), where, what kind."""
    return (f.mesh, f.actor, tuple(sorted(f.coords.items())), f.kind)
