"""``DistributedTensor``: a torch tensor whose values live on a proc mesh, one shard per proc.

The object here holds no data: it wraps a *meta* tensor (shape, dtype, strides) and a ref id. Every torch
function called on it (``__torch_function__``), or any torch call inside ``ProcMesh.activate()`` (a
``TorchFunctionMode``), runs first on the meta tensors here, which gives the outputs' shapes (and raises a
shape error at once, in the caller), then goes to the mesh as one message: the workers run it on their
shards. The caller never waits for them. Values come back only through ``fetch_shard``.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..._core.future import Future
from ..._core.shape import Shape
from ..._wire.serialize import destination
from ...errors import ActorError, MeshValueError
from .engine import MeshEngine, engine_for, next_id
from .worker import Ref, borrowed, describe_func

__all__ = ["DistributedTensor", "Mode", "dispatch", "fetch", "local", "remote_target", "rref", "run_remote"]

# answered from the meta tensor here, no message: they only read shape and type
_METADATA = frozenset(
    "size dim numel stride is_contiguous element_size __len__ ndimension nelement storage_offset "
    "is_floating_point is_complex is_signed get_device has_names type dim_order".split()
)
# they read values, which only the workers have
_VALUES = frozenset("item tolist numpy __bool__ __float__ __int__ __index__ __array__ __complex__".split())


class _Local(threading.local):
    depth = 0


_local_state = _Local()


@contextlib.contextmanager
def local() -> Iterator[None]:
    """Torch calls in this block run here, even inside ``activate()`` (our own bookkeeping uses it)."""
    _local_state.depth += 1
    try:
        yield
    finally:
        _local_state.depth -= 1


class DistributedTensor(torch.Tensor):
    """One tensor per proc of a mesh, used as one. ``fetch_shard(t, gpus=1).get()`` reads a shard."""

    _jm_meta: torch.Tensor
    _jm_engine: MeshEngine
    _jm_view: Shape
    _jm_ref: int

    @staticmethod
    def _new(meta: torch.Tensor, engine: MeshEngine, view: Shape) -> DistributedTensor:
        with local():
            t = torch.Tensor._make_subclass(DistributedTensor, meta.detach(), meta.requires_grad)
        t._jm_meta, t._jm_engine, t._jm_view, t._jm_ref = meta, engine, view, next_id()
        weakref.finalize(t, engine.drop, view, t._jm_ref)
        return t  # type: ignore[return-value]

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _local_state.depth:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        return dispatch(func, args, kwargs or {}, None)

    def _jm_where(self) -> str:
        return f"mesh '{self._jm_engine.name}' {self._jm_view}"

    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        with local():
            shape, dtype = tuple(self._jm_meta.shape), self._jm_meta.dtype
        return f"DistributedTensor(ref={self._jm_ref}, {self._jm_where()}, local shape={shape}, dtype={dtype})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce_ex__(self, protocol: Any) -> Any:  # type: ignore[override]
        """Passed to an actor: each receives its own proc's shard (lent by the engine first, so the call
        may overtake the ops that make it, and the tensor may be dropped right after the call)."""
        desc = f"distributed tensor ref {self._jm_ref}"
        ranks = self._jm_view.ranks()
        target = destination()  # an actor call's: its proc mesh and ranks (else: lent to every proc)
        if target is not None and target[0] != self._jm_engine.mesh_id:
            raise MeshValueError(
                f"{desc} lives on proc mesh '{self._jm_engine.name}', and this call goes to actors on another "
                "one: a distributed tensor reaches only actors spawned on the procs that hold its shards; "
                "spawn the actors there, or fetch_shard() it and pass the plain tensor"
            )
        takers = None if target is None else sorted(set(target[1]) & set(ranks))
        bid = self._jm_engine.lend(self._jm_view, self._jm_ref, takers)
        return (borrowed, (self._jm_engine.mesh_id, self._jm_engine.name, ranks, bid, desc))

    def reduce(  # type: ignore[override]
        self,
        dims: str | tuple[str, ...] | list[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
        _inplace: bool = False,
        out: Any = None,
    ) -> DistributedTensor:
        """Monarch's all-reduce over mesh ``dims``: each proc gets the ``reduction`` (sum, avg, product,
        min, max, stack) of the shards of the procs that differ from it only along ``dims``."""
        return reduce(self, dims, reduction, scatter, mesh, _inplace, out)

    def __deepcopy__(self, memo: Any) -> DistributedTensor:
        return dispatch(torch.Tensor.clone, (self,), {}, None)  # type: ignore[no-any-return]


def _home(dts: list[DistributedTensor], active: tuple[MeshEngine, Shape] | None, what: str) -> tuple[MeshEngine, Shape]:
    homes = {(d._jm_engine.mesh_id, tuple(d._jm_view.ranks()), tuple(d._jm_view.labels)): d for d in dts}
    if active is not None:
        homes.setdefault((active[0].mesh_id, tuple(active[1].ranks()), tuple(active[1].labels)), None)  # type: ignore[arg-type]
    if len(homes) > 1:
        wheres = sorted(
            d._jm_where() if d is not None else f"the active mesh '{active[0].name}' {active[1]}"  # type: ignore[index]
            for d in homes.values()
        )
        raise MeshValueError(
            f"{what} mixes distributed tensors of different meshes ({'; '.join(wheres)}): an op runs on one "
            "mesh; fetch_shard() a value and pass it as a plain tensor, or compute where the tensors live"
        )
    if dts:
        return dts[0]._jm_engine, dts[0]._jm_view
    assert active is not None
    return active


def _spec(func: Any) -> Any:
    """How the workers find ``func``: a property getter (``Tensor.T``) by name, anything else pickled."""
    if type(func).__name__ == "method-wrapper" and getattr(func, "__name__", "") == "__get__":
        return ("attr", func.__self__.__name__)
    return func


def dispatch(
    func: Any,
    args: Any,
    kwargs: dict[str, Any],
    active: tuple[MeshEngine, Shape] | None,
    shape_fn: Any = None,
    spec: Any = None,
) -> Any:
    """Run ``func`` on the mesh of its distributed arguments (or the active one): shapes here (by
    ``shape_fn``, else ``func`` itself on meta tensors), values there."""
    spec = _spec(func) if spec is None else spec
    name = describe_func(spec)
    with local():
        flat, tree = tree_flatten((args, kwargs))
        dts = [x for x in flat if isinstance(x, DistributedTensor)]
        if not dts and active is None:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        engine, view = _home(dts, active, name)
        short = name.rpartition(".")[2]
        if short in _VALUES:
            raise MeshValueError(
                f"{name} reads values of a distributed tensor ({engine.name}), which only its procs hold: "
                "fetch_shard(t, ...).get() gives one proc's shard as a plain tensor"
            )
        metas = [x._jm_meta if isinstance(x, DistributedTensor) else _meta_of(x) for x in flat]
        margs, mkwargs = tree_unflatten(metas, tree)
        if "device" in mkwargs:
            mkwargs["device"] = "meta"
        with torch.device("meta"):
            out = (shape_fn or func)(*margs, **mkwargs)
        outs, out_tree = tree_flatten(out)
        slots = [i for i, x in enumerate(outs) if isinstance(x, torch.Tensor)]
        if not slots and (isinstance(spec, tuple) or short in _METADATA):
            return out  # shape, dtype, size(), dim(): known here
        # an in-place op returns its input; a propagate= function that returns its argument does not
        inputs = {id(d._jm_meta): d for d in dts} if shape_fn is None else {}
        out_ids = []
        for i in slots:
            same = inputs.get(id(outs[i]))
            outs[i] = same if same is not None else DistributedTensor._new(_fresh(outs[i]), engine, view)
            out_ids.append(outs[i]._jm_ref)
        remote = [Ref(x._jm_ref) if isinstance(x, DistributedTensor) else x for x in flat]
        rargs, rkwargs = tree_unflatten(remote, tree)
        engine.send(view, [("run", spec, name, rargs, rkwargs, out_ids)])
        return tree_unflatten(outs, out_tree)


def _fresh(m: torch.Tensor) -> torch.Tensor:
    """A meta tensor of its own for a new distributed tensor (``m`` may be another one's)."""
    return torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device="meta", requires_grad=m.requires_grad)


