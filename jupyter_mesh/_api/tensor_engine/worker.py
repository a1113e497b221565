"""The proc side of the tensor engine: one ``TensorWorker`` actor per proc holds that proc's shards of
every distributed tensor in a store keyed by ref id, and runs the ops the controller sends it, in order.

Ops, fetches and remote functions all reach the worker as calls to this one actor, so they keep the
controller's order. Actor calls that carry a distributed tensor go to *other* actors (other threads),
so they cannot rely on that order: the controller first asks the worker to *lend* the shard under a
fresh borrow id, and the receiving actor's unpickling waits (bounded) until the loan is there. A loan
holds the shard itself, so dropping the tensor right after the call is safe; loans nobody collects
expire. Nothing here trusts an id from the wire: an unknown ref is an error that says so.
"""

from __future__ import annotations

import collections
import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..._core.actor import Actor, endpoint
from ..._core.context import context, own_rank
from ..._core.future import time_left
from ..._core.ports import Channel
from ...errors import ActorError, MeshTimeoutError, MeshValueError, RemoteFailure

__all__ = ["REDUCTIONS", "Ref", "TensorWorker", "borrowed", "describe_func"]

# seconds an uncollected loan is kept: a call cancelled or lost before its actor unpickled it
LOAN_TTL = 3600.0


def wait_limit() -> float:
    """How long an actor waits for a shard the engine has not lent yet (``$JUPYTER_MESH_TENSOR_WAIT``)."""
    try:
        return float(os.environ.get("JUPYTER_MESH_TENSOR_WAIT", "60"))
    except ValueError:
        return 60.0


class Ref:
    """A distributed tensor's place in an op's arguments: the worker puts its local shard there."""

    __slots__ = ("id",)

    def __init__(self, ref_id: int):
        self.id = ref_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class _Failed:
    """What a ref holds when the op that should have made it failed (here or upstream)."""

    __slots__ = ("failure",)

    def __init__(self, failure: RemoteFailure):
        self.failure = failure


def describe_func(func: Any) -> str:
    """A torch function's name as users write it (``torch.matmul``, ``Tensor.sum``, ``Tensor.T``)."""
    if isinstance(func, tuple) and func[:1] == ("attr",):
        return f"Tensor.{func[1]}"
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    if name.startswith("TensorBase."):
        return "Tensor." + name.removeprefix("TensorBase.")
    mod = getattr(func, "__module__", None) or ""
    if mod.startswith("torch") and "." not in name:
        return f"torch.{name}"
    return f"{mod}.{name}" if mod and mod != "builtins" else name


class _Store:
    """This proc's shards (ref id -> tensor or ``_Failed``) and loans (borrow id -> shard)."""

    def __init__(self) -> None:
        self.refs: dict[int, Any] = {}
        self.loans: dict[int, tuple[Any, float]] = {}
        self.cond = threading.Condition()

    def get(self, ref_id: Any) -> Any:
        if type(ref_id) is not int or ref_id not in self.refs:
            raise MeshValueError(
                f"no distributed tensor with ref {ref_id!r} on this proc: it was freed, made on another mesh, "
                "or made before this proc was respawned; use the tensor while its Python object is alive, on "
                "the mesh that made it, and make it again after a respawn"
            )
        return self.refs[ref_id]

    def lend(self, ref_id: int, borrow_id: int) -> None:
        value = self.get(ref_id) if type(ref_id) is int and ref_id in self.refs else _missing(ref_id)
        with self.cond:
            self.loans[int(borrow_id)] = (value, time.monotonic() + LOAN_TTL)
            self.cond.notify_all()

    def unlend(self, borrow_id: Any) -> None:
        with self.cond:
            self.loans.pop(borrow_id, None)

    def sweep(self) -> None:
        now = time.monotonic()
        with self.cond:
            for k in [k for k, (_, dead) in self.loans.items() if dead < now]:
                del self.loans[k]

    def collect(self, borrow_id: int, limit: float, what: str) -> Any:
        deadline = time.monotonic() + limit
        with self.cond:
            while borrow_id not in self.loans:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MeshTimeoutError(
                        "call",
                        limit,
                        f"{what} did not reach this actor (the tensor engine on this proc is still busy with "
                        "earlier ops, or died); wait for them (fetch_shard(...).get()) or raise "
                        "$JUPYTER_MESH_TENSOR_WAIT",
                    )
                self.cond.wait(left)
            value, _ = self.loans.pop(borrow_id)
        if isinstance(value, _Failed):
            raise _error(value.failure)
        return value


