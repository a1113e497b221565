"""Actors that stop in ``breakpoint()`` / ``pdb.set_trace()``, for remote pdb (tests/test_remote_pdb.py)."""

from __future__ import annotations

import pdb

from jupyter_mesh import Actor, context, endpoint


class Stopper(Actor):
    @endpoint
    def step(self, x: int) -> int:
        """Every rank (or only ``only``) stops; ``y`` exists after one ``n``."""
        breakpoint()
        y = x * 10
        return y + context().actor_instance.rank.rank

    @endpoint
    def some(self, x: int, ranks: list[int]) -> int:
        if context().actor_instance.rank.rank in ranks:
            pdb.set_trace()
        return x + 1

    @endpoint
    async def astep(self, x: int) -> int:
        z = x + 5
        breakpoint()
        return z

    @endpoint
    def fail(self, x: int) -> int:
        ratio = x / 0  # post-mortem stops here
        return int(ratio)

    @endpoint
    def ping(self) -> int:
        return context().actor_instance.rank.rank


class Owner(Actor):
    """Spawns a mesh of its own whose actor stops in ``breakpoint()``."""

    @endpoint
    def run_child(self) -> int:
        from jupyter_mesh import this_host

        procs = this_host().spawn_procs(per_host={"workers": 1})
        try:
            return int(procs.spawn("child", Stopper).step.call_one(2).get(timeout=60))
        finally:
            procs.stop()


def wait_paused(n: int, timeout: float = 30.0) -> list:  # of debug.PausedActor
    """On the controller: the paused actors once there are ``n`` of them (``debug.paused()``)."""
    import time

    from jupyter_mesh import debug

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = debug.paused()
        if len(now) >= n:
            return now
        time.sleep(0.05)
    raise AssertionError(f"expected {n} paused actors, got {debug.paused()}")
