"""Each process kind (proc, agent, fork server) killed or stopped (then resumed) at each moment (idle,
mid-call, mid-transfer of a 64 MiB argument, mid-spawn of another mesh): nothing hangs, what failed
says so with its cause, the job gives a working mesh again, and nothing is left behind. A stall shorter
than the heartbeat timeout (``test_stall``) is no fault at all: nothing may fail.

The specific outcomes of each fault are tested in ``test_faults.py``, ``test_liveness.py`` and
``test_break_attempts.py``; this is the cross product, with the properties every case must keep.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

import pytest
from _procs import descendants, template_of, wait_dead, wait_stopped

from jupyter_mesh import Actor, HostState, LocalJob, MeshError, ProcState, endpoint
from jupyter_mesh._runtime.hooks import drain_fault_hooks

pytestmark = pytest.mark.integration

KINDS = ["proc", "agent", "template"]
SIGNALS = ["kill", "stop"]
MOMENTS = ["idle", "call", "transfer", "spawn"]
STOPPED_FOR = 4.5  # past the 3 s heartbeat timeout
STALLED_FOR = 1.5  # half of it: a busy host, a swapped-out process, a debugger's pause


class Worker(Actor):
    @endpoint
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def numel(self, t) -> int:
        return int(t.numel())

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _target(job: LocalJob, procs: set[int], kind: str) -> int:
    """The first host's agent or fork server, or one of its procs."""
    agent = job.pids()[0]
    if kind == "agent":
        return agent
    if kind == "proc":
        return max(procs & descendants(agent))
    return template_of(agent, procs)


def _begin(moment: str, job: LocalJob, w: Any, call_s: float, spawned: list[object]) -> tuple[Any, Any]:
    """Put the mesh in ``moment``: a call of ``call_s`` seconds or a 64 MiB transfer under way, or another
    mesh being spawned (its result or error lands in ``spawned``); idle does nothing."""
    import torch

    fut = spawner = None
    if moment == "call":
        fut = w.sleep.call(call_s)
    elif moment == "transfer":
        fut = w.numel.call(torch.ones(16 * 1024 * 1024))  # 64 MiB to each rank
    elif moment == "spawn":

        def spawn() -> None:
            try:
                spawned.append(job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=30))
            except MeshError as e:
                spawned.append(e)

        spawner = threading.Thread(target=spawn)
        spawner.start()
        time.sleep(0.05)
    time.sleep(0.1)
    return fut, spawner


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("kind", KINDS)
def test_fault(kind, sig, moment):

    job = LocalJob(hosts=1)
    spawned: list[object] = []
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        w = pm.spawn("w", Worker)
        procs = set(w.pid.call().get(20).values())
        target = _target(job, procs, kind)
        fut, spawner = _begin(moment, job, w, STOPPED_FOR + 3, spawned)  # a call outlasts the fault
        os.kill(target, signal.SIGKILL if sig == "kill" else signal.SIGSTOP)
        if sig == "stop":
            assert wait_stopped(target)
            time.sleep(STOPPED_FOR)
            with contextlib.suppress(ProcessLookupError):  # given up and killed meanwhile, maybe
                os.kill(target, signal.SIGCONT)
        # nothing hangs: every call and spawn under way ends, with a value or an error that says why
        if fut is not None:
            try:
                fut.get(20)
            except MeshError as e:
                assert str(e).strip()
        if spawner is not None:
            spawner.join(40)
            assert not spawner.is_alive(), "spawn_procs hung"
        # the mesh answers, or says what broke; what failed is shown as failed, with a cause
        try:
            assert len(list(w.pid.call().get(20).values())) == 2
        except MeshError as e:
            assert str(e).strip()
        failed = [r for r in pm.state().ranks if r.state == ProcState.FAILED]
        assert all(r.failure is not None and r.failure.detail for r in failed)
        # stopping is bounded whatever happened: it returns (the join is a hang guard) and the procs are gone
        stopper = threading.Thread(target=pm.stop, kwargs={"timeout": 2}, daemon=True)
        stopper.start()
        stopper.join(60)
        assert not stopper.is_alive(), "pm.stop hung"
        assert pm.stopped and not wait_dead(procs, 10)
        for m in spawned:
            if not isinstance(m, BaseException):
                m.stop(timeout=2)  # type: ignore[attr-defined]
        # the job gives a working mesh again (a fresh agent or fork server where needed)
        pm2 = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=30)
        assert len(list(pm2.spawn("v", Worker).pid.call().get(30).values())) == 1
        pm2.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 5)
    assert not wait_dead(procs, 5)


@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_stall(kind, moment, hosts, recorded_faults):
    """Stopped for half the heartbeat timeout, then resumed: no fault at all. The call, the transfer
    and the spawn under way return their values, no rank fails, no host is given up, the fault hook
    hears nothing, and the mesh answers from the same procs. With two hosts, the stalled process is
    the first host's: the broadcast's gather waits for that host while the other answered."""

    job = LocalJob(hosts=hosts)
    spawned: list[object] = []
    before = len(recorded_faults)
    target = 0
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        w = pm.spawn("w", Worker)
        pids = w.pid.call().get(20)
        procs = set(pids.values())
        agents = job.pids()
        lost = dict(job._controller.links.lost)  # the session's controller: agents earlier tests gave up
        target = _target(job, procs, kind)
        fut, spawner = _begin(moment, job, w, STALLED_FOR + 1.5, spawned)  # a call spans the stall
        os.kill(target, signal.SIGSTOP)
        assert wait_stopped(target)
        time.sleep(STALLED_FOR)
        os.kill(target, signal.SIGCONT)
        if fut is not None:
            want = STALLED_FOR + 1.5 if moment == "call" else 16 * 1024 * 1024
            assert set(fut.get(20).values()) == {want}
        if spawner is not None:
            spawner.join(40)
            assert not spawner.is_alive(), "spawn_procs hung"
            (m,) = spawned
            assert not isinstance(m, BaseException), f"the spawn failed: {m}"
            assert len(m.spawn("v", Worker).pid.call().get(20)) == hosts  # type: ignore[attr-defined]
        time.sleep(2 * 0.75)  # two heartbeat ticks after the resume: a late verdict would be in by now
        assert w.pid.call().get(20) == pids
        st = pm.state()
        assert [(r.state, r.failure) for r in st.ranks] == [(ProcState.IDLE, None)] * 2 * hosts
        assert [h.state for h in st.hosts] == [HostState.UP] * hosts
        assert job.pids() == agents and job._controller.links.lost == lost
        assert drain_fault_hooks() and recorded_faults[before:] == [], "a stall is no fault: the hook heard it"
        pm.stop(timeout=5)
        assert not wait_dead(procs, 10)
        for m in spawned:
            m.stop(timeout=5)  # type: ignore[attr-defined]
    finally:
        with contextlib.suppress(ProcessLookupError):
            if target:
                os.kill(target, signal.SIGCONT)
        job.stop()
    assert not wait_dead(job.pids(), 5)
    assert not wait_dead(procs, 5)
