"""Pickling with out-of-band buffers: arrays and tensors travel as their own frames, never inside the pickle.

cloudpickle (so classes and functions defined in ``__main__`` or a notebook cell travel by value) with
pickle protocol 5: every large contiguous buffer becomes a separate frame that the transport sends
without copying. torch is only looked at if something already imported it.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import socket
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import cloudpickle

from ..errors import SerializationError

__all__ = [
    "INBAND_LIMIT",
    "UNPICKLABLE_HINT",
    "describe_unpicklable",
    "destination",
    "dumps",
    "if_unsent",
    "loads",
    "pickling_for",
]

# Buffers smaller than this stay inside the pickle: a frame of its own costs more than a copy.
INBAND_LIMIT = 32 * 1024


def _rebuild_tensor(buf: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool, param: bool) -> Any:
    import torch

    dt = getattr(torch, dtype)
    if len(memoryview(buf)) == 0:
        t = torch.empty(shape, dtype=dt)
    else:
        with warnings.catch_warnings():
            # zmq frames are read-only buffers we own: torch warns but writing to them is safe
            warnings.simplefilter("ignore", UserWarning)
            t = torch.frombuffer(buf, dtype=torch.uint8).view(dt).reshape(shape)
    if param:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _reduce_tensor(torch: Any, t: Any) -> Any:
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized or t.is_conj() or t.is_neg():
        return NotImplemented
    c = t.detach().contiguous()
    raw = c.reshape(-1).view(torch.uint8).numpy() if c.numel() else b""
    buf = pickle.PickleBuffer(raw)
    dtype = str(c.dtype).removeprefix("torch.")
    return (
        _rebuild_tensor,
        (buf, dtype, tuple(c.shape), bool(t.requires_grad), isinstance(t, torch.nn.Parameter)),
    )


def _rebuild_memoryview(buf: Any, fmt: str, shape: tuple[int, ...]) -> memoryview:
    m: Any = memoryview(buf)  # typeshed types cast() by literal formats only
    return m if fmt == "B" and len(shape) == 1 else m.cast("B").cast(fmt, shape)


def _reduce_memoryview(m: Any) -> Any:
    """A memoryview arrives as a memoryview (over the received frame: no copy) with its format and shape;
    plain pickle refuses them. Non-contiguous views are copied first."""
    if not m.c_contiguous:
        m = memoryview(m.tobytes()).cast(m.format, m.shape) if m.ndim else memoryview(m.tobytes())
    shape = tuple(m.shape or ())
    return _rebuild_memoryview, (pickle.PickleBuffer(m.cast("B") if m.ndim else m), m.format, shape)


# Things that only make sense in this process: cloudpickle would send an open file's *content* and a
# socket cannot travel at all. Refused with a clear error instead (the standard streams excepted:
# cloudpickle sends them by name, so a function that prints still travels).
_LOCAL_ONLY = (io.IOBase, socket.socket)


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")  # (getattr: another thread may be importing it, half-initialized)
        if torch is not None and type(obj) in (
            getattr(torch, "Tensor", None),
            getattr(torch.__dict__.get("nn"), "Parameter", None),
        ):
            return _reduce_tensor(torch, obj)
        t = type(obj)
        if t is types.CodeType:
            return _reduce_code_keep_filename(obj)
        if t is memoryview:
            return _reduce_memoryview(obj)
        if isinstance(obj, _LOCAL_ONLY) and obj not in (sys.stdout, sys.stderr, sys.stdin):
            raise pickle.PicklingError(
                f"{t.__name__} objects (open files, sockets) belong to this process and cannot travel; "
                "send the data (or a path) instead"
            )
        return super().reducer_override(obj)


def _reduce_code_keep_filename(code: types.CodeType) -> Any:
    """cloudpickle replaces a by-value function's file name with "<dynamic-code>"; keep the real one
    so a remote traceback points at the notebook cell or script line that defined the endpoint."""
    fn, args = cloudpickle.cloudpickle._code_reduce(code)
    return fn, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


# Plain data (these types, in small tuples, lists and str-keyed dicts) pickles the same with the C
# pickler: no class or function to send by value, no buffer to take out of band. cloudpickle's pickler
# costs ~2 us just to set up, on every call and every reply of the latency path.
_PLAIN_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})
_PLAIN_MAX_ITEMS = 16


def _is_plain(obj: Any, depth: int = 0) -> bool:
    t = type(obj)
    if t in _PLAIN_SCALARS:
        return t is not bytes or len(obj) < INBAND_LIMIT
    if depth >= 3 or (t is not tuple and t is not list and t is not dict) or len(obj) > _PLAIN_MAX_ITEMS:
        return False
    if t is dict:
        for k, v in obj.items():
            if type(k) is not str or not _is_plain(v, depth + 1):
                return False
        return True
    for x in obj:
        if not _is_plain(x, depth + 1):
            return False
    return True


is_plain = _is_plain  # for callers that pickle plain data themselves, skipping ``pickling_for``


class _Destination(threading.local):
    target: tuple[str, list[int]] | None = None
    unsent: list[Callable[[], None]] | None = None


_destination = _Destination()


@contextlib.contextmanager
def pickling_for(mesh_id: str, ranks: list[int]) -> Iterator[None]:
    """Arguments pickled in this block go to these ranks of this proc mesh (a distributed tensor's
    ``__reduce_ex__`` reads it: only those procs set its shard aside for the call). If the block
    raises (an argument does not pickle), the call is not sent: what ``if_unsent`` registered runs."""
    prev = _destination.target, _destination.unsent
    _destination.target, _destination.unsent = (mesh_id, ranks), []
    try:
        yield
    except BaseException:
        for undo in _destination.unsent:
            try:
                undo()
            except Exception:  # noqa: BLE001 - best effort: the caller's error is the one to see
                continue
        raise
    finally:
        _destination.target, _destination.unsent = prev


def if_unsent(undo: Callable[[], None]) -> None:
    """Run ``undo`` if what is being pickled for an actor call is not sent after all (see ``pickling_for``)."""
    if _destination.unsent is not None:
        _destination.unsent.append(undo)


def destination() -> tuple[str, list[int]] | None:
    """(proc mesh id, global ranks) that what is being pickled on this thread goes to, if known."""
    return _destination.target


def dumps(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle ``obj``; returns the pickle bytes and the out-of-band buffers, in order."""
    if _is_plain(obj):
        return pickle.dumps(obj, protocol=5), []
    buffers: list[memoryview] = []

    def keep(pb: pickle.PickleBuffer) -> bool:
        m = pb.raw()
        if m.nbytes < INBAND_LIMIT:
            return True  # serialize in-band
        buffers.append(m)
        return False

    f = io.BytesIO()
    try:
        _Pickler(f, protocol=5, buffer_callback=keep).dump(obj)
    except Exception as e:
        raise SerializationError(f"cannot pickle {type(obj).__name__}: {e}") from e
    return f.getvalue(), buffers


def loads(payload: bytes | memoryview, buffers: Sequence[Any] = ()) -> Any:
    return pickle.loads(payload, buffers=buffers)


def describe_unpicklable(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """Name the first argument that does not pickle and why, for an error at the call site:
    ``positional argument 0 (lock) does not pickle (cannot pickle '_thread.lock' object)``."""
    for i, a in enumerate(args):
        try:
            dumps(a)
        except SerializationError as e:
            return f"positional argument {i} ({type(a).__name__}) does not pickle ({e.__cause__})"
    for k, v in kwargs.items():
        try:
            dumps(v)
        except SerializationError as e:
            return f"keyword argument '{k}' ({type(v).__name__}) does not pickle ({e.__cause__})"
    return ""


UNPICKLABLE_HINT = (
    "Arguments and results travel pickled: pass plain data, tensors or arrays, and create locks, "
    "open files, sockets and threads inside the actor instead."
)
