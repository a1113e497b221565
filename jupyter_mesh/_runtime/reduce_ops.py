"""The ops of ``endpoint.reduce(op, ...)``: how two results become one, in a host agent or the caller.

A reduce folds the results of a cast on the way up the agents' tree, so the caller receives one partial
value per subtree, not one value per rank. The fold order is not the rank order (agents fold what they
hold as it arrives), so an op must be associative and commutative. Named ops work on numbers, torch
tensors and numpy arrays (elementwise for ``min``/``max``); a function travels pickled (cloudpickle)
in the signed header and runs in the agents: what it raises comes back as a ``ReduceError`` naming it,
never harming the agent.

Named ops refuse what torch and numpy would fold differently, rather than return numbers that depend
on where the fold ran: tensors of two dtypes, a tensor with a numpy array, a tensor with a Python number
of a wider kind (an int tensor with a float) or out of its dtype's range (``_check``). Numpy arrays of
two dtypes fold as numpy promotes them, in the agents as at the caller.

An agent folds torch tensors for a named op without importing torch (seconds of a held GIL, which
would stall its heartbeats): it reads them as numpy arrays of the same bytes (``agent_loads``) and
sends the result back in torch's wire form. A function over tensors, or a dtype numpy lacks
(bfloat16), does import torch there, on the thread that folds it, once.
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
        out = fn(self.a, other.a if isinstance(other, _Tensor) else other)
        if out.dtype != self.a.dtype:  # numpy promoted: its bytes are no longer a tensor of our dtype
            raise TypeError(
                f"folding a torch {self.dtype} tensor with {_what(other)} gave numpy {out.dtype}, not {self.dtype}; "
                "cast in the endpoint so that every rank returns one dtype"
            )
        return _Tensor(out, self.dtype)

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


def _dtype(x: Any) -> tuple[str, str] | None:
    """("torch", dtype) for a tensor (the agent's ``_Tensor`` too), ("numpy", dtype) for an array or a
    numpy scalar, None for anything else."""
    if isinstance(x, _Tensor):
        return "torch", x.dtype
    lib = type(x).__module__.partition(".")[0]
    if lib in ("torch", "numpy") and hasattr(x, "dtype"):
        return lib, str(x.dtype).removeprefix("torch.")
    return None


def _what(x: Any) -> str:
    d = _dtype(x)
    if d is None:
        return f"a Python {type(x).__name__}"
    return f"a torch {d[1]} tensor" if d[0] == "torch" else f"a numpy {d[1]} array"


_KIND = {bool: 0, int: 1, float: 2, complex: 3}  # torch's categories: a wider one promotes


def _kind(dtype: str) -> int:
    if dtype == "bool":
        return 0
    if dtype.startswith("complex"):
        return 3
    if "float" in dtype:  # float16..64, bfloat16, float8 variants
        return 2
    return 1


def _fits(n: int, dtype: str) -> bool:
    bits = dtype.removeprefix("u").removeprefix("int")
    if not bits.isdigit():  # not a plain integer dtype (quantized): torch says
        return True
    top = 2 ** int(bits)
    return 0 <= n < top if dtype.startswith("u") else -top // 2 <= n < top // 2


def _check(a: Any, b: Any) -> None:
    """Refuse two values that torch and numpy fold differently: agents fold tensors with numpy, the
    caller with torch, so the result would depend on where it was folded (or be garbage)."""
    da, db = _dtype(a), _dtype(b)
    if da is None and db is None:
        return
    if da is not None and db is not None:
        if da[0] != db[0]:
            raise TypeError(
                f"{_what(a)} and {_what(b)} do not fold together: return the same kind from every rank "
                "(torch.from_numpy(x), or t.numpy(), in the endpoint)"
            )
        if da[0] == "torch" and da[1] != db[1]:
            wide = max(da[1], db[1], key=_kind)
            raise TypeError(
                f"torch tensors of two dtypes, {da[1]} and {db[1]}, do not fold: cast in the endpoint so that "
                f"every rank returns one dtype (e.g. t.to(torch.{wide}))"
            )
        return
    lib, dtype = da or db or ("", "")
    n = b if da is not None else a
    if lib != "torch" or type(n) not in _KIND:
        return  # numpy promotes the same everywhere; other objects: the op says what it cannot do
    if _KIND[type(n)] > _kind(dtype):
        raise TypeError(
            f"a torch {dtype} tensor and a Python {type(n).__name__} ({n!r}) do not fold: torch would change "
            f"the dtype; return tensors from every rank, cast to one dtype in the endpoint"
        )
    if type(n) is int and _kind(dtype) == 1 and not _fits(n, dtype):
        raise TypeError(
            f"the Python int {n} does not fit a torch {dtype} tensor (torch would wrap it around): return "
            "tensors of a wider dtype from every rank"
        )


def _arith(fn: Op, name: str) -> Op:
    def op(a: Any, b: Any) -> Any:
        _check(a, b)
        return fn(a, b)

    op.__qualname__ = op.__name__ = name
    return op


def _extremum(which: str) -> Op:
    def pick(a: Any, b: Any) -> Any:
        _check(a, b)
        if _dtype(a) is None and _dtype(b) is not None:  # the tensor or array first: it says how
            a, b = b, a
        if isinstance(a, _Tensor):
            import numpy

            return a._with(b, numpy.minimum if which == "min" else numpy.maximum)
        lib = type(a).__module__.partition(".")[0]
        if lib in ("torch", "numpy") and lib in sys.modules:  # elementwise, as an all-reduce would
            mod = sys.modules[lib]
            if lib == "torch" and not isinstance(b, mod.Tensor):  # a number (``_check``: one that fits)
                b = mod.as_tensor(b, dtype=a.dtype)
            return getattr(mod, "minimum" if which == "min" else "maximum")(a, b)
        return min(a, b) if which == "min" else max(a, b)

    pick.__qualname__ = pick.__name__ = which
    return pick


NAMED: dict[str, Op] = {
    "sum": _arith(operator.add, "sum"),
    "prod": _arith(operator.mul, "prod"),
    "min": _extremum("min"),
    "max": _extremum("max"),
}


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
