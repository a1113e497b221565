"""The mesh hierarchy a user holds: (HostMesh, in ``host_mesh``) -> ProcMesh (in ``proc_mesh``) ->
ActorMesh, here, with its mesh-bound endpoints.

These objects describe *what* to talk to (shapes, ids, routing addresses) and forward every operation
to the process's runtime client (``_runtime.client``), imported lazily so the core stays free of
sockets. ActorMeshes are small picklable values: pass them to other actors and call them from there.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Iterator, Mapping, Set
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from .._core import slots
from .._core.actor import Actor
from .._core.context import context
from .._core.future import Future
from .._core.plain_methods import plain_endpoint
from .._core.refs import ProcMeshRef
from .._core.shape import Extent, Shape
from .._core.signatures import Signatures
from .._core.value_mesh import ValueMesh
from ..errors import MeshKeyError, MeshValueError, SupervisionError

if TYPE_CHECKING:
    from .._runtime.client import Client

__all__ = ["ActorMesh", "MeshEndpoint", "NotAnEndpoint", "as_endpoint"]

A = TypeVar("A", bound=Actor)
P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound="_MeshTrait")
_names = itertools.count()


_current_client: Callable[[], Client] | None = None


def _client() -> Client:
    global _current_client
    if _current_client is None:  # imported on first use: the core imports no runtime at import time
        from .._runtime.client import current_client

        _current_client = current_client
    return _current_client()


class _MeshTrait(abc.ABC):
    """Shape operations shared by every mesh: they return views that share the same processes."""

    @property
    @abc.abstractmethod
    def _shape(self) -> Shape:
        """The view this mesh object covers."""

    @abc.abstractmethod
    def _with_shape(self: M, shape: Shape) -> M:
        """The same kind of mesh over another view of the same processes."""

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self._shape.extent)

    def size(self, dim: str | None = None) -> int:
        if dim is None:
            return len(self._shape)
        if dim not in self._shape.labels:  # Monarch's KeyError
            raise MeshKeyError(f"unknown dim '{dim}'; this mesh has dims {list(self._shape.labels)}")
        return self._shape.extent[dim]

    def __len__(self) -> int:
        return len(self._shape)

    def slice(self: M, **dims: int | slice) -> M:
        """A sub-mesh: ``slice(gpus=0)`` drops the dim, ``slice(gpus=slice(0, 2))`` keeps it."""
        return self._with_shape(self._shape.select(**dims))

    def rename(self: M, **names: str) -> M:
        return self._with_shape(self._shape.rename(**names))

    def flatten(self: M, name: str) -> M:
        return self._with_shape(self._shape.flatten(name))

    def split(self: M, **spec: Any) -> M:
        return self._with_shape(self._shape.split(**spec))


class _hidden_by_endpoint(Generic[R]):
    """A read-only property that an endpoint of the same name hides: the actor's ``name`` endpoint
    wins, as in Monarch (whose ActorMesh has no ``name``). A non-data descriptor, so the endpoint the
    instance holds under that name is found first."""

    def __init__(self, fget: Callable[[Any], R]):
        self.fget, self.__doc__ = fget, fget.__doc__

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _hidden_by_endpoint[R]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> R: ...
    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        return self if obj is None else self.fget(obj)


_ENDPOINT_WINS = frozenset({"name", "stop"})
"""ActorMesh attributes an endpoint of the same name hides (Monarch has no ``name``; ``stop`` we allow on
purpose, README's table). An endpoint named like any other attribute is refused at spawn, as in Monarch."""


def shadowed(mesh: ActorMesh[Any], endpoint_names: Set[str]) -> list[str]:
    """The endpoints that an ActorMesh attribute would hide (``size``, ``slice``, ``initialized``, ...)."""
    own = {k for k, v in vars(mesh).items() if not isinstance(v, MeshEndpoint)}  # (not endpoints it keeps)
    taken = (set(dir(type(mesh))) | own) - _ENDPOINT_WINS
    return sorted(endpoint_names & taken)


def endpoints_win(mesh: ActorMesh[Any]) -> None:
    """``mesh.name`` / ``mesh.stop`` are the actor's endpoints of those names where it has them (again
    after ``%mesh reload`` changed its endpoints)."""
    for wins in _ENDPOINT_WINS:
        if wins in mesh._endpoint_names:
            mesh.__dict__[wins] = MeshEndpoint(mesh, wins)
        else:
            mesh.__dict__.pop(wins, None)


def _refuse_shadowed(mesh: ActorMesh[Any], cls: type) -> None:
    """Monarch's ``ValueError`` at spawn for an endpoint that an ActorMesh attribute would hide (``size``,
    ``slice``, ``initialized``, ...): called through the mesh it would never run, or would fail later
    with a puzzling error."""
    clash = shadowed(mesh, mesh._endpoint_names)
    if clash:
        name = clash[0]
        raise MeshValueError(
            f"{cls.__qualname__} has an endpoint named '{name}', which collides with the ActorMesh attribute "
            f"'{name}' (mesh.{name} would not reach the endpoint); rename the endpoint, e.g. '{name}_'"
            + (f" (also: {', '.join(clash[1:])})" if clash[1:] else "")
        )


class ActorMesh(_MeshTrait, Generic[A]):
    """A mesh of actors of one class, one per proc of a (view of a) proc mesh.

    Attribute access gives mesh-bound endpoints: ``mesh.step.call(x)``. Annotations alone cannot say
    which attribute is which endpoint, so they type it ``MeshEndpoint[..., Any]``; the mypy plugin
    (``jupyter_mesh.mypy_plugin``) gives ``mesh.step`` the parameters and result of ``A.step``.
    """

    _actor_class: type | None = None  # in the spawning process: its endpoints' ``propagate`` (``rref``)
    _plain: Mapping[str, bool] = {}  # methods called through ``as_endpoint``: name -> explicit response port

    def __init__(
        self,
        ref: ProcMeshRef,
        actor_id: str,
        name: str,
        class_name: str,
        endpoint_names: frozenset[str],
        view: Shape | None,
        sigs: Signatures | None = None,
        sliced: bool = False,
    ):
        self._ref, self._actor_id, self._name = ref, actor_id, name
        self._class_name, self._endpoint_names = class_name, endpoint_names
        self._sigs = sigs  # the endpoints' parameters, to check a call's arguments here (None: unknown)
        self._view = view  # None: the whole proc mesh, following it when it grows or shrinks
        # a slice (or other view) of the actor mesh as spawned: its calls carry its labels, and the
        # actors number themselves in it during them (Monarch's ``current_rank()``)
        self._sliced = sliced
        self.initialized: Future[None] | None = None  # set by ProcMesh.spawn in the spawning process
        endpoints_win(self)  # the actor's own endpoint hides ActorMesh.stop, .name

    @property
    def _shape(self) -> Shape:
        return self._ref.shape if self._view is None else self._view

    def _with_shape(self, shape: Shape) -> ActorMesh[A]:
        m: ActorMesh[A] = ActorMesh(
            self._ref, self._actor_id, self._name, self._class_name, self._endpoint_names, shape, self._sigs, True
        )
        m.initialized, m._actor_class = self.initialized, self._actor_class
        return m

    def _has_endpoint(self, name: str) -> bool:
        own = self.__dict__  # (not through attributes: this runs in __getattr__, maybe before __init__)
        if name in own.get("_endpoint_names", ()):
            return True
        sigs = own.get("_sigs")  # shared by its views: ``%mesh reload`` updates it in place, so a view
        return sigs is not None and name in sigs.specs  # made before the reload has its new endpoints

    def __getattr__(self, name: str) -> MeshEndpoint[..., Any]:
        if name.startswith("_") and not self._has_endpoint(name):  # (``_x`` and ``__x__`` endpoints: Monarch's)
            raise AttributeError(name)
        if not self._has_endpoint(name):
            if self._actor_class is not None and plain_endpoint(self._actor_class, name, False) is not None:
                return NotAnEndpoint(self, name)  # type: ignore[return-value]  # for as_endpoint(mesh.name)
            raise AttributeError(
                f"actor class {self._class_name} has no endpoint '{name}'; "
                f"its endpoints are {sorted(self._endpoint_names)} (did you forget @endpoint?)"
            )
        ep: MeshEndpoint[..., Any] = MeshEndpoint(self, name)
        self.__dict__[name] = ep  # ``mesh.step`` again finds it at once (no failed lookup, no new object)
        return ep

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | self._endpoint_names)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            ActorMesh,
            (
                self._ref,
                self._actor_id,
                self._name,
                self._class_name,
                self._endpoint_names,
                self._view,
                self._sigs,
                self._sliced,
            ),
        )

    @_hidden_by_endpoint
    def name(self) -> str:
        """The name it was spawned with (``ActorMesh.name.__get__(mesh)`` where an endpoint is named ``name``)."""
        return self._name

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop these actors (Monarch's ``ActorMesh.stop``): each stops after the calls this process
        sent it before; tasks it left running are cancelled and its ``__cleanup__(None)`` runs; then
        it answers every later call with ``SupervisionError`` (kind ``stopped``);
        their procs, and other actors there, live on. ``reason`` is Monarch's argument, unused.
        (An actor class with an endpoint named ``stop`` keeps it: then ``mesh.stop`` is that endpoint,
        and ``ActorMesh.stop(mesh)`` this.)"""
        from .._wire.protocol import STOP_ENDPOINT

        done: Future[None] = Future(f"stop of actor mesh '{self._name}'")
        stopping = _client().hooks.actors_stopping
        if stopping is not None:  # its owner (an actor) no longer hears of these procs' deaths
            stopping(self._actor_id, self._shape.ranks())
        try:
            calls = _client().cast(self, STOP_ENDPOINT, (), {}, mode="call")
        except SupervisionError:  # its procs are stopped or dead: so are these actors
            return Future.completed(None, done._what)

        def copy(f: Future[Any]) -> None:
            err = f.exception(0)
            if err is None or isinstance(err, SupervisionError):  # a dead actor is stopped too
                done._set_result(None)
            else:
                done._set_exception(err)

        calls.add_done_callback(copy)
        return done

    def __repr__(self) -> str:
        return f"<ActorMesh '{self._name}' {self._class_name} {self._shape}>"


class MeshEndpoint(Generic[P, R]):
    """An endpoint bound to a mesh (or slice): the five ways to call it.

    ``P`` and ``R`` are the endpoint's parameters (after ``self``) and result, as in ``Endpoint[P, R]``.
    """

    def __init__(self, mesh: ActorMesh[Any], name: str):
        self._mesh, self._name = mesh, name

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A ``TypeError`` here, before anything is sent, for arguments the endpoint does not take."""
        sigs = self._mesh._sigs
        if sigs is not None:
            check = sigs.checker(self._name)
            if check is not None:
                try:
                    check(*args, **kwargs)
                except TypeError:
                    raise sigs.refusal(self._name, args, kwargs) from None

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Call every actor; the future gives a ValueMesh with one result per actor."""
        self._bind(args, kwargs)
        return _client().cast(self._mesh, self._name, args, kwargs, mode="call")

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the single actor of this mesh; an error unless the mesh has exactly one actor."""
        n = len(self._mesh._shape)
        if n != 1:
            raise MeshValueError(
                f"call_one() needs a mesh of exactly one actor, this one has {n} "
                f"{self._mesh._shape}; slice it first, e.g. .slice({self._mesh._shape.labels[-1]}=0)"
            )
        self._bind(args, kwargs)
        rank = self._mesh._shape.slice.offset
        return _client().call_rank(self._mesh, rank, self._name, args, kwargs)

    def _call_at(self, rank: int, args: Any, kwargs: Any) -> Future[R]:
        """Call the actor at global ``rank``, numbered during the call in this mesh (the tensor engine's
        ``.rref``: each proc calls its own actor, as if the call went to the whole mesh)."""
        if self._mesh._shape.slice.index_of(rank) is None:
            raise MeshValueError(f"proc rank {rank} is not in {self!r}")
        return _client().call_rank(self._mesh, rank, self._name, args, kwargs, of_view=True)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one actor of the mesh, picked to balance load (fewest calls in flight from here)."""
        self._bind(args, kwargs)
        return _client().choose(self._mesh, self._name, args, kwargs)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Iterator[Future[R]]:
        """Call every actor; yield completed futures as replies arrive (fastest first)."""
        self._bind(args, kwargs)
        return _client().cast(self._mesh, self._name, args, kwargs, mode="stream")

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Call every actor without waiting for or receiving results (errors are logged remotely)."""
        self._bind(args, kwargs)
        _client().cast(self._mesh, self._name, args, kwargs, mode="broadcast")

    def reduce(self, op: str | Callable[[Any, Any], Any], /, *args: P.args, **kwargs: P.kwargs) -> Future[Any]:
        """Call every actor and fold the results into one value: ``op`` is ``"sum"``, ``"prod"``, ``"min"``,
        ``"max"`` (numbers, tensors, arrays: elementwise) or an associative, commutative ``f(a, b)``. The
        host agents fold on the way back, so the caller receives one value per subtree, not per actor."""
        self._bind(args, kwargs)
        return _client().cast(self._mesh, self._name, args, kwargs, mode="reduce", op=op)  # type: ignore[no-any-return]

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Call every actor; each result stays on its proc as a shard of the distributed tensor returned
        at once (Monarch's tensor engine; the endpoint declares its result's shape with ``propagate=``)."""
        from .tensor_engine import rref

        self._bind(args, kwargs)
        assert slots.proc_mesh_from_ref is not None, "the facade (jupyter_mesh/__init__) fills this slot"
        return rref(self, slots.proc_mesh_from_ref(self._mesh._ref), args, kwargs)

    def __repr__(self) -> str:
        return f"<endpoint {self._mesh._class_name}.{self._name} on {self._mesh._shape}>"


class NotAnEndpoint:
    """``mesh.method`` of a method that is not an ``@endpoint`` (Monarch's): calling it says what to do;
    :func:`as_endpoint` makes an endpoint of it. Known in the process that spawned the mesh (which has
    its class)."""

    def __init__(self, mesh: ActorMesh[Any], name: str):
        self._mesh, self._name = mesh, name

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            f"Actor {self._mesh._class_name}.{self._name} is not annotated as an endpoint. To call it as one, add "
            f"an @endpoint decorator to it, or wrap it: as_endpoint(mesh.{self._name}).call(...)"
        )


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> MeshEndpoint[..., Any]:
    """Monarch's: call an actor's method that is not an ``@endpoint`` through the adverbs,
    ``as_endpoint(mesh.method).call(...)``; ``explicit_response_port=True``: it takes a ``Port`` first and
    answers through it. ``propagate`` is accepted, as for :func:`endpoint`."""
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise MeshValueError(
            "as_endpoint() takes a method of a spawned actor mesh that is not an @endpoint, as "
            f"as_endpoint(mesh.method) in the program that spawned it; got {not_an_endpoint!r}"
        )
    mesh, name = not_an_endpoint._mesh, not_an_endpoint._name
    view = mesh._with_shape(mesh._shape)  # a copy: the mark is its own
    view._plain = {**mesh._plain, name: bool(explicit_response_port)}
    return MeshEndpoint(view, name)


def _owned_by_caller(kind: str, mesh: Any) -> None:
    """Spawned inside an actor: that actor owns the mesh, which stops when the actor stops or dies."""
    host = context().actor.host
    if host is not None:
        host.own(kind, mesh)