def _op_failed(op: Any, e: Exception) -> None:
    """A failed op fails the refs it makes; a malformed one is reported on the proc's output."""
    kinds = (("run",), ("run_no_grad",), ("rref",), ("reduce",))
    outs = op[-1] if isinstance(op, tuple) and op[:1] in kinds else None
    if isinstance(outs, list) and all(type(i) is int for i in outs):
        for i in outs:
            _store.refs[i] = _failure(op[0], e)
    else:
        print(f"jupyter_mesh tensor engine: skipped a malformed op {op!r:.200}: {e}", file=sys.stderr)


def _missing(ref_id: Any) -> _Failed:
    return _Failed(
        RemoteFailure({}, "tensor engine", "lend", "MeshValueError", f"no distributed tensor with ref {ref_id!r}", "")
    )


_store = _Store()


def _error(failure: RemoteFailure) -> ActorError:
    return ActorError([failure])


def _here() -> Any:
    proc = context().actor.proc
    return proc


def borrowed(mesh_id: str, mesh_name: str, ranks: list[int], borrow_id: int, desc: str) -> Any:
    """Unpickling a distributed tensor inside an actor: the local shard of the actor's proc."""
    proc = _here()
    if proc is None:
        raise MeshValueError(
            f"{desc} can only be passed to actors on its proc mesh '{mesh_name}' (each gets its proc's shard); "
            "here there is none: use fetch_shard(t, ...).get() for a local copy of one shard"
        )
    if getattr(proc, "mesh_id", None) != mesh_id or proc.rank not in ranks:
        raise MeshValueError(
            f"{desc} lives on proc mesh '{mesh_name}', but this actor runs on proc mesh "
            f"'{getattr(proc, 'mesh_name', '?')}' (rank {proc.rank}): a distributed tensor reaches only actors "
            "spawned on the procs that hold its shards; spawn the actors there, or fetch_shard() it and "
            "pass the plain tensor"
        )
    return _store.collect(borrow_id, wait_limit(), desc)


def _coords() -> dict[str, int]:
    proc = _here()
    return dict(getattr(proc, "coords", {}) or {})


def _failure(what: str, e: BaseException) -> _Failed:
    tb = "".join(traceback.format_exception(e))
    exc: BaseException | None = e
    try:
        pickle.dumps(e)
    except Exception:  # noqa: BLE001 - an exception that does not pickle travels as text only
        exc = None
    return _Failed(RemoteFailure(_coords(), "tensor engine", what, type(e).__name__, str(e), tb, exc))


