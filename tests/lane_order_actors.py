"""Actors for the lane ordering tests (importable by procs: they get our sys.path)."""

from __future__ import annotations

import os
import time
from typing import Any

from jupyter_mesh import Actor, endpoint


class Log(Actor):
    """Records the tag of every message it gets, in the order it ran them."""

    def __init__(self) -> None:
        self.tags: list[int] = []

    @endpoint
    def note(self, tag: int, payload: Any) -> int:
        self.tags.append(tag)
        return tag

    @endpoint
    def hold(self, path: str, timeout: float = 60.0) -> bool:
        """Keeps the actor's thread away from its inbox until ``path`` exists: what comes meanwhile
        waits there."""
        with open(path + ".in", "w"):  # it runs
            pass
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    @endpoint
    def seen(self) -> list[int]:
        return list(self.tags)

    @endpoint
    def send_to(self, other: Any, payloads: list[Any]) -> list[int]:
        """Actor -> actor: every payload to ``other`` without waiting, then wait for all."""
        futs = [other.note.call_one(i, p) for i, p in enumerate(payloads)]
        return [f.get(60) for f in futs]
