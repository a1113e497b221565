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

import functools
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from .context import context, message
from .shape import Extent, Point

__all__ = [
    "Actor",
    "AsyncEndpoint",
    "Endpoint",
    "SyncEndpoint",
    "concurrent_endpoint",
    "current_rank",
    "endpoint",
    "endpoints_of",
]

P = ParamSpec("P")
R = TypeVar("R")


class Endpoint(Generic[P, R]):
    """What ``@endpoint`` leaves on the class: the function plus how to run it.

    ``P`` are the parameters after ``self``, ``R`` the result a caller receives (for ``async def``, what
    the coroutine returns). The two kinds differ only in what an instance reads: :class:`SyncEndpoint`
    and :class:`AsyncEndpoint`.
    """

    def __init__(self, fn: Callable[..., Any], explicit_response_port: bool = False, concurrent: bool = False):
        self.fn = fn
        self.name: str = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        # the method's first argument (after self) is the Port its reply goes through (Monarch's option)
        self.explicit_port = explicit_response_port
        # runs as a task beside the actor's other messages instead of one after another
        self.concurrent = concurrent
        self.propagate: Callable[..., Any] | None = None  # the result's shape, for ``.rref()``

    @property
    def _explicit_response_port(self) -> bool:  # Monarch's attribute: concurrent endpoints reply through a port
        return self.explicit_port or self.concurrent

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
@overload
def endpoint(
    fn: None = None, *, explicit_response_port: bool = False, propagate: Any = None, instrument: bool = True
) -> Callable[[Callable[..., Any]], Endpoint[..., Any]]: ...
def endpoint(
    fn: Callable[..., Any] | None = None,
    *,
    explicit_response_port: bool = False,
    propagate: Any = None,
    instrument: bool = True,
) -> Any:
    """Mark a method (``def`` or ``async def``) as callable from other processes.

    ``@endpoint(explicit_response_port=True)``: the method gets a ``Port`` as its first argument (after
    ``self``) and answers through it, now or later, from any thread (its return value is ignored).
    ``propagate`` is Monarch's tensor-engine option: ``f(*meta_args)`` gives the shape of the result,
    which ``actor_mesh.ep.rref(...)`` needs to return a distributed tensor without waiting.
    ``instrument`` is Monarch's telemetry switch: accepted, without effect (no telemetry here).
    """
    if fn is None:
        return lambda f: endpoint(f, explicit_response_port=explicit_response_port, propagate=propagate)
    if isinstance(fn, Endpoint):
        raise TypeError(f"{fn.name} is already an endpoint; use @endpoint once")
    if not callable(fn):
        raise TypeError(f"@endpoint decorates a function, got {type(fn).__name__}")
    kind = AsyncEndpoint if inspect.iscoroutinefunction(fn) else SyncEndpoint
    ep: Endpoint[..., Any] = kind(fn, explicit_response_port)
    ep.propagate = propagate
    return ep


def concurrent_endpoint(
    fn: Callable[..., Any] | None = None, *, explicit_response_port: bool = False, instrument: bool = True
) -> Any:
    """An ``async def`` endpoint whose calls run as tasks beside the actor's other messages (Monarch's
    ``concurrent_endpoint``): the actor takes its next message while one waits. Its calls start in
    order; they may finish in any order. ``instrument``: as for :func:`endpoint`, without effect."""
    if fn is None:
        return lambda f: concurrent_endpoint(f, explicit_response_port=explicit_response_port)
    if isinstance(fn, Endpoint):
        raise ValueError(f"@concurrent_endpoint does not wrap @endpoint ({fn.name}): use it instead of @endpoint")
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(
            f"@concurrent_endpoint can only wrap async endpoints; make {getattr(fn, '__name__', fn)} an async def"
        )
    return AsyncEndpoint(fn, explicit_response_port, concurrent=True)


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

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class (Monarch's ``Actor.logger``)."""
        return logging.getLogger(type(self).__name__)


_NO_RANK = Point(0, Extent((), ()))


def current_rank() -> Point:
    """Monarch's: during a call, the actor's point in the mesh or slice the call was sent to
    (``a.slice(gpus=1).f.call()`` numbers its actors from 0, ``call_one`` on one point gives ``{}``);
    elsewhere (``__init__``), its point in the mesh it was spawned on, as sliced, flattened or renamed.
    An empty point outside actors."""
    host = context().actor.host
    return host.rank_in(message.get()) if host is not None else _NO_RANK