def _meta_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to("meta")
    return x


class Mode(TorchFunctionMode):
    """Inside ``ProcMesh.activate()``: torch calls that make tensors from nothing (``torch.rand``) or
    take a distributed one run on the mesh."""

    def __init__(self, pm: Any):
        super().__init__()
        self.active = (engine_for(pm), pm._shape)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _local_state.depth or _only_local_tensors(args, kwargs):
            return func(*args, **kwargs)
        return dispatch(func, args, kwargs, self.active)


def _only_local_tensors(args: Any, kwargs: Any) -> bool:
    """A call on plain tensors and no distributed one stays here (printing a fetched shard, pickling
    an argument); calls with no tensor at all (``torch.rand(3)``) make distributed ones."""
    with local():
        flat = tree_flatten((args, kwargs))[0]
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    return bool(tensors) and not any(isinstance(x, DistributedTensor) for x in tensors)


def rref(endpoint: Any, pm: Any, args: Any, kwargs: Any) -> Any:
    """``actor_mesh.ep.rref(*args)``: call ``ep`` on every actor; each result stays on its proc, as the
    shard of the distributed tensor returned here (shaped by the endpoint's ``propagate=``)."""
    mesh = endpoint._mesh
    cls = getattr(mesh, "_actor_class", None)
    ep = getattr(cls, endpoint._name, None) if cls is not None else None
    propagate = getattr(ep, "propagate", None)
    what = f"{mesh._class_name}.{endpoint._name}.rref()"
    if propagate is None:
        raise MeshValueError(
            f"{what} needs the shape of its result: declare it with @endpoint(propagate=lambda *args: ...) "
            "(a function of the arguments' meta tensors that returns a tensor like the result)"
        )
    with local():
        flat, tree = tree_flatten((args, kwargs))
        dts = [x for x in flat if isinstance(x, DistributedTensor)]
        engine, view = _home(dts, (engine_for(pm), mesh._shape), what)
        if engine.mesh_id != mesh._ref.mesh_id:
            raise MeshValueError(
                f"{what}: the actors live on proc mesh '{mesh._ref.name}' but the tensors on '{engine.name}'"
            )
        margs, mkwargs = tree_unflatten(
            [x._jm_meta if isinstance(x, DistributedTensor) else _meta_of(x) for x in flat], tree
        )
        with torch.device("meta"):
            out = propagate(*margs, **mkwargs)
        outs, out_tree = tree_flatten(out)
        out_ids = []
        for i, x in enumerate(outs):
            if isinstance(x, torch.Tensor):
                outs[i] = DistributedTensor._new(_fresh(x), engine, view)
                out_ids.append(outs[i]._jm_ref)
        rargs, rkwargs = tree_unflatten([Ref(x._jm_ref) if isinstance(x, DistributedTensor) else x for x in flat], tree)
        engine.send(view, [("rref", mesh, endpoint._name, rargs, rkwargs, out_ids)])
        return tree_unflatten(outs, out_tree)


