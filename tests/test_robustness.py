"""Regression tests for hangs and wrong results found in review: each would hang or lie before."""

from __future__ import annotations

import os
import signal
import time

import pytest
from _procs import wait_for
from actors import Faulty, Tricky

from jupyter_mesh import ActorError, ProcState, SupervisionError
from jupyter_mesh._runtime.hooks import drain_fault_hooks

pytestmark = pytest.mark.integration


def test_an_exception_that_cannot_be_printed_still_comes_back(procs):
    t = procs.spawn("t", Tricky).slice(gpus=0)
    with pytest.raises(ActorError, match="BadStr"):
        t.raise_bad_str.call_one().get(timeout=10)
    assert t.ok.call_one().get(timeout=10) == "fine"  # the actor still serves


def test_arguments_are_values_not_views(procs):
    np = pytest.importorskip("numpy")
    t = procs.spawn("t", Tricky).slice(gpus=1)
    buf = np.zeros(100_000)  # 800 kB: sent as its own zero-copy frame
    futs = []
    for i in range(20):
        buf[0] = i
        futs.append(t.first.call_one(buf))
        buf[0] = -1  # changed right after the call: the actor must still see i
    assert [f.get(timeout=20) for f in futs] == [float(i) for i in range(20)]


class _KillWhilePickled:
    def __init__(self, pid):
        self.pid = pid

    def __reduce__(self):
        os.kill(self.pid, signal.SIGKILL)
        time.sleep(1.0)  # the death is reported while the arguments are still being pickled
        return (int, (0,))


def test_rank_dying_while_arguments_are_pickled_fails_the_call(host):
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        f = pm.spawn("f", Faulty)
        pid = f.slice(gpus=0).pid.call_one().get(timeout=10)
        fut = f.slice(gpus=0).echo.call_one(_KillWhilePickled(pid))
        with pytest.raises(SupervisionError):
            fut.get(timeout=5)
    finally:
        pm.stop(timeout=2)


@pytest.mark.parametrize("topology,kill", [("one agent", "proc"), ("two agents", "proc"), ("two agents", "agent")])
def test_a_rank_that_answered_then_died_fails_the_waiting_call_and_counts_as_told(
    host, recorded_faults, topology, kill
):
    """Found by CI on SLURM: a scancel's SIGTERM cancels a proc's call (it answers), then its agent
    dies. Where the answer had reached us (ranks on other hosts: no agent holds it for a gather), the
    call still waited on the other rank, so the death went to the fault hook as if nobody had been
    told (a script exited 1), and the call went on waiting for the live rank."""
    job, pm = _grid(host, topology)
    try:
        f = pm.spawn("f", Faulty)
        pids = list(f.pid.call().get(timeout=20).values())
        before = len(recorded_faults)
        fut = f.fail_on_else_sleep.call([1], 30.0)
        time.sleep(1.0)  # rank 1 has raised; rank 0 sleeps
        assert job or kill == "proc"
        os.kill(job.agents()[1].pid if kill == "agent" else pids[1], signal.SIGKILL)
        with pytest.raises(SupervisionError) as err:  # not a timeout: it does not wait for the live rank
            fut.get(timeout=15)
        assert [fl.coords for fl in err.value.failures] == [{"hosts": 1, "gpus": 0} if job else {"gpus": 1}]
        time.sleep(0.5)
        assert drain_fault_hooks() and recorded_faults[before:] == [], "the caller was told: the hook must not be"
    finally:
        pm.stop(timeout=2)
        if job:
            job.stop()


def _grid(host, topology):
    from jupyter_mesh import LocalJob

    job = LocalJob(hosts=2) if topology == "two agents" else None
    pm = (job.host_mesh() if job else host).spawn_procs(per_host={"gpus": 1 if job else 2})
    return job, pm


@pytest.mark.parametrize("topology", ["one agent", "two agents"])
def test_ranks_of_one_call_dying_one_after_the_other_are_all_told(host, recorded_faults, topology):
    """The first death fails the call at once; the rank still running it dies a moment later (a lost
    host's ranks, a killed fork server's procs, a scancel: one at a time). Its caller was told the call
    failed: that second death must not reach the fault hook as unhandled (a script would exit 1)."""
    job, pm = _grid(host, topology)
    try:
        f = pm.spawn("f", Faulty)
        pids = list(f.pid.call().get(timeout=20).values())
        before = len(recorded_faults)
        fut = f.sleep.call(30.0)
        time.sleep(0.5)
        victims = [a.pid for a in job.agents()] if job else pids
        os.kill(victims[0], signal.SIGKILL)
        with pytest.raises(SupervisionError):
            fut.get(timeout=15)
        os.kill(victims[1], signal.SIGKILL)
        assert wait_for(lambda: all(r.state == ProcState.FAILED for r in pm.state().ranks), 15)
        time.sleep(0.5)
        assert drain_fault_hooks() and recorded_faults[before:] == [], "the caller was told: the hook must not be"
    finally:
        pm.stop(timeout=2)
        if job:
            job.stop()


@pytest.mark.parametrize("topology", ["one agent", "two agents"])
def test_a_later_death_of_a_rank_that_ran_the_failed_call_is_news(host, recorded_faults, monkeypatch, topology):
    """The other side: the rank still running the failed call finished it and dies long after the
    incident (``outcomes.DOOMED_S``, cut to 1 s here), with nothing waiting on it: that death is news,
    and the fault hook hears it."""
    from jupyter_mesh._runtime import outcomes

    monkeypatch.setattr(outcomes, "DOOMED_S", 1.0)
    job, pm = _grid(host, topology)
    try:
        f = pm.spawn("f", Faulty)
        pids = list(f.pid.call().get(timeout=20).values())
        before = len(recorded_faults)
        fut = f.fail_on_else_sleep.call([], 2.0)
        time.sleep(0.5)
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(SupervisionError):
            fut.get(timeout=15)
        second = pm.state().ranks[1].coords
        assert f.slice(**second).ok.call_one().get(timeout=20) == "fine"  # after its sleep
        time.sleep(1.5)
        os.kill(pids[1], signal.SIGKILL)
        assert wait_for(lambda: len(recorded_faults) > before, 15), "the later death was not reported"
        assert [fl.coords for m in recorded_faults[before:] for fl in m.failures] == [second]
    finally:
        pm.stop(timeout=2)
        if job:
            job.stop()


def test_stream_survives_a_shrink(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        f = pm.spawn("f", Faulty)
        stream = f.sleep.stream(1.0)
        time.sleep(0.2)
        pm.resize(gpus=1)
        outcomes = [fut.exception(timeout=10) for fut in stream]
        assert sorted(type(o).__name__ for o in outcomes) == ["MeshClosedError", "NoneType"]
    finally:
        pm.stop(timeout=2)


def test_actor_calling_a_stopped_mesh_is_told(host):
    target = host.spawn_procs(per_host={"gpus": 1})
    callers = host.spawn_procs(per_host={"gpus": 1})
    try:
        other = target.spawn("other", Tricky)
        caller = callers.spawn("caller", Tricky).slice(gpus=0)
        assert caller.call_other.call_one(other, 10).get(timeout=15) == "answered"
        target.stop()
        # told at once (as Monarch): the actor's own 10 s wait would have said MeshTimeoutError
        assert caller.call_other.call_one(other, 10).get(timeout=15) == SupervisionError.__name__
    finally:
        callers.stop()
