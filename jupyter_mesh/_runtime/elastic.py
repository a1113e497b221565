"""Elasticity, a part the controller owns: kill a rank, respawn failed ranks in place, grow or shrink a
proc mesh. Actor meshes spawned from here are re-created on new procs from their spawn payloads."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Protocol

from .._core.future import Future, time_left
from .._core.shape import Shape
from .._wire import protocol
from ..errors import MeshValueError, SupervisionError

if TYPE_CHECKING:
    from .._core.refs import ProcMeshRef
    from .._core.state import StateTracker
    from .client import Client
    from .faults import Faults
    from .records import MeshRecord, MeshRecords

__all__ = ["Elastic"]


class ElasticHost(Protocol):
    """What elasticity needs of the controller."""

    client: Client
    faults: Faults
    state: StateTracker
    meshes: MeshRecords
    killed_on_request: set[tuple[str, int]]

    def spawn_request(
        self,
        agent: Any,
        ref: ProcMeshRef,
        ranks: list[int],
        env: dict[str, str],
        preload: list[str],
        shape: Shape | None = None,
    ) -> Future[Any]: ...

    def notify_procs(self, header: dict[str, Any], obj: Any = None) -> None: ...

    def raise_pending_fault(self) -> None: ...

    def meshes_changed(self, rec: MeshRecord) -> None: ...


class Elastic:
    """Kill, respawn, grow and shrink the controller's proc meshes (one per controller)."""

    def __init__(self, host: ElasticHost):
        self.host = host

    def kill(self, ref: ProcMeshRef, rank: int, sig: int, timeout: float = 10.0) -> int:
        """Send ``sig`` to the proc of ``rank``; its exit is then reported like any failure."""
        self.host.meshes.live(ref)
        self.host.killed_on_request.add((ref.mesh_id, rank))
        return self.host.client.request(
            ref.agent_addrs[ref.rank_host[rank]],
            protocol.kill_proc(ref.mesh_id, rank, sig),
            what=f"kill of rank {rank}",
        ).get(timeout)

    def respawn(self, ref: ProcMeshRef, ranks: list[int] | None, timeout: float) -> list[int]:
        """New procs for failed ranks, same coordinates; actors spawned from here are re-created."""
        rec = self.host.meshes.live(ref)
        ranks = sorted(rec.failures) if ranks is None else sorted(set(ranks))
        alive = [r for r in ranks if r not in rec.failures]
        if alive:
            raise MeshValueError(f"ranks {alive} of '{ref.name}' have not failed; kill them first to respawn them")
        if not ranks:
            return []
        by_host: dict[int, list[int]] = {}
        for r in ranks:
            by_host.setdefault(ref.rank_host[r], []).append(r)
        futs = [
            self.host.client.request(ref.agent_addrs[h], protocol.start_procs(ref.mesh_id, rs), what=f"respawn of {rs}")
            for h, rs in by_host.items()
        ]
        deadline = time.monotonic() + timeout  # one bound for all hosts, not one each
        for f in futs:
            for rank, addr, pid in f.get(time_left(deadline)):
                ref.proc_addrs[rank] = addr
                rec.pids[rank] = pid
        self.host.client.reset_ranks(ref.mesh_id, ranks, [m._actor_id for m, _, _ in rec.actors])
        spawns = [
            self.host.client.respawn_actor(m, r, payload, bufs)
            for m, payload, bufs in rec.actors
            for r in ranks
            if m._shape.slice.index_of(r) is not None
        ]
        for r in ranks:
            rec.failures.pop(r, None)
            self.host.killed_on_request.discard((ref.mesh_id, r))
            self.host.state.respawned(ref.mesh_id, r, rec.pids[r])
            self.host.notify_procs(protocol.notice("respawned", ref.mesh_id, r, ref.proc_addrs[r]))
        # respawning a rank handles its failure: fail fast must not raise it at the next call
        self.host.faults.handled(ref.name, {r: dict(ref.coords(r)) for r in ranks})
        self._wait_actor_spawns(spawns, timeout, "while re-creating actors on respawned ranks")
        return ranks

    def resize(self, ref: ProcMeshRef, dim: str, size: int, timeout: float) -> None:
        """Grow or shrink one dim. Ranks keep their numbers, so every dim before ``dim`` must have
        size 1 (``hosts`` for a one-host mesh, or ``hosts`` itself)."""
        rec = self.host.meshes.live(ref)
        self.host.raise_pending_fault()
        shape = ref.shape
        if dim not in shape.labels:
            raise MeshValueError(f"unknown dim '{dim}'; this mesh has dims {list(shape.labels)}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise MeshValueError(f"the new size of '{dim}' must be a positive int, got {size!r}")
        i = shape.labels.index(dim)
        outer = [lbl for lbl, n in zip(shape.labels[:i], shape.slice.sizes[:i]) if n != 1]
        if outer:
            raise MeshValueError(
                f"cannot resize '{dim}' while {outer} have size > 1: ranks would be renumbered. "
                "Resize the outermost dim, or spawn a new proc mesh"
            )
        new_shape = Shape.from_sizes({**dict(shape.extent), dim: size})
        old_n, new_n = len(shape), len(new_shape)
        if new_n > old_n:
            self._grow(rec, new_shape, dim, timeout)
        elif new_n < old_n:
            self._shrink(rec, new_shape, timeout)
        self.host.meshes_changed(rec)

    def _grow(self, rec: MeshRecord, new_shape: Shape, dim: str, timeout: float) -> None:
        ref = rec.ref
        old_n, new_n = len(ref.shape), len(new_shape)
        n_hosts = len(ref.agent_addrs)
        if dim == ref.shape.labels[0] and ref.host_dims >= 1:  # more hosts
            n_hosts = new_shape.slice.sizes[0]
            agents = rec.job.add_hosts(n_hosts - len(ref.agent_addrs), timeout)
        per_host = new_n // n_hosts
        new_ranks = list(range(old_n, new_n))
        ref.proc_addrs.extend([""] * (new_n - old_n))
        ref.rank_host.extend(r // per_host for r in new_ranks)
        futs = []
        for h, addr in enumerate(ref.agent_addrs):  # hosts we have: new ranks (or just the new extent)
            ranks = [r for r in new_ranks if ref.rank_host[r] == h]
            futs.append(
                self.host.client.request(
                    addr,
                    protocol.start_procs(ref.mesh_id, ranks, new_shape.to_wire()),
                    what=f"grow of '{ref.name}'",
                )
            )
        old_shape = ref.shape  # the new shape is published once its procs are up: no call reaches a
        # rank whose proc does not exist yet
        if n_hosts > len(ref.agent_addrs):  # new hosts get the mesh from scratch
            for agent in agents:
                h = len(ref.agent_addrs)
                ref.agent_addrs.append(agent.addr)
                ref.host_keys.append(agent.host_key)
                ranks = [r for r in new_ranks if ref.rank_host[r] == h]
                futs.append(self.host.spawn_request(agent, ref, ranks, rec.env, rec.preload, new_shape))
        coords = [dict(new_shape.point(r)) for r in range(new_n)]
        self.host.state.resized(ref.mesh_id, dict(new_shape.extent), coords, ref.agent_addrs, ref.rank_host)
        try:
            deadline = time.monotonic() + timeout
            for f in futs:
                for rank, addr, pid in f.get(time_left(deadline)):
                    ref.proc_addrs[rank] = addr
                    rec.pids[rank] = pid
        except BaseException:
            try:  # undo: no half-grown mesh; whatever happens here, the user sees the original error
                self._shrink(rec, old_shape, 5.0)
            except Exception as e:  # noqa: BLE001
                print(f"jupyter_mesh: while undoing the grow of '{ref.name}': {e}", file=sys.stderr)
            raise
        ref.shape = new_shape
        spawns = [
            self.host.client.respawn_actor(m, r, payload, bufs)
            for m, payload, bufs in rec.actors
            if m._view is None
            for r in new_ranks
        ]
        self._wait_actor_spawns(spawns, timeout, "while creating actors on the new ranks")

    def _shrink(self, rec: MeshRecord, new_shape: Shape, timeout: float) -> None:
        ref = rec.ref
        new_n = len(new_shape)
        removed = list(range(new_n, len(ref.proc_addrs)))
        ref.shape = new_shape  # from now on no call targets the removed ranks
        self.host.client.mark_removed(ref.mesh_id, removed)
        futs = [
            self.host.client.request(
                addr,
                protocol.stop_procs(
                    ref.mesh_id, timeout, [r for r in removed if ref.rank_host[r] == h], new_shape.to_wire()
                ),
                what=f"shrink of '{ref.name}'",
            )
            for h, addr in enumerate(ref.agent_addrs)
        ]
        deadline = time.monotonic() + timeout + 5.0
        for f in futs:
            f.get(time_left(deadline))
        del ref.proc_addrs[new_n:], ref.rank_host[new_n:]
        for r in removed:
            rec.pids.pop(r, None)
            rec.failures.pop(r, None)
        coords = [dict(new_shape.point(r)) for r in range(new_n)]
        self.host.state.resized(ref.mesh_id, dict(new_shape.extent), coords, ref.agent_addrs, ref.rank_host)

    def _wait_actor_spawns(self, spawns: list[Future[None]], timeout: float, context: str) -> None:
        errors = []
        for f in spawns:  # (each its own timeout: an actor's __init__ may take it, and they may queue)
            try:
                f.get(timeout)
            except SupervisionError as e:
                errors.extend(e.failures)
        if errors:
            raise SupervisionError(errors, context)
