"""Actors for tests/test_warm.py: what a fresh proc had loaded before its actor imported anything."""

import os
import sys

from jupyter_mesh import Actor, endpoint


class Probe(Actor):
    def __init__(self) -> None:
        self.had_torch = "torch" in sys.modules  # before this actor imported anything itself

    @endpoint
    def info(self) -> tuple[int, bool]:
        return os.getppid(), self.had_torch

    @endpoint
    def pipes(self) -> int:
        """How many pipes this proc holds open: its own stdout, stderr and lifeline, and nobody else's."""
        from _procs import open_pipes  # (the tests' folder is on a local proc's path)

        return open_pipes(os.getpid())


class Loaded(Actor):
    """Which modules a fresh proc had before its actor's own code, and what its first tensor call imported."""

    def __init__(self) -> None:
        self.at_start = set(sys.modules)  # before this actor imported anything itself

    @endpoint
    def had(self, names: list[str]) -> dict[str, bool]:
        return {n: n in self.at_start for n in names}

    @endpoint
    def where(self) -> int:
        return os.getppid()

    @endpoint
    def double(self, t):  # a tensor in, a tensor out
        return t * 2

    @endpoint
    def imported_since_start(self) -> list[str]:
        return sorted(set(sys.modules) - self.at_start)


class Draws(Actor):
    """One number from each random generator a proc may inherit from its template."""

    @endpoint
    def draw(self) -> tuple[float, float, float]:
        import random

        import numpy
        import torch

        return random.random(), float(numpy.random.rand()), float(torch.rand(1).item())
