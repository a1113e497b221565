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


class Collector(Actor):
    """What a full collection costs a fresh proc: the pages of its template it makes private, and
    whether the collector walks the template's objects at all."""

    @endpoint
    def full_collection(self, types: list[str]) -> tuple[float, dict[str, bool]]:
        import gc
        import importlib

        def private_mib() -> float:
            with open("/proc/self/smaps_rollup") as f:
                fields = {line.split(":")[0]: int(line.split()[1]) for line in f.read().splitlines()[1:]}
            return (fields["Private_Dirty"] + fields["Private_Clean"]) / 1024

        before = private_mib()
        gc.collect()
        grown = private_mib() - before
        wanted = {}
        for name in types:
            module, _, attr = name.rpartition(".")
            wanted[name] = getattr(importlib.import_module(module), attr)
        walked = {name: False for name in types}
        for o in gc.get_objects():  # what the collector walks: the frozen objects are not among them
            for name, t in wanted.items():
                if o is t:
                    walked[name] = True
        return grown, walked
