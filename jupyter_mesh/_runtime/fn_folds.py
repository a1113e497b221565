"""The threads that fold a user's reduce function, at most ``max_reduce_fn_folds`` at once per process.

A function's fold runs on a thread of its own (in each agent that folds it, and in the caller) so a
slow one holds up no other reduce. A Python thread cannot be killed: a function that never returns
keeps its thread until the process ends. Without a bound, every such reduce left one more thread in
every agent it reached; with one, a reduce that finds every slot taken fails at once (``ReduceError``),
saying how many folds still run there and since when, and a fold that returns frees its slot.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import config
from ..errors import MeshValueError

__all__ = ["DEFAULT_MAX", "FnFolds", "limit"]

DEFAULT_MAX = 32
"""Folds of reduce functions that may run at once in one process. A fold takes milliseconds: 32 at
once means stuck functions (or very many slow reduces in flight), not ordinary use."""

KEY, ENV = "max_reduce_fn_folds", config.OURS["max_reduce_fn_folds"][0]


def limit() -> int:
    """The configured bound: ``configure(max_reduce_fn_folds=N)`` (the caller), else the environment
    (``JUPYTER_MESH_MAX_REDUCE_FN_FOLDS``: an agent reads only that, as it was when the agent started)."""
    value = config.setting(KEY)
    try:
        n = int(value) if value is not None and value != "" else DEFAULT_MAX
    except (TypeError, ValueError):
        n = -1
    if n < 1:
        raise MeshValueError(
            f"{KEY} must be an integer >= 1, got {value!r}; set it with jupyter_mesh.configure({KEY}=N) or {ENV}"
        )
    return n


class FnFolds:
    """The folds of reduce functions running in this process (an agent's relay, or a caller)."""

    def __init__(self, where: str):
        self.where = where  # how errors name this process: "the caller", "this host agent"
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}  # token -> when its fold began (monotonic)
        self._next = 0

    def running(self) -> int:
        with self._lock:
            return len(self._started)

    def start(self, target: Callable[[Any], object], arg: Any, name: str) -> str:
        """Run ``target(arg)`` on a thread of its own; "" if it started, else why not (every slot taken:
        the ``ReduceError``'s text)."""
        try:
            cap = limit()
        except MeshValueError as e:
            return str(e)
        with self._lock:
            if len(self._started) >= cap:
                oldest = time.monotonic() - min(self._started.values())
                return (
                    f"{len(self._started)} folds of reduce functions are still running in {self.where} on host "
                    f"{socket.gethostname()} (pid {os.getpid()}; the oldest began {oldest:.0f} s ago), the most "
                    f"allowed ({KEY}={cap}): a reduce function never returned (or folds that slowly), and each "
                    "such fold keeps its thread"
                )
            token, self._next = self._next, self._next + 1
            self._started[token] = time.monotonic()

        def run() -> None:
            try:
                target(arg)
            finally:
                with self._lock:
                    del self._started[token]

        try:
            threading.Thread(target=run, name=name, daemon=True).start()
        except BaseException:
            with self._lock:
                del self._started[token]
            raise
        return ""


HINT = (
    "What to do: find the reduce function that does not return (it must take two results and return one, "
    "quickly) and fix it; named ops (sum, prod, min, max) are not held up. A Python thread cannot be killed: "
    "each stuck fold keeps its slot until the process ends (an agent: stop the job and start a new one; the "
    f"caller: restart the kernel). If that many slow folds are meant to run at once, raise the limit: {ENV}=N "
    f"in the agents' environment, configure({KEY}=N) for the caller."
)
"""The ``ReduceError``'s advice when every slot was taken."""
