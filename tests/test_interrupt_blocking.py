"""Cancel (Interrupt ■, ``Future.cancel()``, Ctrl-C in ``get``) stops a sync endpoint even inside a
blocking call, and the actor answers the next call at once.

The first actor of a proc runs on the proc's main thread, where signals are handled: a cancel is a
signal aimed at that thread, so ``time.sleep``, ``select``, socket reads and lock waits return with
``KeyboardInterrupt``. Further actors on the same proc run on threads of their own, where a cancel
lands at the next Python instruction only (documented in the README).
"""

from __future__ import annotations

import time

import pytest

from jupyter_mesh import Actor, MeshCancelledError, endpoint

pytestmark = pytest.mark.integration


class Blocker(Actor):
    def __init__(self) -> None:
        self.interrupted: list[str] = []

    @endpoint
    def block(self, how: str, seconds: float) -> str:
        import select
        import socket
        import threading

        try:
            if how == "sleep":
                time.sleep(seconds)
            elif how == "select":
                select.select([], [], [], seconds)
            elif how == "socket":
                a, b = socket.socketpair()
                a.settimeout(seconds)
                try:
                    a.recv(1)
                finally:
                    a.close()
                    b.close()
            elif how == "lock":
                lock = threading.Lock()
                lock.acquire()
                lock.acquire(timeout=seconds)
            elif how == "torch":
                import torch

                # a long op made of many short ones: torch checks for Python signals between them
                x = torch.ones(256, 256)
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    x = x @ x / 256.0
        except KeyboardInterrupt:
            self.interrupted.append(how)
            raise
        return "finished"

    @endpoint
    def seen(self) -> list[str]:
        return self.interrupted


@pytest.mark.parametrize("how", ["sleep", "select", "socket", "lock", "torch"])
def test_cancel_stops_a_blocking_call(procs, how):
    b = procs.spawn("b", Blocker).slice(gpus=1)
    b.initialized.get(10)
    if how == "torch":  # the first call imports torch (seconds): interrupt the op, not the import
        assert b.block.call_one(how, 0).get(60) == "finished"
    fut = b.block.call_one(how, 60)
    time.sleep(0.5)  # it is blocked now
    t0 = time.monotonic()
    assert fut.cancel()
    with pytest.raises(MeshCancelledError):
        fut.get(1)
    assert b.seen.call_one().get(5) == [how]  # stopped inside the call, and answers the next one
    assert time.monotonic() - t0 < 2.0


def test_cancel_of_a_whole_mesh_call_in_sleep(procs):
    b = procs.spawn("b", Blocker)
    b.initialized.get(10)
    fut = b.block.call("sleep", 60)
    time.sleep(0.5)
    t0 = time.monotonic()
    fut.cancel()
    assert list(b.seen.call().get(5).values()) == [["sleep"]] * 4
    assert time.monotonic() - t0 < 2.0
