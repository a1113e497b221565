"""Local memory regions as the data plane sees them: address, size, element type, device.

A region is a contiguous tensor (CPU or CUDA) or any C-contiguous buffer (``memoryview``, ``bytearray``,
numpy array, ``mmap``). :func:`region_of` checks what the data plane needs *before* any byte moves and
says what is wrong in terms of the caller's object. torch is looked at only when the object is a tensor.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import MeshValueError

__all__ = ["Region", "buffer_address", "copy_bytes", "region_of"]

_FORMATS = {
    "B": "uint8", "b": "int8", "c": "uint8", "h": "int16", "H": "uint16", "i": "int32", "I": "uint32",
    "l": "int64", "L": "uint64", "q": "int64", "Q": "uint64", "e": "float16", "f": "float32", "d": "float64",
    "?": "bool",
}  # fmt: skip
BYTES = ("uint8", "int8")  # untyped bytes: compatible with any element type of the same size


@dataclass
class Region:
    obj: Any  # keeps the memory alive while the region is used
    address: int
    nbytes: int
    dtype: str
    device: str  # "cpu" or "cuda:N"
    readonly: bool
    is_tensor: bool

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def buffer_address(obj: Any) -> int:
    """The address of a contiguous buffer's first byte (read-only buffers too).

    Valid while ``obj`` (or an export of it, such as a memoryview the caller keeps) is alive.
    """
    view = _PyBuffer()
    _get_buffer(obj, ctypes.byref(view), 0)  # PyBUF_SIMPLE: raises for non-contiguous buffers
    try:
        return view.buf or 0
    finally:
        _release_buffer(ctypes.byref(view))


def copy_bytes(dst: int, src: int, n: int) -> None:
    """memmove between two host addresses (ctypes releases the GIL for the copy)."""
    if n:
        ctypes.memmove(dst, src, n)


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def region_of(obj: Any, role: str) -> Region:
    """Describe ``obj`` as a region, or raise :class:`MeshValueError` saying why it cannot be one.

    ``role`` names the object in messages ("the destination of read_into", ...).
    """
    if _is_tensor(obj):
        return _tensor_region(obj, role)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise MeshValueError(
            f"{role} must be a torch.Tensor or a buffer (memoryview, bytearray, numpy array), got {type(obj).__name__}"
        ) from None
    if not mv.c_contiguous:
        raise MeshValueError(f"{role} is not contiguous; pass a contiguous copy (e.g. numpy.ascontiguousarray)")
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        dtype = str(obj.dtype)
    else:
        dtype = _FORMATS.get(mv.format.lstrip("@=<"), mv.format)
    keep = mv.cast("B") if mv.nbytes else mv
    address = buffer_address(keep) if mv.nbytes else 0
    return Region(keep, address, mv.nbytes, dtype, "cpu", mv.readonly, False)


def _tensor_region(t: Any, role: str) -> Region:
    import torch

    if t.layout != torch.strided or t.is_quantized:
        raise MeshValueError(f"{role} must be a dense (strided) tensor, got layout {t.layout}")
    if not t.is_contiguous():
        raise MeshValueError(
            f"{role} is a non-contiguous tensor (shape {tuple(t.shape)}, stride {t.stride()}); "
            "pass t.contiguous() or a contiguous view"
        )
    if t.device.type not in ("cpu", "cuda"):
        raise MeshValueError(f"{role} is on {t.device}; only CPU and CUDA tensors can be transferred")
    device = "cpu" if t.device.type == "cpu" else f"cuda:{t.device.index or 0}"
    dtype = str(t.dtype).removeprefix("torch.")
    return Region(t, t.data_ptr(), t.numel() * t.element_size(), dtype, device, False, True)
