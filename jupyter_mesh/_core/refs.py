"""Where meshes live, as plain values every layer can pass around: a proc mesh's routing (``ProcMeshRef``),
what the runtime needs of an actor mesh (``ActorMeshRef``), and fresh ids.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .shape import Shape

__all__ = ["ActorMeshRef", "ProcMeshRef", "new_id", "ref_from_wire", "ref_to_wire"]


def new_id(prefix: str) -> str:
    """A mesh or actor id: the user's name (readable in logs) and 40 random bits (unique per program)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class ProcMeshRef:
    """Where the procs of one proc mesh live: what any process needs to route calls to them."""

    mesh_id: str
    name: str
    shape: Shape  # the full mesh, row-major over global ranks
    proc_addrs: list[str]  # inbox address per global rank
    rank_host: list[int]  # host index per global rank
    agent_addrs: list[str]  # agent inbox per host index
    host_keys: list[str] = field(default_factory=list)
    host_dims: int = 1  # the leading dims that come from the host mesh

    def coords(self, rank: int) -> dict[str, int]:
        return dict(self.shape.point(rank))


def ref_to_wire(ref: ProcMeshRef) -> list[Any]:
    """A ``ProcMeshRef`` as plain lists (a spawn's header carries it: the actor's ``proc_mesh``)."""
    return [ref.mesh_id, ref.name, ref.shape.to_wire(), ref.proc_addrs, ref.rank_host, ref.agent_addrs,
            ref.host_keys, ref.host_dims]  # fmt: skip


def ref_from_wire(w: Any) -> ProcMeshRef | None:
    """:func:`ref_to_wire`'s inverse; None for anything else (nothing off the wire is trusted as it is)."""
    try:
        mesh_id, name, shape, addrs, hosts, agents, keys, host_dims = w
        ref = ProcMeshRef(str(mesh_id), str(name), Shape.from_wire(shape), [str(a) for a in addrs],
                          [int(h) for h in hosts], [str(a) for a in agents], [str(k) for k in keys], int(host_dims))  # fmt: skip
    except (TypeError, ValueError, KeyError, IndexError):
        return None
    return ref if len(ref.proc_addrs) == len(ref.rank_host) == len(ref.shape) else None


class ActorMeshRef(Protocol):
    """What the runtime reads of an actor mesh (``jupyter_mesh.ActorMesh`` is one): its id, class, the
    proc mesh it lives on and the view of it. A protocol, so the runtime never imports the API layer."""

    @property
    def _actor_id(self) -> str: ...
    @property
    def _class_name(self) -> str: ...
    @property
    def _name(self) -> str: ...
    @property
    def _ref(self) -> ProcMeshRef: ...
    @property
    def _shape(self) -> Shape: ...
    @property
    def _view(self) -> Shape | None: ...  # None: the whole proc mesh, following it as it grows
    @property
    def _plain(self) -> Mapping[str, bool]: ...  # methods called through ``as_endpoint``: explicit port?
    @property
    def _sliced(self) -> bool: ...  # a view of the mesh as spawned: calls say which (``vl``)