def _resolve(obj: Any) -> tuple[Any, _Failed | None]:
    """Replace every ``Ref`` in args/kwargs by its shard; the first failed input, if any."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat, spec = tree_flatten(obj, is_leaf=lambda x: isinstance(x, Ref))
    bad: _Failed | None = None
    for i, x in enumerate(flat):
        if isinstance(x, Ref):
            v = _store.get(x.id)
            if isinstance(v, _Failed) and bad is None:
                bad = v
            flat[i] = v
    return tree_unflatten(flat, spec), bad


def _tensors(result: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_flatten

    return [x for x in tree_flatten(result)[0] if isinstance(x, torch.Tensor)]


def _store_outputs(out_ids: list[int], result: Any, what: str) -> None:
    ts = _tensors(result)
    if len(ts) != len(out_ids):
        raise TypeError(
            f"{what} returned {len(ts)} tensor(s) on this proc but its shapes were computed for {len(out_ids)}: "
            "a propagate= function must return what the function returns"
        )
    for i, t in zip(out_ids, ts, strict=True):
        _store.refs[i] = t


class TensorWorker(Actor):
    """The tensor engine's actor on each proc (spawned once per proc mesh by the controller)."""

    def __init__(self) -> None:
        import torch

        # procs fork from one template, so they would all start from its random state: ``torch.rand``
        # inside ``activate()`` must give each proc its own values, as in Monarch
        torch.seed()
        # reductions: the other workers send their shards here (``reduce`` ops)
        port, inbox = Channel[Any].open()
        self._port: Any = port
        self._inbox: Any = inbox
        self._early: dict[int, dict[int, Any]] = {}  # op id -> rank -> shard, sent before we got there
        # the inbox's receive a reduction gave up on: still waiting, so the next one waits on it (a fresh
        # one would queue behind it, and the stale one would swallow the next message)
        self._pending: Any = None
        self._closed: collections.deque[int] = collections.deque(maxlen=4096)  # reductions done here

    @endpoint
    def ops(self, batch: list[tuple[Any, ...]]) -> None:
        """Run ops in order. Never raises (a broadcast's error would end the actor, and every shard with
        it): a failed op fails the refs it makes, and its error waits for whoever fetches them; a
        malformed one (not from our controller) is reported on the proc's output and skipped."""
        _store.sweep()
        with own_rank():  # @remote code runs as its proc, whichever view the ops were sent to
            for op in batch if isinstance(batch, list) else [batch]:
                try:
                    self._op(op)
                except Exception as e:  # noqa: BLE001 - see the docstring
                    _op_failed(op, e)

    def _op(self, op: tuple[Any, ...]) -> None:
        if not isinstance(op, tuple) or not op:
            raise MeshValueError("an op is a non-empty tuple")
        kind = op[0]
        if kind == "del":
            for i in op[1]:
                if type(i) is int:
                    _store.refs.pop(i, None)
        elif kind == "lend":
            if op[3] is None or _here().rank in op[3]:
                _store.lend(op[1], op[2])
        elif kind == "unlend":
            if op[2] is None or _here().rank in op[2]:
                _store.unlend(op[1])
        elif kind == "run":
            self._run(*op[1:])
        elif kind == "run_no_grad":
            import torch

            with torch.no_grad():
                self._run(*op[1:])
        elif kind == "rref":
            self._rref(*op[1:])
        elif kind == "call":  # a @remote function's broadcast: its error goes to the output
            self._call(*op[1:])
        elif kind == "reduce":
            self._reduce(*op[1:])
        else:
            raise MeshValueError(f"unknown op {kind!r}")

    def _run(self, func: Any, what: str, args: Any, kwargs: Any, out_ids: list[int]) -> None:
        try:
            (args, kwargs), bad = _resolve((args, kwargs))
            if bad is not None:
                fail = bad
            else:
                fn = _callable(func)
                _store_outputs(out_ids, fn(*args, **kwargs), what)
                return
        except Exception as e:  # noqa: BLE001 - stored for the fetch
            fail = _failure(what, e)
        for i in out_ids:
            _store.refs[i] = fail

    def _rref(self, mesh: Any, name: str, args: Any, kwargs: Any, out_ids: list[int]) -> None:
        what = f"{mesh._name}.{name} (rref)"
        try:
            (args, kwargs), bad = _resolve((args, kwargs))
            if bad is not None:
                fail = bad
            else:
                # its own proc's actor, numbered in ``mesh`` (as a call to it all would)
                _store_outputs(out_ids, getattr(mesh, name)._call_at(_here().rank, args, kwargs).get(), what)
                return
        except Exception as e:  # noqa: BLE001 - stored for the fetch
            fail = _failure(what, e)
        for i in out_ids:
            _store.refs[i] = fail

    def _call(self, fn: Any, args: Any, kwargs: Any) -> None:
        try:
            (args, kwargs), bad = _resolve((args, kwargs))
            if bad is not None:
                raise _error(bad.failure)
            _callable(fn)(*args, **kwargs)
        except Exception:  # noqa: BLE001 - nobody waits for a broadcast: the proc's output shows it
            traceback.print_exc()

    def _reduce(
        self, ref_id: int, how: str, groups: dict[int, list[int]], ports: dict[int, Any], op_id: int, out_ids: list[int]
    ) -> None:
        """All-reduce over a group of procs: send our shard to each peer's inbox, then wait for theirs
        (every worker runs its ops in the same order, so nobody waits for a peer that waits for it)."""
        me = _here().rank
        group = groups[me]
        try:
            mine = _store.get(ref_id)
        except Exception as e:  # noqa: BLE001 - the peers get the failure instead of waiting for a shard
            mine = _failure(f"reduce({how!r})", e)
        for r in group:
            if r != me:
                ports[r].send((op_id, me, mine))
        got = self._early.pop(op_id, {})
        got[me] = mine
        deadline = time.monotonic() + wait_limit()
        try:
            while len(got) < len(group):
                if self._pending is None:
                    self._pending = self._inbox.recv()
                op, rank, shard = self._pending.get(timeout=time_left(deadline))
                self._pending = None
                if op == op_id:
                    got[rank] = shard
                elif op not in self._closed:  # a shard for a reduction we gave up on is dropped
                    self._early.setdefault(op, {})[rank] = shard
            bad = next((v for v in got.values() if isinstance(v, _Failed)), None)
            if bad is not None:
                _store.refs[out_ids[0]] = bad
                return
            import torch

            stacked = torch.stack([got[r] for r in group])
            _store.refs[out_ids[0]] = REDUCTIONS[how](stacked)
        except Exception as e:  # noqa: BLE001 - stored for the fetch
            _store.refs[out_ids[0]] = _failure(f"reduce({how!r})", e)
        finally:
            self._closed.append(op_id)

    @endpoint
    def inbox(self) -> Any:
        """Where the other workers send their shards for a reduction."""
        return self._port

    @endpoint
    def fetch(self, ref_ids: list[int]) -> list[Any]:
        """The shards of ``ref_ids`` (a failed one as its failure, raised by the controller)."""
        out = []
        for i in ref_ids:
            v = _store.get(i)
            out.append(("failed", v.failure) if isinstance(v, _Failed) else ("ok", v))
        return out

    @endpoint
    def call_remote(self, fn: Any, args: Any, kwargs: Any) -> Any:
        """A ``@remote`` function's ``call``: its result goes back to the caller, an error raises there."""
        (args, kwargs), bad = _resolve((args, kwargs))
        if bad is not None:
            raise _error(bad.failure)
        return _callable(fn)(*args, **kwargs)

    @endpoint
    def stats(self) -> dict[str, int]:
        """How many shards and loans this proc holds (tests read it to check that refs are freed)."""
        return {
            "refs": len(_store.refs),
            "loans": len(_store.loans),
            "parked": sum(len(v) for v in self._early.values()),
        }


REDUCTIONS: dict[str, Callable[[Any], Any]] = {
    "sum": lambda s: s.sum(0),
    "avg": lambda s: s.mean(0),
    "product": lambda s: s.prod(0),
    "min": lambda s: s.amin(0),
    "max": lambda s: s.amax(0),
    "stack": lambda s: s,
}


def _attr(t: Any, name: str) -> Any:
    value = getattr(t, name)
    if value is None and name == "grad":
        raise RuntimeError("this shard has no .grad yet: call backward() on a result computed from it first")
    return value


def _callable(func: Any) -> Callable[..., Any]:
    if isinstance(func, tuple) and func[:1] == ("attr",):
        name = func[1]
        if not isinstance(name, str) or not name.isidentifier():
            raise MeshValueError(f"bad tensor attribute {name!r}")
        return lambda t, *_a, **_k: _attr(t, name)
    if isinstance(func, tuple) and func[:1] == ("import",):
        import importlib

        mod, _, attr = str(func[1]).rpartition(".")
        return getattr(importlib.import_module(mod), attr)  # type: ignore[no-any-return]
    if not callable(func):
        raise MeshValueError(f"op {func!r} is not callable")
    return func  # type: ignore[no-any-return]
