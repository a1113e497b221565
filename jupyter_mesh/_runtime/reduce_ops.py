"""The ops of ``endpoint.reduce(op, ...)``: how two results become one, in a host agent or the caller.

A reduce folds the results of a cast on the way up the agents' tree, so the caller receives one partial
value per subtree, not one value per rank. The fold order is not the rank order (agents fold what they
hold as it arrives), so an op must be associative and commutative. Named ops work on numbers, torch
tensors and numpy arrays (elementwise for ``min``/``max``); a function travels pickled (cloudpickle)
in the signed header and runs in the agents: what it raises comes back as a ``ReduceError`` naming it,
never harming the agent.
"""

from __future__ import annotations

import functools
import operator
import sys
from collections.abc import Callable
from typing import Any

from .._wire.serialize import dumps, loads
from ..errors import MeshValueError

__all__ = ["NAMED", "encode", "fold", "op_name", "resolve"]

Op = Callable[[Any, Any], Any]


def _extremum(which: str) -> Op:
    def pick(a: Any, b: Any) -> Any:
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
