"""Actors and payloads for the adverb x payload x topology matrix (``test_payloads.py``).

Every payload has a digest that both sides compute: type, dtype, shape and a SHA-256 of the bytes, so a
result is checked bit for bit, not just "it did not raise".
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from jupyter_mesh import Actor, current_rank, endpoint

KIB = 1024


def digest(x: Any) -> Any:
    """A picklable fingerprint of ``x``: equal digests mean equal type, dtype, shape and bytes."""
    if isinstance(x, torch.Tensor):
        raw = x.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if x.numel() else b""
        return ("tensor", str(x.dtype), tuple(x.shape), hashlib.sha256(raw).hexdigest())
    if isinstance(x, np.ndarray):
        return ("ndarray", str(x.dtype), x.shape, hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest())
    if isinstance(x, (bytes, bytearray, memoryview)):
        m = memoryview(x)
        return (type(x).__name__, m.format, tuple(m.shape or ()), hashlib.sha256(m.tobytes()).hexdigest())
    if isinstance(x, dict):
        return ("dict", tuple((k, digest(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(digest(v) for v in x))
    return ("value", repr(x))


def _float_tensor(nbytes: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(nbytes // 4, generator=g)


def make_payload(name: str) -> Any:
    """The payload called ``name``; the same name gives the same bytes in every process."""
    if name == "none":
        return None
    if name == "small":
        return {"lr": 0.1, "step": 3, "tag": "x"}
    if name == "tensor_31k":
        return _float_tensor(31 * KIB, 1)
    if name == "tensor_32k":
        return _float_tensor(32 * KIB, 2)
    if name == "tensor_1m":
        return _float_tensor(1024 * KIB, 3)
    if name == "tensor_64m":
        return _float_tensor(64 * 1024 * KIB, 4)
    if name == "ndarray_1m":
        return np.random.default_rng(5).standard_normal(1024 * KIB // 8)
    if name == "bytes_1m":
        return np.random.default_rng(6).bytes(1024 * KIB)
    if name == "bytearray_1m":
        return bytearray(np.random.default_rng(7).bytes(1024 * KIB))
    if name == "memoryview_64k":
        return memoryview(np.random.default_rng(8).bytes(64 * KIB))
    if name == "noncontiguous":
        return _float_tensor(256 * KIB, 9).reshape(256, 256).t()[::2]
    if name == "nested":
        return {
            "weights": [_float_tensor(48 * KIB, 10), _float_tensor(8, 11)],
            "meta": {"arr": np.arange(20_000, dtype=np.int32), "blob": bytes(40 * KIB)},
            "pair": (torch.zeros(3, dtype=torch.int64), None),
        }
    kind, _, size = name.partition(":")  # sized ones: "tensor:<bytes>", "bytes:<bytes>"
    if kind == "tensor" and size.isdigit():
        return _float_tensor(int(size), 12)
    if kind == "bytes" and size.isdigit():
        return np.random.default_rng(13).bytes(int(size))
    raise KeyError(name)


PAYLOADS = [
    "none",
    "small",
    "tensor_31k",
    "tensor_32k",
    "tensor_1m",
    "tensor_64m",
    "ndarray_1m",
    "bytes_1m",
    "bytearray_1m",
    "memoryview_64k",
    "noncontiguous",
    "nested",
]


class Sink(Actor):
    """Receives payloads every way there is and reports their digests."""

    def __init__(self, init: Any = None, *, kw: Any = None):
        self.init, self.kw = init, kw
        self.last: Any = None

    @endpoint
    def digest(self, x: Any) -> Any:
        return digest(x)

    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    def make(self, name: str) -> Any:
        return make_payload(name)

    @endpoint
    def make_or_raise(self, name: str, rank: int) -> Any:
        """Payload ``name``, except on ``rank``, which raises."""
        if current_rank().rank == rank:
            raise ValueError(f"rank {rank} makes nothing")
        return make_payload(name)

    @endpoint
    def store(self, x: Any) -> None:
        self.last = x

    @endpoint
    def last_digest(self) -> Any:
        return digest(self.last)

    @endpoint
    def init_digests(self) -> Any:
        return digest(self.init), digest(self.kw)

    @endpoint
    def forward(self, other: Any, name: str, how: str) -> Any:
        """Actor -> actor: send payload ``name`` to ``other`` (a one-rank or whole mesh) and return
        what it saw, and what it sent back, as digests."""
        x = make_payload(name)
        if how == "call_one":
            return other.digest.call_one(x).get(60), digest(other.echo.call_one(x).get(60))
        seen = other.digest.call(x).get(60)
        back = other.echo.call(x).get(60)
        return list(seen.values()), [digest(v) for v in back.values()]
