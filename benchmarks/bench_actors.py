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
