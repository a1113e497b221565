"""The controller's records of the proc meshes it spawned, by mesh id (read by elasticity and by
the constructor watch too, which is why they live apart from the controller)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import Failure, MeshClosedError

if TYPE_CHECKING:
    from .._core.refs import ActorMeshRef, ProcMeshRef

__all__ = ["MeshRecord", "MeshRecords"]


@dataclass
class MeshRecord:
    """What the controller keeps of one proc mesh it spawned."""

    ref: ProcMeshRef
    pids: dict[int, int]
    stopped: bool = False
    failures: dict[int, Failure] = field(default_factory=dict)
    # actor meshes spawned from here on this proc mesh, with their spawn payloads (for respawn)
    actors: list[tuple[ActorMeshRef, bytes, list[Any]]] = field(default_factory=list)
    owner: Any = None  # the actor (inside a proc) that spawned this mesh: its __supervise__ is asked first
    job: Any = None
    env: dict[str, str] = field(default_factory=dict)
    preload: list[str] = field(default_factory=list)


class MeshRecords(dict[str, MeshRecord]):
    """Mesh id -> record; ``live`` is the lookup for an operation on a mesh that must still run."""

    def live(self, ref: ProcMeshRef) -> MeshRecord:
        rec = self.get(ref.mesh_id)
        if rec is None or rec.stopped:
            raise MeshClosedError(
                f"`ProcMesh` has already been stopped: proc mesh '{ref.name}' was stopped; "
                "spawn a new one with HostMesh.spawn_procs()"
            )
        return rec
