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