def fetch(obj: Any, coords: dict[str, int]) -> Future[Any]:
    """``fetch_shard``: one call to the worker of the proc at ``coords``, for every tensor in ``obj``."""
    with local():
        flat, tree = tree_flatten(obj)
    dts = [x for x in flat if isinstance(x, DistributedTensor)]
    if not dts:
        return Future.completed(obj, "fetch_shard")
    engine, view = _home(dts, None, "fetch_shard")
    inner = engine.fetch(view, coords, [d._jm_ref for d in dts])
    out: Future[Any] = Future("fetch_shard")

    def done(f: Future[list[Any]]) -> None:
        err = f.exception(0)
        if err is not None:
            out._set_exception(err)
            return
        shards = iter(f.get(0))
        values = list(flat)
        for i, x in enumerate(values):
            if isinstance(x, DistributedTensor):
                state, v = next(shards)
                if state == "failed":
                    out._set_exception(ActorError([v]))
                    return
                values[i] = v
        out._set_result(tree_unflatten(values, tree))

    inner.add_done_callback(done)
    return out


def _refs(args: Any, kwargs: Any) -> tuple[list[DistributedTensor], Any, Any]:
    with local():
        flat, tree = tree_flatten((args, kwargs))
        dts = [x for x in flat if isinstance(x, DistributedTensor)]
        a, k = tree_unflatten([Ref(x._jm_ref) if isinstance(x, DistributedTensor) else x for x in flat], tree)
    return dts, a, k


