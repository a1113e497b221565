"""Actors and endpoints as the user writes them (the class side; meshes of them live in ``_mesh``).

An ``Actor`` is a plain Python class; methods decorated with :func:`endpoint` are what other
processes may call. Inside a running actor, :func:`current_rank` gives its coordinates.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .context import context
from .shape import Extent, Point

__all__ = ["Actor", "EndpointDef", "current_rank", "endpoint", "endpoints_of"]

F = TypeVar("F", bound=Callable[..., Any])


class EndpointDef(Generic[F]):
    """What ``@endpoint`` leaves on the class: the function plus how to run it."""

    def __init__(self, fn: F):
        self.fn = fn
        self.name = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        # On an actor instance, an endpoint is just its method: local calls stay local.
        return self if obj is None else self.fn.__get__(obj, objtype)

    def __repr__(self) -> str:
        return f"<endpoint {self.name}>"


def endpoint(fn: F) -> F:
    """Mark a method (``def`` or ``async def``) as callable from other processes."""
    if not callable(fn):
        raise TypeError(f"@endpoint decorates a function, got {type(fn).__name__}")
    return EndpointDef(fn)  # type: ignore[return-value]


def endpoints_of(cls: type) -> dict[str, EndpointDef[Any]]:
    out: dict[str, EndpointDef[Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointDef):
                out[name] = value
            elif name in out:
                del out[name]  # overridden by a plain attribute
    return out


class Actor:
    """Base class of actors. Subclass it, add ``@endpoint`` methods, spawn it with ``ProcMesh.spawn``.

    An actor handles one message at a time, in the order each sender sent them.
    Optional hook: ``__supervise__(self, failure) -> bool`` for failures of meshes it spawned.
    """


_NO_RANK = Point(0, Extent((), ()))


def current_rank() -> Point:
    """Coordinates of the calling actor in its mesh (an empty point outside actors, as in Monarch)."""
    proc = context().actor.proc
    return proc.point if proc is not None else _NO_RANK
