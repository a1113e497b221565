"""The ops of ``endpoint.reduce(op, ...)``: how two results become one, in a host agent or the caller.

A reduce folds the results of a cast on the way up the agents' tree, so the caller receives one partial
value per subtree, not one value per rank. The fold order is not the rank order (agents fold what they
hold as it arrives), so an op must be associative and commutative. Named ops work on numbers, torch
tensors and numpy arrays (elementwise for ``min``/``max``); a function travels pickled (cloudpickle)
in the signed header and runs in the agents: what it raises comes back as a ``ReduceError`` naming it,
never harming the agent.

An agent folds torch tensors for a named op without importing torch (seconds of a held GIL, which
would stall its heartbeats): it reads them as numpy arrays of the same bytes (``agent_loads``) and
sends the result back in torch's wire form. A function over tensors, or a dtype numpy lacks
(bfloat16), does import torch there, on the agent's fold thread, once.
"""

from __future__ import annotations

import functools
import io
import operator
import pickle
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .._wire.serialize import _rebuild_tensor, dumps, loads
from ..errors import MeshValueError

__all__ = ["NAMED", "agent_loads", "encode", "fold", "op_name", "resolve"]

Op = Callable[[Any, Any], Any]


class _Tensor:
    """A torch tensor as an agent folds it for a named op: its bytes as a numpy array, its torch dtype."""

    __slots__ = ("a", "dtype")

    def __init__(self, a: Any, dtype: str):
        self.a, self.dtype = a, dtype

    def _with(self, other: Any, fn: Callable[[Any, Any], Any]) -> _Tensor:
        return _Tensor(fn(self.a, other.a if isinstance(other, _Tensor) else other), self.dtype)

    def __add__(self, other: Any) -> _Tensor:
        return self._with(other, operator.add)

    def __mul__(self, other: Any) -> _Tensor:
        return self._with(other, operator.mul)

    __radd__, __rmul__ = __add__, __mul__

    def __reduce__(self) -> tuple[Any, ...]:
        import numpy

        a = numpy.ascontiguousarray(self.a)  # (at least 1-dim: the shape is the original's)
        raw: Any = a.reshape(-1).view(numpy.uint8) if a.size else b""
        return (_rebuild_tensor, (pickle.PickleBuffer(raw), self.dtype, numpy.shape(self.a), False, False))


_NUMPY_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}


class _NeedsTorch(Exception):
    pass


def _tensor_as_numpy(buf: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool, param: bool) -> _Tensor:
    if dtype not in _NUMPY_DTYPES:
        raise _NeedsTorch(dtype)
    import numpy

    a = numpy.frombuffer(buf, dtype=numpy.uint8).view(dtype).reshape(shape) if len(memoryview(buf)) else None
    return _Tensor(numpy.zeros(shape, dtype=dtype) if a is None else a, dtype)


class _AgentUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name == "_rebuild_tensor" and module == _rebuild_tensor.__module__:
            return _tensor_as_numpy
        return super().find_class(module, name)


def agent_loads(payload: Any, bufs: Sequence[Any], named: bool) -> Any:
    """A result as an agent folds it: tensors as numpy (``_Tensor``) for a named op, unless torch is
    loaded here already or numpy cannot hold the dtype; a function gets real tensors."""
    if not named or "torch" in sys.modules:
        return loads(payload, bufs)
    try:
        return _AgentUnpickler(io.BytesIO(payload), buffers=bufs).load()
    except _NeedsTorch:
        return loads(payload, bufs)


def _extremum(which: str) -> Op:
    def pick(a: Any, b: Any) -> Any:
        if isinstance(a, _Tensor):
            import numpy

            return a._with(b, numpy.minimum if which == "min" else numpy.maximum)
        lib = type(a).__module__.partition(".")[0]
        if lib in ("torch", "numpy") and lib in sys.modules:  # elementwise, as an all-reduce would
            return getattr(sys.modules[lib], "minimum" if which == "min" else "maximum")(a, b)
        return min(a, b) if which == "min" else max(a, b)

    pick.__qualname__ = which
    return pick


NAMED: dict[str, Op] = {"sum": operator.add, "prod": operator.mul, "min": _extremum("min"), "max": _extremum("max")}


def encode(op: str | Op) -> str | bytes:
    """What the header's ``rd`` carries: a named op's name, or the function pickled."""
    if isinstance(op, str):
        if op not in NAMED:
            raise MeshValueError(f"unknown reduce op {op!r}; use one of {sorted(NAMED)} or a function f(a, b)")
        return op
    if not callable(op):
        raise MeshValueError(f"reduce(op, ...) takes an op name ({sorted(NAMED)}) or a function f(a, b), got {op!r}")
    return dumps(op)[0]


def op_name(op: str | Op) -> str:
    """How errors name the op."""
    if isinstance(op, str):
        return repr(op)
    return getattr(op, "__qualname__", None) or repr(op)


def resolve(rd: Any) -> tuple[str, Op]:
    """The op a header names, and its name for errors (raises if a pickled function does not load)."""
    if isinstance(rd, str):
        fn = NAMED.get(rd)
        if fn is None:
            raise MeshValueError(f"unknown reduce op {rd!r}")
        return repr(rd), fn
    fn = loads(rd, [])
    if not callable(fn):
        raise MeshValueError(f"the reduce op is not callable: {fn!r}")
    return op_name(fn), fn


def fold(fn: Op, values: list[Any]) -> Any:
    return functools.reduce(fn, values)
