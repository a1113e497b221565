"""Elasticity: kill a rank, respawn it in place with its actors re-created; logs are kept."""

from __future__ import annotations

import signal

import pytest
from _procs import wait_dead, wait_for
from actors import Counter, Faulty

from jupyter_mesh import MeshValueError, ProcState, SupervisionError

pytestmark = pytest.mark.integration


def test_kill_then_respawn_in_place(procs):
    counters = procs.spawn("counters", Counter, 10)
    faulty = procs.slice(gpus=slice(2, 4)).spawn("faulty", Faulty)
    assert list(counters.incr.call().get(timeout=10).values()) == [11] * 4
    old = procs.pids()
    procs.kill({"hosts": 0, "gpus": 2})
    assert not wait_dead([old[2]], 3)
    assert wait_for(lambda: procs.state().ranks[2].state == ProcState.FAILED, 3)
    with pytest.raises(SupervisionError, match="killed on request"):
        counters.incr.call().get(timeout=5)
    assert procs.respawn() == [2]
    assert procs.pids()[2] != old[2] and procs.state().ranks[2].state == ProcState.IDLE
    # the respawned rank has fresh actors built from the original spawn arguments
    assert list(counters.incr.call().get(timeout=10).values()) == [12, 12, 11, 12]
    assert counters.slice(gpus=2).whoami.call_one().get(timeout=10) == {"hosts": 0, "gpus": 2}
    assert list(faulty.ok.call().get(timeout=10).values()) == ["fine", "fine"]
    # ordering still holds on the new proc
    futs = [counters.slice(gpus=2).incr.call_one() for _ in range(20)]
    assert [f.get(timeout=10) for f in futs] == list(range(12, 32))


def test_respawn_rejects_live_ranks_and_kill_dead_ones(procs):
    with pytest.raises(MeshValueError, match="have not failed"):
        procs.respawn([1])
    assert procs.respawn() == []
    procs.kill(1, signal.SIGKILL)
    assert wait_for(lambda: procs.state().ranks[1].state == ProcState.FAILED, 3)
    with pytest.raises(Exception, match="not running"):
        procs.kill(1)
    with pytest.raises(MeshValueError, match="out of range"):
        procs.kill(9)


def test_logs_are_kept_per_rank(procs):
    f = procs.spawn("f", Faulty)
    f.shout.call("line for the log").get(timeout=10)
    assert wait_for(lambda: len([x for x in procs.logs() if "line for the log" in x]) == 4, 3)
    one = procs.logs(rank=3, tail=1)
    assert one == ["[" + procs.name + " hosts=0,gpus=3] line for the log"]
