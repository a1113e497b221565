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
