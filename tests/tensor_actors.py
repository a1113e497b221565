"""Actors and remote functions for test_tensor_engine.py (importable by the procs)."""

from __future__ import annotations

import os
import time

import torch

from jupyter_mesh import Actor, current_rank, endpoint, remote

T = 120  # seconds the tests wait: the first op on a mesh imports torch in each of its procs (slow when loaded)


class Holder(Actor):
    """Receives distributed tensors: each actor gets the shard of its own proc."""

    @endpoint
    def describe(self, t: torch.Tensor) -> tuple[str, list[float], dict[str, int]]:
        return type(t).__name__, t.flatten().tolist(), dict(current_rank())

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Linear(Actor):
    def __init__(self) -> None:
        self.w = torch.full((3, 3), 2.0)

    @endpoint(propagate=lambda x: x)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w

    @endpoint
    def no_shape(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @endpoint(propagate=lambda x: x)
    def ranked(self, x: torch.Tensor) -> torch.Tensor:
        return x + current_rank().rank


@remote
def rank_and_pid() -> tuple[dict[str, int], int]:
    from jupyter_mesh import context

    return dict(context().actor_instance.rank), os.getpid()


@remote(propagate=lambda x, path: x)
def wait_for_file(x: torch.Tensor, path: str) -> torch.Tensor:
    """Holds the proc's tensor engine until ``path`` exists (at most 60 s): ops queue behind it."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return x * 10


@remote(propagate=lambda x: x)
def fails_on_gpus_1(x: torch.Tensor) -> torch.Tensor:
    if dict(current_rank())["gpus"] == 1:
        raise RuntimeError("this proc refuses")
    return x


class Driver(Actor):
    """Given the user's ProcMesh, drives its tensor engine too (a second controller on the same procs)."""

    @endpoint
    def make(self, pm: object, value: float) -> list[float]:
        from jupyter_mesh import fetch_shard

        with pm.activate():  # type: ignore[attr-defined]
            self.x = torch.full((2,), value)
        return fetch_shard(self.x, gpus=0).get(timeout=60).tolist()  # type: ignore[no-any-return]


class Opener(Actor):
    """Opens a channel (its receiver stays here); may be spawned with a tensor."""

    def __init__(self, first: torch.Tensor | None = None) -> None:
        self.first = None if first is None else (type(first).__name__, first.tolist())

    @endpoint
    def open(self) -> object:
        from jupyter_mesh import Channel

        port, self.recv = Channel.open()
        return port

    @endpoint
    def first_arg(self) -> object:
        return self.first


@remote(propagate=lambda x, path: x)
def wait_on_gpus_1(x: torch.Tensor, path: str) -> torch.Tensor:
    """Holds only the engine of the proc at gpus=1 until ``path`` exists (at most 60 s)."""
    if dict(current_rank())["gpus"] == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
    return x
