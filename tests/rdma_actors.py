"""Actors for the data-plane tests (importable by procs: they get our sys.path)."""

from __future__ import annotations

import os

import torch

from jupyter_mesh import Actor, RDMABuffer, endpoint, get_rdma_backend


class Owner(Actor):
    """Holds a tensor and hands out an RDMABuffer to it."""

    def __init__(self, n: int, dtype: str = "float32"):
        self.t = torch.arange(n, dtype=getattr(torch, dtype))
        self.buf = RDMABuffer(self.t)

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buf

    @endpoint
    def raw_handle(self, data: bytes) -> RDMABuffer:
        self.raw = bytearray(data)
        return RDMABuffer(memoryview(self.raw))

    @endpoint
    def raw_value(self) -> bytes:
        return bytes(self.raw)

    @endpoint
    def pattern_handle(self, nbytes: int, kind: str) -> RDMABuffer:
        """A buffer of ``nbytes`` holding ``pattern(nbytes)``: a ``bytearray`` or a uint8 tensor."""
        data = pattern(nbytes)
        self.raw = (
            bytearray(data) if kind == "bytearray" else torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()
        )
        self.kept = RDMABuffer(self.raw if kind != "bytearray" else memoryview(self.raw))
        return self.kept

    @endpoint
    def raw_digest(self) -> str:
        import hashlib

        return hashlib.sha256(
            bytes(self.raw) if isinstance(self.raw, bytearray) else self.raw.numpy().tobytes()
        ).hexdigest()

    @endpoint
    def head(self, k: int = 4) -> list:
        return self.t[:k].tolist()

    @endpoint
    def checksum(self) -> float:
        return float(self.t.double().sum())

    @endpoint
    def drop(self) -> None:
        self.buf.drop().get(timeout=5)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def pattern(nbytes: int) -> bytes:
    """Bytes no two offsets of which are likely to agree by chance (a shifted copy shows)."""
    return (bytes(range(251)) * (nbytes // 251 + 1))[:nbytes]


class Puller(Actor):
    """Reads from and writes to buffers it is given (actor to actor, and actor to controller)."""

    @endpoint
    def pull(self, buf: RDMABuffer, n: int) -> tuple[str, float]:
        dst = torch.empty(n, dtype=torch.float32)
        buf.read_into(dst).get(timeout=20)
        return get_rdma_backend(buf), float(dst.double().sum())

    @endpoint
    async def push(self, buf: RDMABuffer, n: int, value: float) -> None:
        await buf.write_from(torch.full((n,), value))

    @endpoint
    def pull_raw(self, buf: RDMABuffer) -> tuple[str, str]:
        import hashlib

        dst = bytearray(buf.size())
        buf.read_into(dst).get(timeout=20)
        return get_rdma_backend(buf), hashlib.sha256(dst).hexdigest()

    @endpoint
    def pull_expecting_failure(self, buf: RDMABuffer, n: int, timeout: float) -> str:
        try:
            buf.read_into(torch.empty(n), timeout=timeout).get(timeout=timeout + 10)
        except Exception as e:  # noqa: BLE001 - the test looks at what it was
            return f"{type(e).__name__}: {e}"
        return "no error"


class CudaOwner(Actor):
    """GPU hosts only: holds a CUDA tensor behind an RDMABuffer (registered with UCX at once)."""

    def __init__(self, nbytes: int):
        self.t = torch.arange(nbytes // 4, dtype=torch.float32, device="cuda")
        self.buf = RDMABuffer(self.t)

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buf

    @endpoint
    def checksum(self) -> float:
        return float(self.t.double().sum())
