"""A minimal tensor engine under Monarch's names: ``ProcMesh.activate()``, ``fetch_shard``, ``remote``,
``endpoint.rref``.

Inside ``with procs.activate():`` torch calls make *distributed tensors*: one shard per proc of the mesh,
computed there; outside, any torch op on a distributed tensor runs on its mesh too. The controller
only computes shapes (on meta tensors) and sends one message per op per mesh; it never waits for the
workers. ``fetch_shard(t, gpus=1).get()`` reads one proc's shard. Passed to an actor on the same procs,
a distributed tensor arrives as that proc's shard.

Modules: ``tensor`` (the controller's ``DistributedTensor``, dispatch, the activation mode), ``engine``
(one per proc mesh: its worker actors, ids, batched deletes), ``worker`` (the proc side: ref store, ops).
Importing this package does not import torch; activating or fetching does.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

from ..._core.future import Future
from ...errors import MeshValueError

__all__ = ["Activation", "Remote", "activate", "fetch_shard", "remote", "rref"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class _Active(threading.local):
    def __init__(self) -> None:
        self.meshes: list[Any] = []


_active = _Active()


class Activation:
    """``with procs.activate():`` — torch calls in the block run on ``procs`` (nests; undone on error)."""

    def __init__(self, pm: Any):
        self.pm = pm
        self._modes: list[Any] = []

    def __enter__(self) -> Any:
        from .tensor import Mode

        mode = Mode(self.pm)  # spawns the mesh's tensor workers on first use; raises if it is stopped
        mode.__enter__()
        self._modes.append(mode)
        _active.meshes.append(self.pm)
        return self.pm

    def __exit__(self, *exc: object) -> None:
        _active.meshes.pop()
        self._modes.pop().__exit__(*exc)


def activate(pm: Any) -> Activation:
    return Activation(pm)


def fetch_shard(obj: T, shard: dict[str, int] | None = None, **coords: int) -> Future[T]:
    """The shard of every distributed tensor in ``obj`` (a tensor, or lists/tuples/dicts of them) on the
    proc at ``shard``/``coords`` (``fetch_shard(t, hosts=0, gpus=1)``; missing dims are 0), as plain
    tensors. Waits for the ops that make them; one that failed raises ``ActorError`` naming the op,
    the proc and the remote traceback."""
    from .tensor import fetch

    where = dict(shard or {})
    where.update(coords)
    return fetch(obj, where)


def rref(endpoint: Any, pm: Any, args: Any, kwargs: Any) -> Any:
    from .tensor import rref as _rref

    return _rref(endpoint, pm, args, kwargs)


class Remote(Generic[P, R]):
    """A function that runs on the procs of the active mesh (``@remote``): ``f.call()`` gives a
    ``ValueMesh`` (one result per proc), ``f.broadcast()``, ``f.call_one()``, ``f.choose()``,
    ``send(f, args, kwargs, port=)``; ``f(*args)`` inside ``activate()`` gives a distributed tensor
    (shaped by ``propagate=``, else by running ``f`` on meta tensors here)."""

    def __init__(self, fn: Callable[P, R] | str, propagate: Callable[..., Any] | None = None):
        self._fn = fn
        self._propagate = propagate
        self.__name__ = fn.rpartition(".")[2] if isinstance(fn, str) else getattr(fn, "__name__", "remote")
        self.__doc__ = None if isinstance(fn, str) else fn.__doc__

    def _spec(self) -> Any:
        return ("import", self._fn) if isinstance(self._fn, str) else self._fn

    def _workers(self, args: Any, kwargs: Any) -> tuple[Any, Any, Any]:
        tensor = sys.modules.get(__name__ + ".tensor")  # torch tensors exist only once it is loaded
        if tensor is not None:
            return tensor.remote_target(self, args, kwargs, _active.meshes[-1] if _active.meshes else None)
        if not _active.meshes:
            raise MeshValueError(
                f"{self.__name__} is a @remote function: call it inside `with proc_mesh.activate():` "
                "(it runs on that mesh's procs)"
            )
        from .engine import engine_for

        pm = _active.meshes[-1]
        return engine_for(pm).workers_for(pm._shape), args, kwargs

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[Any]:
        workers, a, k = self._workers(args, kwargs)
        return workers.call_remote.call(self._spec(), a, k)  # type: ignore[no-any-return]

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        workers, a, k = self._workers(args, kwargs)
        return workers.call_remote.call_one(self._spec(), a, k)  # type: ignore[no-any-return]

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        workers, a, k = self._workers(args, kwargs)
        return workers.call_remote.choose(self._spec(), a, k)  # type: ignore[no-any-return]

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        workers, a, k = self._workers(args, kwargs)
        workers.ops.broadcast([("call", self._spec(), a, k)])  # an error is printed there, never raised

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        from .tensor import run_remote

        return run_remote(self, args, kwargs, _active.meshes[-1] if _active.meshes else None)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<remote function {self.__name__}>"


def remote(fn: Any = None, *, propagate: Callable[..., Any] | None = None) -> Any:
    """Monarch's ``@remote`` / ``@remote(propagate=...)`` / ``remote("pkg.module.fn", propagate=...)``:
    a function to run on the procs of the active mesh (see :class:`Remote`)."""
    if fn is None:
        return lambda f: Remote(f, propagate)
    if not (callable(fn) or isinstance(fn, str)):
        raise TypeError(f"@remote decorates a function (or names one as 'module.fn'), got {type(fn).__name__}")
    return Remote(fn, propagate)
