"""Actors for tests/test_tree.py (importable by procs: they get our sys.path)."""

from __future__ import annotations

import os
import time
from typing import Any

from jupyter_mesh import Actor, context, endpoint


class Echo(Actor):
    def __init__(self, held: Any = None):
        self.held = held
        self.stored: Any = None

    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    def store(self, x: Any) -> None:
        self.stored = x

    @endpoint
    def get_stored(self) -> Any:
        return self.stored

    @endpoint
    def get_held(self) -> Any:
        return self.held

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def rank(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint
    def value(self, kind: str) -> Any:
        """A rank-dependent value for reduce tests: a number, a tensor or an array of 4, a 0-dim tensor."""
        r = context().actor_instance.rank.rank
        if kind == "tensor":
            import torch

            return torch.tensor([r, -r, r % 3, 1.0]) + 1
        if kind == "large":  # 2 MiB: a reduce folds it in the agents all the same
            import torch

            return (torch.arange(512 * 1024, dtype=torch.float64) % 7 - r) / 4
        if kind == "scalar":  # a 0-dim tensor
            import torch

            return torch.tensor(float(r + 1))
        if kind == "array":
            import numpy

            return numpy.array([r, -r, r % 3, 1.0]) + 1
        return r + 1

    @endpoint
    def odd_one(self, rank: int, odd: Any, dtype: str = "float32") -> Any:
        """``odd`` on ``rank``, elsewhere a tensor of ``dtype`` (reduce tests of values that do not mix)."""
        import torch

        r = context().actor_instance.rank.rank
        return odd if r == rank else torch.tensor([r, -r, r % 3, 1], dtype=getattr(torch, dtype)) + 1

    @endpoint
    def fail_on(self, rank: int) -> int:
        if context().actor_instance.rank.rank == rank:
            raise ValueError(f"rank {rank} refuses")
        return 1

    @endpoint
    def wait(self, path: str) -> int:
        """Answers once ``path`` exists (at most 60 s)."""
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return context().actor_instance.rank.rank


class Caller(Actor):
    """Casts to a mesh it was given, from inside a proc (actor -> actor through the agents' tree)."""

    @endpoint
    def cast(self, mesh: Any, adverb: str, payload: Any) -> tuple[Any, int]:
        from jupyter_mesh._runtime.client import current_client

        client = current_client()
        before = client.cast_sends
        if adverb == "call":
            out: Any = list(mesh.echo.call(payload).get(60).values())
        elif adverb == "stream":
            out = [f.get(60) for f in mesh.echo.stream(payload)]
        else:  # a reduce from inside a proc
            out = mesh.rank.reduce("sum").get(60)
        return out, client.cast_sends - before

    @endpoint
    def try_call(self, mesh: Any, endpoint: str, *args: Any) -> tuple[str, Any]:
        """``mesh.<endpoint>.call(*args)`` from here: ("ok", values) or ("err", failure kinds and hosts, text)."""
        from jupyter_mesh import MeshError

        try:
            return "ok", list(getattr(mesh, endpoint).call(*args).get(60).values())
        except MeshError as e:
            failures = getattr(e, "failures", [])
            return "err", (sorted((f.kind, f.coords.get("hosts", -1)) for f in failures), str(e))
