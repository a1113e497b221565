"""An actor that tells where its proc came from (``test_seed.py``)."""

import os
import sys

from jupyter_mesh import Actor, endpoint


class Probe(Actor):
    @endpoint
    def where(self) -> tuple[int, int, bool]:
        """Its pid, its parent's (the fork server that forked it), and whether the warm module is loaded."""
        return os.getpid(), os.getppid(), "seed_warm_import" in sys.modules

    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)
