"""Named n-dimensional shapes over a flat rank space, and the points inside them.

A mesh of procs is a row-major grid of ranks 0..N-1. Every view of it (a slice, a renamed or flattened
mesh) is a :class:`Shape`: dim labels plus an affine :class:`Slice` (offset, sizes, strides) that maps
coordinates to those global ranks. Views never copy; they only compute ranks. Pure Python, no I/O.
"""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import MeshDimTypeError, MeshIndexError, MeshValueError

__all__ = ["Extent", "Point", "Shape", "Slice"]


@dataclass(frozen=True)
class Slice:
    """An affine subset of a flat rank space: rank = offset + sum(coord[i] * strides[i])."""

    offset: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]

    def __post_init__(self) -> None:  # Monarch's ``Slice(offset=0, sizes=[2], strides=[1])`` takes lists
        object.__setattr__(self, "sizes", tuple(self.sizes))
        object.__setattr__(self, "strides", tuple(self.strides))

    @staticmethod
    def row_major(sizes: Sequence[int], offset: int = 0) -> Slice:
        strides, acc = [], 1
        for s in reversed(sizes):
            strides.append(acc)
            acc *= s
        return Slice(offset, tuple(sizes), tuple(reversed(strides)))

    def __len__(self) -> int:
        return math.prod(self.sizes)

    def rank_of(self, coords: Sequence[int]) -> int:
        return self.offset + sum(c * s for c, s in zip(coords, self.strides))

    def coords_of(self, index: int) -> tuple[int, ...]:
        """Coordinates of the ``index``-th element in row-major order of this slice."""
        out = []
        for size in reversed(self.sizes):
            out.append(index % size)
            index //= size
        return tuple(reversed(out))

    def ranks(self) -> list[int]:
        return list(self._ranks)

    @functools.cached_property
    def _ranks(self) -> tuple[int, ...]:  # a view's ranks never change: computed once per call site's view
        return tuple(self.rank_of(self.coords_of(i)) for i in range(len(self)))

    def index_of(self, rank: int) -> int | None:
        """Position of global ``rank`` in this slice's row-major order, or None if it is not in it."""
        rem = rank - self.offset
        if rem < 0:
            return None
        # strides of a view are a permutation-free subset of row-major strides: greedy from the largest
        order = sorted(range(len(self.sizes)), key=lambda i: -self.strides[i])
        coords = [0] * len(self.sizes)
        for i in order:
            st = self.strides[i]
            c = rem // st if st else 0
            if c >= self.sizes[i]:
                c = self.sizes[i] - 1
            coords[i] = c
            rem -= c * st
        if rem != 0:
            return None
        idx = 0
        for c, size in zip(coords, self.sizes):
            idx = idx * size + c
        return idx

    def to_wire(self) -> list[Any]:
        return [self.offset, list(self.sizes), list(self.strides)]

    @staticmethod
    def from_wire(w: Sequence[Any]) -> Slice:
        return Slice(int(w[0]), tuple(w[1]), tuple(w[2]))


class Extent(Mapping[str, int]):
    """Dim label -> size, in order. ``Extent(["hosts", "gpus"], [1, 4])``."""

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]):
        self.labels, self.sizes = tuple(labels), tuple(sizes)

    def __getitem__(self, key: str) -> int:
        try:
            return self.sizes[self.labels.index(key)]
        except ValueError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def nelements(self) -> int:
        """How many points it holds (Monarch's name)."""
        return math.prod(self.sizes)

    nelem = nelements

    def __repr__(self) -> str:
        """As Monarch prints one: ``{hosts: 2, gpus: 4}``."""
        return "{" + ", ".join(f"{k}: {v}" for k, v in zip(self.labels, self.sizes)) + "}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Extent, (self.labels, self.sizes))


class Point(Mapping[str, int]):
    """Coordinates of one member of a shape; ``rank`` is its row-major index within that shape."""

    def __init__(self, rank: int, extent: Extent):
        self.rank, self.extent = rank, extent
        sl = Slice.row_major(extent.sizes)
        self._coords = sl.coords_of(rank) if extent.labels else ()

    def __getitem__(self, key: str) -> int:
        try:
            return self._coords[self.extent.labels.index(key)]
        except ValueError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.extent.labels)

    def __len__(self) -> int:
        return len(self.extent.labels)

    def size(self, label: str) -> int:
        """The size of dim ``label`` of the shape this point is in (Monarch's ``Point.size``)."""
        if label not in self.extent.labels:
            raise MeshValueError(f"Dimension '{label}' not found; this point has dims {list(self.extent.labels)}")
        return self.extent[label]

    def __repr__(self) -> str:
        """As Monarch prints a rank: ``{'hosts': 0/1, 'gpus': 3/4}`` (coordinate/size per dim; ``.rank`` is
        the row-major index)."""
        sizes = dict(zip(self.extent.labels, self.extent.sizes))
        return "{" + ", ".join(f"'{k}': {v}/{sizes[k]}" for k, v in self.items()) + "}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Point, (self.rank, self.extent))


