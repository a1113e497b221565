"""Actors that get stuck in recognisable places, for ``ProcMesh.stacks`` (tests/test_stacks.py)."""

from __future__ import annotations

import re
import threading
import time

from jupyter_mesh import Actor, context, endpoint

_never = threading.Event()


def wait_for_peers(timeout: float) -> None:
    _never.wait(timeout)  # like a collective whose peers never come


def load_next_batch(timeout: float) -> None:
    time.sleep(timeout)  # like a data loader that stalls


class Stuck(Actor):
    @endpoint
    def step(self, timeout: float) -> int:
        """Rank 3 stalls in its data loader; the others wait for peers."""
        if context().actor_instance.rank.rank == 3:
            load_next_batch(timeout)
        else:
            wait_for_peers(timeout)
        return context().actor_instance.rank.rank

    @endpoint
    def hold_the_gil(self) -> None:
        """Catastrophic backtracking in ``re``: native code that never lets go of the GIL."""
        re.match(r"(a+)+$", "a" * 64 + "b")
