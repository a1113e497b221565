"""What a client does when ranks break, move, shrink away or stop: fail what waits on them, and make
later calls fail at the call site or reach the rank's new proc. ``client.Client`` owns one."""

from __future__ import annotations

import pickle
import time
from typing import TYPE_CHECKING, Any

from .._wire.protocol import BROKEN
from ..errors import Failure, MeshClosedError, SupervisionError

if TYPE_CHECKING:
    from .calls import CallTable, ClientHooks
    from .outcomes import Outcomes
    from .pending import Pending

__all__ = ["Supervision"]


class Supervision:
    """Acts on the call table when ranks break, move, shrink away or stop."""

    def __init__(self, calls: CallTable, outcomes: Outcomes, hooks: ClientHooks):
        self.calls, self.outcomes, self.hooks = calls, outcomes, hooks

    def rank_moved(self, mesh_id: str, rank: int, address: str) -> None:
        """A rank was respawned elsewhere: reach it at ``address`` (our copies of its mesh are stale),
        forget its failure and start our sequence numbers to it again."""
        with self.calls.lock:
            self.calls.moved[(mesh_id, rank)] = address
            self.calls.failed.pop((mesh_id, rank), None)
            self.calls.doomed.pop((mesh_id, rank), None)
            for actor_id, arr in self.calls.seq.items():
                if self.calls.actor_mesh.get(actor_id) == mesh_id and rank < len(arr):
                    arr[rank] = 0

    def reset_ranks(self, mesh_id: str, ranks: list[int], actor_ids: list[str]) -> None:
        """Ranks got new procs: forget their failures and restart our sequence numbers to them."""
        with self.calls.lock:
            for r in ranks:
                self.calls.failed.pop((mesh_id, r), None)
                self.calls.doomed.pop((mesh_id, r), None)
            for a in actor_ids:
                arr = self.calls.seq.get(a)
                if arr is not None:
                    for r in ranks:
                        if r < len(arr):
                            arr[r] = 0

    def waits_on(self, mesh_id: str, rank: int) -> bool:
        """Whether a call from here waits on ``rank`` (then its caller will hear of a failure).

        A rank that answered already counts while its call is pending (not a stream's: that rank's
        future is out): its death fails that call at once (``mark_failed``). A spawn does not count:
        few programs look at ``ActorMesh.initialized``, so a failure that only fails that future would
        go unseen."""
        with self.calls.lock:
            return any(
                p.mesh_id == mesh_id and p.mode != "spawn" and _covers(p, rank) for p in self.calls.pending.values()
            )

    def doomed(self, mesh_id: str, rank: int) -> bool:
        """Whether ``rank`` was in a call of ours that a death failed moments ago (``outcomes.DOOMED_S``;
        once: it is forgotten here). Its death is then part of what that call's caller was told: the
        ranks of a lost host, or of a killed fork server, die one at a time."""
        with self.calls.lock:
            until = self.calls.doomed.pop((mesh_id, rank), None)
        if until is None:
            return False
        return time.monotonic() <= until

    def waits_on_actor(self, actor_id: str, rank: int) -> bool:
        """Whether a call from here (not a spawn) waits on that actor at ``rank``: it will hear of the
        actor's failure."""
        with self.calls.lock:
            return any(
                p.actor_id == actor_id and rank in p.outstanding and p.mode != "spawn"
                for p in self.calls.pending.values()
            )

    def constructing(self, spawn: Any) -> list[int]:
        """Ranks whose actor ``__init__`` has not answered yet, for the spawn whose future is ``spawn``."""
        with self.calls.lock:
            for p in self.calls.pending.values():
                if p.future is spawn and p.mode == "spawn":
                    return sorted(p.outstanding)
        return []

    def mark_failed(self, failure_by_rank: dict[int, Failure], mesh_id: str) -> int:
        """Ranks of ``mesh_id`` broke: fail what waits on them now, and later calls at the call site.
        A pending call fails too where the rank answered it already (a SIGTERM's cancel, say) and
        then died: the call still waits on others, and a dead rank dooms it (as in Monarch).

        Returns how many pending calls it failed (0: nobody was told; the fault hook should be)."""
        with self.calls.lock:
            for r, f in failure_by_rank.items():
                self.calls.failed[(mesh_id, r)] = f
            hit = [
                (cid, p, [r for r in sorted(failure_by_rank) if _covers(p, r)])
                for cid, p in self.calls.pending.items()
                if p.mesh_id == mesh_id
            ]
        hit = [(cid, p, ranks) for cid, p, ranks in hit if ranks]
        for cid, p, ranks in hit:
            for r in ranks:
                self.outcomes.add(p, cid, r, BROKEN, pickle.dumps(failure_by_rank[r]), [])
        return len(hit)

    def mark_removed(self, mesh_id: str, ranks: list[int]) -> None:
        """Ranks removed by a shrink: calls waiting on them fail as closed; their state is forgotten."""
        gone = set(ranks)
        with self.calls.lock:
            for r in ranks:
                self.calls.failed.pop((mesh_id, r), None)
            first = min(ranks, default=None)
            for actor_id, arr in self.calls.seq.items():  # a later grow starts those ranks at 0 again
                if first is not None and self.calls.actor_mesh.get(actor_id) == mesh_id:
                    del arr[first:]
            hit = [p for p in self.calls.pending.values() if p.mesh_id == mesh_id and p.outstanding & gone]
            lost: dict[int, int] = {}
            for p in hit:
                lost[p.call_id] = len(p.outstanding & gone)
                p.outstanding -= gone
                if p.stream_q is None or not p.outstanding:
                    self.calls.pending.pop(p.call_id, None)
        for p in hit:
            # a stream gets one closed future per removed rank; its other ranks still answer
            p.fail(
                MeshClosedError(f"ranks of '{p.actor}' were removed by a shrink while {p.endpoint} was pending"),
                lost[p.call_id],
            )

    def mark_stopped(self, mesh_id: str) -> None:
        """Its proc mesh was stopped: what waits on it fails as Monarch's would (``SupervisionError``,
        kind ``stopped``), and so will later calls (``client.stopped_error``)."""
        with self.calls.lock:
            self.calls.stopped.add(mesh_id)
            hit = [(cid, p) for cid, p in self.calls.pending.items() if p.mesh_id == mesh_id]
            for cid, _ in hit:
                self.calls.pending.pop(cid, None)
        for _, p in hit:
            name = p.ref.name if p.ref is not None else mesh_id
            fails = [
                Failure(name, p.ref.coords(r) if p.ref is not None else {}, "stopped", "its proc mesh was stopped")
                for r in sorted(p.outstanding)[:16]
            ] or [Failure(name, {}, "stopped", "its proc mesh was stopped")]
            p.fail(SupervisionError(fails, f"while {p.actor}.{p.endpoint} was pending", p.site()), len(p.outstanding))
        if self.hooks.on_stopped is not None:
            self.hooks.on_stopped(mesh_id)

    def peer_lost(self, address: str, why: str) -> None:
        """An agent is gone for good: requests waiting on it fail now, later ones at once."""
        with self.calls.lock:
            self.calls.lost_peers[address] = why
            hit = [p for p in self.calls.pending.values() if p.peer == address]
            for p in hit:
                self.calls.pending.pop(p.call_id, None)
        for p in hit:
            assert p.future is not None
            p.future._set_exception(SupervisionError([Failure("", {}, "agent", why)], f"during {p.future._what}"))

    def fail_all(self, exc: BaseException) -> None:
        """The runtime is going away: nothing pending may hang."""
        with self.calls.lock:
            pending = list(self.calls.pending.values())
            self.calls.pending.clear()
        for p in pending:
            p.fail(exc, len(p.outstanding))


def _covers(p: Pending, rank: int) -> bool:
    """Whether a pending call will report ``rank``'s death: it waits on it, or (not a stream) the rank
    answered and the call still waits on others."""
    return rank in p.outstanding or (p.stream_q is None and rank in p.ranks)
