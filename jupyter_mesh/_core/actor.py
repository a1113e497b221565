"""Actors and endpoints as the user writes them (the class side; meshes of them live in ``_api.mesh``).

An ``Actor`` is a plain Python class; methods decorated with :func:`endpoint` are what other
processes may call. Inside a running actor, :func:`current_rank` gives its coordinates.

Endpoints are typed: ``@endpoint`` on ``def f(self, x: int) -> str`` gives an ``Endpoint[[int], str]``
(``async def`` too: ``R`` is what the coroutine returns). Read on the class, it is that descriptor; read on
an actor instance, it is the plain bound method, so local calls stay local and keep their signature.
What a *mesh* of the actor makes of it (``MeshEndpoint[[int], str]``) is the mypy plugin's work
(``jupyter_mesh.mypy_plugin``): a mesh's attributes are looked up at run time, beyond what annotations say.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from .context import context
from .shape import Extent, Point

__all__ = ["Actor", "AsyncEndpoint", "Endpoint", "SyncEndpoint", "current_rank", "endpoint", "endpoints_of"]

P = ParamSpec("P")
R = TypeVar("R")


class Endpoint(Generic[P, R]):
    """What ``@endpoint`` leaves on the class: the function plus how to run it.

    ``P`` are the parameters after ``self``, ``R`` the result a caller receives (for ``async def``, what
    the coroutine returns). The two kinds differ only in what an instance reads: :class:`SyncEndpoint`
    and :class:`AsyncEndpoint`.
    """

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.name: str = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Endpoint[P, R]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Callable[P, Any]: ...
    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        # On an actor instance, an endpoint is just its method: local calls stay local.
        return self if obj is None else self.fn.__get__(obj, objtype)

    def __repr__(self) -> str:
        return f"<endpoint {self.name}>"


class SyncEndpoint(Endpoint[P, R]):
    """A ``def`` endpoint: an instance reads the bound method, returning ``R``."""

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> SyncEndpoint[P, R]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Callable[P, R]: ...
    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        return self if obj is None else self.fn.__get__(obj, objtype)


class AsyncEndpoint(Endpoint[P, R]):
    """An ``async def`` endpoint: an instance reads the bound method, returning a coroutine of ``R``."""

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> AsyncEndpoint[P, R]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Callable[P, Coroutine[Any, Any, R]]: ...
    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        return self if obj is None else self.fn.__get__(obj, objtype)


# mypy calls these two overlapping, since an ``async def`` also fits the second one (with R the coroutine);
# the first one wins for it, statically as at run time, which is the order wanted.
@overload
def endpoint(fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> AsyncEndpoint[P, R]: ...  # type: ignore[overload-overlap]
@overload
def endpoint(fn: Callable[Concatenate[Any, P], R]) -> SyncEndpoint[P, R]: ...
def endpoint(fn: Callable[..., Any]) -> Endpoint[..., Any]:
    """Mark a method (``def`` or ``async def``) as callable from other processes."""
    if not callable(fn):
        raise TypeError(f"@endpoint decorates a function, got {type(fn).__name__}")
    return AsyncEndpoint(fn) if inspect.iscoroutinefunction(fn) else SyncEndpoint(fn)


def endpoints_of(cls: type) -> dict[str, Endpoint[..., Any]]:
    out: dict[str, Endpoint[..., Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, Endpoint):
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
