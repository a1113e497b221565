"""How an actor is numbered, as in Monarch: its own point in the mesh it was spawned on (a proc mesh
sliced, flattened or renamed numbers it in that view), and during a call its point in the view the call
was sent to (``a.slice(gpus=1).f.call()`` numbers the actors of that slice from 0).

A part of ``actor_host.ActorHost`` (a base class of it). The caller puts the call's view in the header
only when it is not the spawn's (``vl``, see ``_wire.protocol``); the point is computed only when the
actor asks (``current_rank()``, ``context()``), so a call that does not ask pays nothing. Our own output
prefixes, state and errors keep naming the proc by its coordinates in the whole proc mesh.
"""

from __future__ import annotations

from typing import Any, Protocol

from .._core.shape import Extent, Point, Shape, Slice

__all__ = ["ActorRanks"]


class _Runtime(Protocol):
    rank: int
    point: Point  # the proc's, in the whole proc mesh (it changes when the mesh grows or shrinks)


class ActorRanks:
    """The actor's own point and its point in a call; ``ActorHost`` sets ``runtime``."""

    runtime: _Runtime
    view: Shape | None = None  # the proc mesh view it was spawned on; None: the whole mesh, as it grows
    _own: Point | None = None

    def spawned_on(self, h: dict[str, Any]) -> None:
        """Take the spawn's view from its header (before ``__init__`` runs: it may ask its rank)."""
        labels = h.get("vl")
        if labels is not None:
            self.view, self._own = Shape(tuple(labels), Slice.from_wire(h["vs"] if "vs" in h else h["sl"])), None

    @property
    def point(self) -> Point:
        """Its point in the mesh it was spawned on (Monarch's ``actor_instance.rank``)."""
        if self.view is None:
            return self.runtime.point
        own = self._own
        if own is None:
            own = self._own = _point_in(tuple(self.view.labels), self.view.slice, self.runtime.rank)
        return own

    def rank_in(self, h: dict[str, Any] | None) -> Point:
        """Its point in the view message ``h`` was sent to (its own point outside a call)."""
        if h is None:
            return self.point
        labels = h.get("vl")
        if labels is None:  # sent to the mesh as spawned
            return self.point
        point: Point | None = h.get("_pt")
        if point is None:
            sl = h.get("sl") or h.get("vs")
            if sl is None:  # call_one: the view is one point
                point = Point(0, Extent(labels, (1,) * len(labels)))
            else:
                point = _point_in(tuple(labels), Slice.from_wire(sl), self.runtime.rank)
            h["_pt"] = point  # asked again in the same call: computed once
        return point


def _point_in(labels: tuple[str, ...], sl: Slice, rank: int) -> Point:
    index = sl.index_of(rank)
    if index is None:  # the caller sent this rank a view it is not in: a bug of ours, said plainly
        raise RuntimeError(f"proc rank {rank} is not in the view {labels} {sl} it was called or spawned with")
    return Point(index, Extent(labels, sl.sizes))
