"""Actors for tests of per-rank progress (importable by procs: they get our sys.path)."""

from __future__ import annotations

import os
import time

from jupyter_mesh import Actor, context, endpoint


class Gate(Actor):
    @endpoint
    def wait(self, path: str, free: list[int]) -> int:
        """Ranks in ``free`` answer at once; the others when ``path`` exists (at most 120 s)."""
        rank = context().actor_instance.rank.rank
        deadline = time.monotonic() + 120
        while rank not in free and not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        print(f"rank {rank} done")
        return rank
