"""Actors for tests/test_busy_and_init.py (importable by procs: they get our sys.path)."""

from __future__ import annotations

import ctypes
import os
import time

from jupyter_mesh import Actor, current_rank, endpoint


def _hold_gil_busy(seconds: float) -> int:
    """Burn CPU for at least about ``seconds`` inside one C call that never lets go of the GIL (``sum``
    over a ``range`` runs in C: no bytecode, so no GIL hand-over), like a long native kernel would.

    The count comes from the fastest of a few timed tries, and then half again: a machine that was
    busy while calibrating and idle afterwards would otherwise run it short (seen in CI: 5 s ran 2.8 s).
    """
    n = 2_000_000
    per = 1.0
    for _ in range(5):
        t0 = time.perf_counter()
        sum(range(n))
        per = min(per, max(time.perf_counter() - t0, 1e-6) / n)
    return sum(range(int(1.5 * seconds / per)))


def _native_deadlock() -> None:
    """Lock a plain pthread mutex twice from C while holding the GIL: stuck for good on a futex."""
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER (a normal mutex)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)


class Native(Actor):
    @endpoint
    def spin(self, seconds: float) -> str:
        _hold_gil_busy(seconds)
        return "done"

    @endpoint
    def native_sleep(self, seconds: int) -> None:
        ctypes.PyDLL(None).sleep(seconds)  # PyDLL: the GIL stays held

    @endpoint
    def native_deadlock(self) -> None:
        _native_deadlock()

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class SlowInit(Actor):
    """``__init__`` does not return on ``ranks`` (for 300 s) unless ``marker`` exists; it creates
    the marker first, so a respawned proc's second try returns at once."""

    def __init__(self, ranks: list[int], marker: str = ""):
        if current_rank().rank in ranks and not (marker and os.path.exists(marker + str(current_rank().rank))):
            if marker:
                open(marker + str(current_rank().rank), "w").close()
            time.sleep(300)

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Waiter(Actor):
    """Holds the GIL while it waits in the kernel, or deadlocks with a sleeping thread beside it."""

    @endpoint
    def native_system(self, command: bytes) -> int:
        return ctypes.PyDLL(None).system(command)  # the GIL stays held while the child runs

    @endpoint
    def deadlock_beside_a_sleeper(self) -> None:
        import threading

        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()  # not an actor thread
        time.sleep(0.1)
        _native_deadlock()