@dataclass(frozen=True)
class Shape:
    """Dim labels over a :class:`Slice` of global ranks."""

    labels: tuple[str, ...]
    slice: Slice

    def __post_init__(self) -> None:  # Monarch's ``Shape(["gpus"], Slice(...))`` takes a list
        object.__setattr__(self, "labels", tuple(self.labels))

    @staticmethod
    def from_sizes(sizes: Mapping[str, int]) -> Shape:
        for k, v in sizes.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MeshValueError(f"dim '{k}' must have a positive integer size, got {v!r}")
        return Shape(tuple(sizes), Slice.row_major(list(sizes.values())))

    @property
    def extent(self) -> Extent:
        return Extent(self.labels, self.slice.sizes)

    def __len__(self) -> int:
        return len(self.slice)

    def ranks(self) -> list[int]:
        return self.slice.ranks()

    def point(self, index: int) -> Point:
        return Point(index, self.extent)

    def _dim(self, name: str, error: type[MeshValueError] = MeshValueError) -> int:
        try:
            return self.labels.index(name)
        except ValueError:
            raise error(f"unknown dim '{name}'; this mesh has dims {list(self.labels)}") from None

    def select(self, **dims: int | builtins.slice) -> Shape:
        """Monarch's ``slice``: an int keeps one coordinate and drops the dim; a ``slice`` keeps the dim."""
        labels = list(self.labels)
        offset, sizes, strides = self.slice.offset, list(self.slice.sizes), list(self.slice.strides)
        drop: list[int] = []
        for name, sel in dims.items():
            i = self._dim(name, MeshDimTypeError)  # Monarch's TypeError there
            size = sizes[i]
            if isinstance(sel, bool) or not isinstance(sel, (int, slice)):
                raise MeshValueError(f"slice({name}=...) takes an int or a slice, got {type(sel).__name__}")
            if isinstance(sel, int):
                idx = sel + size if sel < 0 else sel
                if not 0 <= idx < size:
                    raise MeshIndexError(f"index {sel} out of range for dim '{name}' of size {size}")
                offset += idx * strides[i]
                drop.append(i)
            else:
                start, stop, step = sel.indices(size)
                if step <= 0:
                    raise MeshValueError(f"dim '{name}': only positive slice steps are supported")
                n = len(range(start, stop, step))
                if n == 0:
                    raise MeshValueError(f"slice {sel} of dim '{name}' (size {size}) selects nothing")
                offset += start * strides[i]
                sizes[i], strides[i] = n, strides[i] * step
        keep = [i for i in range(len(labels)) if i not in drop]
        return Shape(
            tuple(labels[i] for i in keep),
            Slice(offset, tuple(sizes[i] for i in keep), tuple(strides[i] for i in keep)),
        )

    def rename(self, **names: str) -> Shape:
        for old in names:
            self._dim(old)
        labels = tuple(names.get(lbl, lbl) for lbl in self.labels)
        if len(set(labels)) != len(labels):
            raise MeshValueError(f"rename would produce duplicate dims: {list(labels)}")
        return Shape(labels, self.slice)

    def flatten(self, name: str) -> Shape:
        """Collapse all dims into one named ``name`` (only for views whose ranks form one stride)."""
        sl = self.slice
        if not self.labels:
            return Shape((name,), Slice(sl.offset, (1,), (1,)))
        for i in range(len(sl.sizes) - 1):
            if sl.strides[i] != sl.strides[i + 1] * sl.sizes[i + 1]:
                raise MeshValueError(
                    f"cannot flatten dims {list(self.labels)}: this view is not contiguous "
                    "(slice with step or a partial inner dim); flatten the parent mesh, then slice"
                )
        return Shape((name,), Slice(sl.offset, (len(sl),), (sl.strides[-1],)))

    def split(self, **spec: Any) -> Shape:
        """``split(gpus=("dp", "tp"), tp=2)``: replace a dim by several; give all sizes but one."""
        splits = {k: tuple(v) for k, v in spec.items() if isinstance(v, (tuple, list))}
        given = {k: v for k, v in spec.items() if k not in splits}
        unknown = [k for k in splits if k not in self.labels]
        if unknown:
            raise MeshValueError(f"unknown dims to split: {unknown}; dims are {list(self.labels)}")
        produced = {n for names in splits.values() for n in names}
        stray = [k for k in given if k not in produced]
        if stray:
            raise MeshValueError(f"sizes given for dims the split does not produce: {stray}")
        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        for i, lbl in enumerate(self.labels):
            total, stride = self.slice.sizes[i], self.slice.strides[i]
            if lbl not in splits:
                labels.append(lbl)
                sizes.append(total)
                strides.append(stride)
                continue
            names = splits[lbl]
            open_dims = [n for n in names if n not in given]
            if len(open_dims) > 1:
                raise MeshValueError(f"split of '{lbl}': give the size of all but one of {list(names)}")
            known = math.prod(given[n] for n in names if n in given)
            if known <= 0 or total % known:
                raise MeshValueError(f"split of '{lbl}' (size {total}) by sizes {given} does not divide")
            full = [given.get(n, total // known) for n in names]
            if math.prod(full) != total:
                raise MeshValueError(f"split of '{lbl}' (size {total}) into {dict(zip(names, full))} does not match")
            inner = Slice.row_major(full).strides
            labels += names
            sizes += full
            strides += [s * stride for s in inner]
        if len(set(labels)) != len(labels):
            raise MeshValueError(f"split would produce duplicate dims: {labels}")
        return Shape(tuple(labels), Slice(self.slice.offset, tuple(sizes), tuple(strides)))

    def to_wire(self) -> list[Any]:
        return [list(self.labels), self.slice.to_wire()]

    @staticmethod
    def from_wire(w: Sequence[Any]) -> Shape:
        return Shape(tuple(w[0]), Slice.from_wire(w[1]))

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}: {v}" for k, v in zip(self.labels, self.slice.sizes)) + "}"
