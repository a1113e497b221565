"""ValueMesh: one value per member of a mesh, addressed by coordinates."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from ..errors import MeshIndexError, MeshKeyError, MeshValueError
from . import slots
from .shape import Extent, Point, Shape

__all__ = ["ValueMesh"]

T = TypeVar("T")


class ValueMesh(Generic[T]):
    """The gathered result of a call: ``values[i]`` belongs to the i-th member (row-major) of ``shape``."""

    def __init__(self, shape: Shape, values: list[T]):
        if len(values) != len(shape):
            raise MeshValueError(f"ValueMesh of shape {shape} needs {len(shape)} values, got {len(values)}")
        self._shape, self._values = shape, values

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self._shape.extent)

    def size(self, dim: str | None = None) -> int:
        if dim is not None and dim not in self._shape.labels:  # Monarch's KeyError
            raise MeshKeyError(f"unknown dim '{dim}'; this ValueMesh has dims {list(self._shape.labels)}")
        return len(self._shape) if dim is None else self._shape.extent[dim]

    def item(self, **coords: int) -> T:
        """The value at ``coords``; every dim must be given (a 0-dim mesh takes none). A dim missing or
        unknown is a ``KeyError``, a coordinate out of range an ``IndexError``, as in Monarch (and both
        a ``MeshValueError``)."""
        missing = [d for d in self._shape.labels if d not in coords]
        extra = [d for d in coords if d not in self._shape.labels]
        if missing or extra:
            raise MeshKeyError(
                f"item() needs exactly the dims {list(self._shape.labels)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {extra}" if extra else "")
            )
        idx = 0
        for d, size in zip(self._shape.labels, self._shape.slice.sizes):
            c = coords[d]
            if not 0 <= c < size:
                raise MeshIndexError(f"coordinate {d}={c} out of range (size {size})")
            idx = idx * size + c
        return self._values[idx]

    def get(self, index: int) -> T:
        """The value of the ``index``-th member, in row-major order of this mesh."""
        return self._values[index]

    def slice(self, **dims: int | builtins.slice) -> ValueMesh[T]:
        """The values of a sub-mesh, as ``ActorMesh.slice`` selects actors: an int drops the dim."""
        view = self._shape.select(**dims)
        where = {g: i for i, g in enumerate(self._shape.ranks())}
        return ValueMesh(view, [self._values[where[g]] for g in view.ranks()])

    def flatten(self, name: str) -> ValueMesh[T]:
        """The same values along one dim ``name``."""
        return ValueMesh(self._shape.flatten(name), self._values)

    def rename(self, **names: str) -> ValueMesh[T]:
        """The same values with dims renamed: ``rename(gpus="g")`` (as ``ActorMesh.rename``)."""
        return ValueMesh(self._shape.rename(**names), self._values)

    def split(self, **spec: Any) -> ValueMesh[T]:
        """The same values with a dim split in several: ``split(r=("x", "y"), x=2)`` (as
        ``ActorMesh.split``); row-major order, and so each value's place, is unchanged."""
        return ValueMesh(self._shape.split(**spec), self._values)

    def items(self) -> Iterator[tuple[Point, T]]:
        ext = self._shape.extent
        for i, v in enumerate(self._values):
            yield Point(i, ext), v

    def values(self) -> Iterator[T]:
        return iter(self._values)

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        return self.items()

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ValueMesh) and self._shape == other._shape and self._values == other._values

    def __repr__(self) -> str:
        if not self._shape.labels:
            return f"ValueMesh({self._values[0]!r})"
        body = ", ".join(f"{','.join(f'{k}={v}' for k, v in p.items())}: {v!r}" for p, v in list(self.items())[:16])
        more = f", ... ({len(self) - 16} more)" if len(self) > 16 else ""
        return f"ValueMesh({self._shape}, {{{body}{more}}})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ValueMesh, (self._shape, self._values))

    def _repr_html_(self) -> str | None:
        """In a notebook: a grid along the dims, drawn by whichever view registered itself (``jupyter_mesh``
        registers its UI's); None leaves the plain ``repr``."""
        view = slots.value_mesh_view
        return None if view is None else view(self)