def remote_target(fn: Any, args: Any, kwargs: Any, pm: Any) -> tuple[Any, Any, Any]:
    """Where a ``@remote`` function's ``call``/``broadcast`` runs (the active mesh, or that of its
    distributed arguments), and its arguments with refs for those."""
    dts, a, k = _refs(args, kwargs)
    if not dts and pm is None:
        raise MeshValueError(
            f"{fn.__name__} is a @remote function: call it inside `with proc_mesh.activate():` "
            "(it runs on that mesh's procs), or pass it a distributed tensor"
        )
    engine, view = _home(dts, (engine_for(pm), pm._shape) if pm is not None else None, fn.__name__)
    return engine.workers_for(view), a, k


def run_remote(fn: Any, args: Any, kwargs: Any, pm: Any) -> Any:
    """``f(*args)`` of a ``@remote`` function: a distributed tensor (or a tree of them)."""
    active = (engine_for(pm), pm._shape) if pm is not None else None
    if active is None and not _refs(args, kwargs)[0]:
        raise MeshValueError(
            f"{fn.__name__}(...) makes a distributed tensor: call it inside `with proc_mesh.activate():`, "
            "or pass it a distributed tensor"
        )
    return dispatch(fn._fn, args, kwargs, active, shape_fn=fn._propagate or fn._fn, spec=fn._spec())


def reduce(t: DistributedTensor, dims: Any, reduction: str, scatter: bool, mesh: Any, inplace: bool, out: Any) -> Any:
    from .worker import REDUCTIONS

    names = (dims,) if isinstance(dims, str) else tuple(dims)
    view, engine = t._jm_view, t._jm_engine
    if scatter or mesh is not None or inplace or out is not None:
        raise MeshValueError("reduce(): scatter, mesh, _inplace and out are not supported here; reduce, then index")
    if reduction not in REDUCTIONS:
        raise MeshValueError(f"reduce(): reduction {reduction!r} is not one of {sorted(REDUCTIONS)}")
    unknown = [d for d in names if d not in view.labels]
    if unknown:
        raise MeshValueError(f"reduce(): {t._jm_where()} has dims {list(view.labels)}, not {unknown}")
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, r in enumerate(view.ranks()):  # a group: the procs that differ only along ``dims``
        key = tuple((d, v) for d, v in dict(view.point(i)).items() if d not in names)
        groups.setdefault(key, []).append(r)
    by_rank = {r: g for g in groups.values() for r in g}
    ports = engine.inboxes()
    with local():
        meta = REDUCTIONS[reduction](torch.stack([t._jm_meta] * len(next(iter(groups.values())))))
    res = DistributedTensor._new(_fresh(meta), engine, view)
    engine.send(
        view, [("reduce", t._jm_ref, reduction, by_rank, {r: ports[r] for r in by_rank}, next_id(), [res._jm_ref])]
    )
    return res
