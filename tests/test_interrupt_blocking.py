"""Cancel (Interrupt ■, ``Future.cancel()``, Ctrl-C in ``get``) stops a sync endpoint even inside a
blocking call, and the actor answers the next call at once.

The first actor of a proc runs on the proc's main thread, where signals are handled: a cancel is a
signal aimed at that thread, so ``time.sleep``, ``select``, socket reads and lock waits return with
``KeyboardInterrupt``. Further actors on the same proc run on threads of their own, where a cancel
lands at the next Python instruction only (documented in the README).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from _procs import wait_dead, wait_for

from jupyter_mesh import Actor, MeshCancelledError, MeshInterrupted, context, endpoint

pytestmark = pytest.mark.integration


class Blocker(Actor):
    def __init__(self) -> None:
        self.interrupted: list[str] = []

    @endpoint
    def block(self, how: str, seconds: float, started: str = "") -> str:
        """``started``: a path prefix; ``{started}{rank}`` is created as the call begins (a cancel
        that comes before skips the call, and nothing is interrupted)."""
        import select
        import socket
        import threading

        if started:
            open(f"{started}{context().actor_instance.rank.rank}", "w").close()
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
def test_cancel_stops_a_blocking_call(procs, how, tmp_path):
    b = procs.spawn("b", Blocker).slice(gpus=1)
    b.initialized.get(10)
    if how == "torch":  # the first call imports torch (seconds): interrupt the op, not the import
        assert b.block.call_one(how, 0).get(60) == "finished"
    fut = b.block.call_one(how, 60, str(tmp_path / "started"))
    assert wait_for(lambda: os.path.exists(tmp_path / "started1"), 30)
    time.sleep(0.5)  # it is blocked now
    assert fut.cancel()
    with pytest.raises(MeshCancelledError):
        fut.get(0)  # released by cancel() itself
    # stopped inside the call, and answers the next one: a call still blocked (60 s) would keep this
    # one queued past its hang guard
    assert b.seen.call_one().get(10) == [how]


def test_cancel_of_a_whole_mesh_call_in_sleep(procs, tmp_path):
    b = procs.spawn("b", Blocker)
    b.initialized.get(10)
    fut = b.block.call("sleep", 60, str(tmp_path / "started"))
    assert wait_for(lambda: all(os.path.exists(tmp_path / f"started{r}") for r in range(4)), 30)
    time.sleep(0.5)  # they are asleep now
    fut.cancel()
    # every rank was interrupted inside its sleep (60 s) and answers the next call within the hang guard
    assert list(b.seen.call().get(10).values()) == [["sleep"]] * 4


def _interrupt_after(*delays: float) -> list[threading.Timer]:
    timers = [threading.Timer(d, os.kill, args=(os.getpid(), signal.SIGINT)) for d in delays]
    for t in timers:
        t.start()
    return timers


def test_interrupt_says_where_the_call_stopped(procs):
    b = procs.spawn("b", Blocker)
    b.initialized.get(10)
    fut = b.block.call("sleep", 60)
    _interrupt_after(0.5)
    with pytest.raises(MeshInterrupted, match=r"cancelled b.block on 4 ranks .*all stopped in") as ei:
        fut.get(30)
    assert isinstance(ei.value, KeyboardInterrupt) and ei.value.still_running == []
    assert ei.value._render_traceback_() == [str(ei.value)]  # IPython shows this line, no traceback


def test_interrupt_names_ranks_still_running_and_a_second_one_kills_them(procs):
    first = procs.spawn("first", Blocker)  # takes the procs' main threads
    second = procs.spawn("second", Blocker)  # runs on threads of its own: sleep ignores the cancel
    second.initialized.get(10)
    one = second.slice(gpus=2)
    fut = one.block.call_one("sleep", 60)
    _interrupt_after(0.5)
    with pytest.raises(MeshInterrupted, match=r"(?s)still run after .*procs.kill") as ei:
        fut.get(30)
    assert ei.value.still_running == [{"gpus": 2}]
    # pressed twice: the second interrupt, while it waits for the ranks, kills what still runs
    fut2 = second.slice(gpus=3).block.call_one("sleep", 60)
    pid = procs.pids()[3]
    _interrupt_after(0.5, 1.2)
    with pytest.raises(MeshInterrupted, match=r"interrupted again, so the procs of 1 rank .*gpus=3.* were killed"):
        fut2.get(30)
    assert not wait_dead([pid], 5)
    assert first.slice(gpus=0).seen.call_one().get(5) == []  # the others are untouched
