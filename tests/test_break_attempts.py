"""What a reviewer found by trying to break the reliability fixes, one test each (real processes).

* a cancel during the first tensor call cut ``import torch`` in half (the proc's torch was broken);
* cancelling a first actor while it made nested calls lost one of its later nested calls;
* a stream reply that took seconds to unpickle on the receive thread made a healthy agent look lost;
* Ctrl-C on a call only queued behind another one reported it "still running", and a second Ctrl-C
  killed the procs running the other call;
* a stopped (SIGSTOP) fork server made ``spawn_procs`` wait 60 s, and cleaning up killed the host.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import threading
import time

import pytest
from _procs import template_of, wait_dead, wait_stopped

from jupyter_mesh import Actor, LocalJob, MeshCancelledError, MeshInterrupted, SupervisionError, endpoint

pytestmark = pytest.mark.integration


class Tensors(Actor):
    @endpoint
    def total(self, x) -> float:
        return float(x.sum())


def test_cancel_during_the_first_tensor_call_leaves_torch_whole(host):
    import torch

    pm = host.spawn_procs(per_host={"gpus": 1})  # a fresh proc: its first tensor imports torch
    try:
        t = pm.spawn("t", Tensors)
        t.initialized.get(10)
        fut = t.total.call_one(torch.ones(10))
        time.sleep(0.3)  # inside the import of torch, on this machine
        fut.cancel()
        with pytest.raises(MeshCancelledError):
            fut.get(30)
        for _ in range(3):
            assert t.total.call_one(torch.ones(10)).get(30) == 10.0
    finally:
        pm.stop(timeout=5)


class Pinged(Actor):
    @endpoint
    def ping(self, i: int) -> int:
        return i


class Pinger(Actor):
    def __init__(self, other) -> None:
        self.other = other

    @endpoint
    def loop(self, n: int) -> int:
        for i in range(n):
            assert self.other.ping.call_one(i).get(timeout=20) == i
        return n

    @endpoint
    def check(self) -> int:
        return self.other.ping.call_one(-1).get(timeout=10)


def test_cancelling_an_actor_in_the_middle_of_nested_calls_loses_none(host):
    targets = host.spawn_procs(per_host={"gpus": 1})
    callers = host.spawn_procs(per_host={"gpus": 1})
    try:
        b = targets.spawn("b", Pinged)
        a = callers.spawn("a", Pinger, b)  # the first actor of its proc: cancelled by a signal
        assert a.loop.call_one(5).get(30) == 5
        rng = random.Random(1)
        for _ in range(20):
            f = a.loop.call_one(100_000)
            time.sleep(rng.uniform(0.05, 0.3))
            f.cancel()
            assert a.check.call_one().get(20) == -1  # a lost sequence number would hang this
    finally:
        callers.stop(timeout=5)
        targets.stop(timeout=5)


def _slow_rebuild(x):
    time.sleep(4)
    return x


class SlowToUnpickle:
    def __reduce__(self):
        return (_slow_rebuild, (42,))


class Slow(Actor):
    @endpoint
    def get(self):
        return SlowToUnpickle()

    @endpoint
    def ok(self) -> int:
        return 1


def test_a_reply_slow_to_unpickle_does_not_make_its_agent_look_lost(host):
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        s = pm.spawn("s", Slow)
        assert [f.get(30) for f in s.get.stream()] == [42]  # 4 s of unpickling, past the 3 s timeout
        assert list(s.ok.call().get(10).values()) == [1]
    finally:
        pm.stop(timeout=5)


class Sleepy(Actor):
    @endpoint
    def slow(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def test_interrupting_a_queued_call_reports_it_stopped_and_kills_nothing(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        s = pm.spawn("s", Sleepy)
        s.initialized.get(10)
        pids = pm.pids()
        first = s.slow.call(3)
        queued = s.slow.call(0.1)
        timers = [threading.Timer(d, os.kill, (os.getpid(), signal.SIGINT)) for d in (0.3, 0.9)]
        for t in timers:
            t.start()
        with pytest.raises(MeshInterrupted, match="all stopped") as ei:
            queued.get(20)  # skipped where it waits: stopped at once, nothing to kill
        assert ei.value.still_running == []
        time.sleep(1.0)  # the second interrupt lands in this sleep, not in a report
    except KeyboardInterrupt:
        pass
    try:
        assert list(first.get(10).values()) == [3, 3]  # the running call was never touched
        assert pm.pids() == pids
    finally:
        pm.stop(timeout=5)


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_stopped_fork_server_fails_spawns_fast_and_spares_the_host():
    job = LocalJob(hosts=1)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        a = pm.spawn("a", Pid)
        pids = set(a.pid.call().get(10).values())
        agent = job.pids()[0]
        template = template_of(agent, pids)
        os.kill(template, signal.SIGSTOP)
        assert wait_stopped(template)
        try:
            # the cause names the stopped fork server: the agent's watch failed the start (after the
            # heartbeat timeout); the spawn's own 60 s timeout would raise MeshTimeoutError instead
            with pytest.raises(SupervisionError, match=r"(?s)never forked.*fork server .* is stopped"):
                job.host_mesh().spawn_procs(per_host={"gpus": 1})
        finally:
            os.kill(template, signal.SIGCONT)
        assert set(a.pid.call().get(10).values()) == pids  # the host and its mesh were spared
        pm2 = job.host_mesh().spawn_procs(per_host={"gpus": 1})  # resumed: it forks again
        assert len(list(pm2.spawn("b", Pid).pid.call().get(20).values())) == 1
        pm2.stop(timeout=5)
        pm.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 5)


# -- a second round ------------------------------------------------------------------------------


def test_a_controller_busy_in_native_code_loses_no_host():
    """The program holds the GIL for 5 s (one C call): the heartbeat thread cannot run, and that is
    not the agents' fault: the host survives. (A C ``sleep`` through ``PyDLL`` keeps the GIL for an exact
    wall time; a calibrated busy loop ran short when the machine sped up after calibrating.)"""
    job = LocalJob(hosts=1)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 1})
        a = pm.spawn("a", Pid)
        pid = a.pid.call_one().get(10)
        t0 = time.monotonic()
        ctypes.PyDLL(None).sleep(5)
        assert time.monotonic() - t0 > 3.5  # past the heartbeat timeout
        assert a.pid.call_one().get(10) == pid
        time.sleep(1.0)  # a late verdict would come now
        assert a.pid.call_one().get(10) == pid
        pm.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 5)


def test_a_slow_preload_in_the_fork_server_is_not_a_fault(tmp_path, monkeypatch):
    """A preload that waits on a child process for 10 s (a compiler, nvidia-smi): the fork server is
    busy, not dead; the spawn waits for it and works."""
    (tmp_path / "slow_preload_mod.py").write_text("import subprocess\nsubprocess.run(['sleep', '10'])\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    job = LocalJob(hosts=1)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 1}, preload=["slow_preload_mod"], timeout=60)
        assert pm.spawn("a", Pid).pid.call_one().get(20) == pm.pids()[0]
        pm.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 5)


def test_stopped_jobs_leave_no_sockets_in_the_controller(host):
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def cycle() -> None:
        job = LocalJob(hosts=2)
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 1})
        assert len(list(pm.spawn("a", Pid).pid.call().get(20).values())) == 2
        pm.stop(timeout=5)
        job.stop()

    cycle()  # warm: the first job opens what every later one reuses
    before = fds()
    for _ in range(3):
        cycle()
    time.sleep(0.5)
    assert fds() <= before + 2, f"{fds() - before} file descriptors more after 3 jobs"
