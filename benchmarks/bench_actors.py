"""Actors used by the benchmarks (a module of its own so procs can import it by reference)."""

from jupyter_mesh import Actor, endpoint


class Bench(Actor):
    @endpoint
    def noop(self) -> None:
        return None

    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def torch_sum(self) -> float:
        import torch

        return float(torch.ones(4).sum())

    @endpoint
    def pid(self) -> int:
        import os

        return os.getpid()

    @endpoint
    def sleep(self, seconds: float) -> float:
        import time

        time.sleep(seconds)
        return seconds


class RdmaBench(Actor):
    """One side of the data-plane benchmark (W7): owns a buffer, or reads/writes someone else's."""

    @endpoint
    def make_buffer(self, nbytes: int):
        import torch

        from jupyter_mesh import RDMABuffer

        self.t = torch.rand(nbytes // 4)
        self.buf = RDMABuffer(self.t)
        return self.buf

    @endpoint
    def transfer(self, buf, op: str, runs: int) -> tuple[str, list[float]]:
        import time

        import torch

        from jupyter_mesh import get_rdma_backend

        if not hasattr(self, "t"):
            self.t = torch.empty(buf.size() // 4)
            self.t.fill_(0)  # touched: page faults are not part of the transfer
        times = []
        for i in range(runs + 1):
            t0 = time.perf_counter()
            if op == "read_into":
                buf.read_into(self.t, timeout=60).get(timeout=120)
            else:
                buf.write_from(self.t, timeout=60).get(timeout=120)
            if i:
                times.append(time.perf_counter() - t0)
        return get_rdma_backend(buf), times

    @endpoint
    def checksum(self) -> float:
        return float(self.t.double().sum())

    @endpoint
    def memcpy_from_file(self, path: str, nbytes: int, runs: int) -> list[float]:
        """The one-copy baseline: copy out of a shared-memory mapping another process wrote."""
        import ctypes
        import mmap
        import time

        with open(path, "r+b") as f:
            m = mmap.mmap(f.fileno(), nbytes)
        src = (ctypes.c_char * nbytes).from_buffer(m)
        dst = ctypes.create_string_buffer(nbytes)  # zero-filled: touched
        times = []
        for i in range(runs + 1):
            t0 = time.perf_counter()
            ctypes.memmove(dst, src, nbytes)
            if i:
                times.append(time.perf_counter() - t0)
        del src
        m.close()
        return times


class Maker(Actor):
    """Makes a large result in the proc (so only the result crosses the wire)."""

    @endpoint
    def ones(self, nbytes: int):
        import torch

        return torch.ones(nbytes // 4)

    @endpoint
    def nelem(self, t) -> int:
        return t.numel()
