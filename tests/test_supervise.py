"""Actors that own meshes supervise them: __supervise__ handles, or the failure escalates."""

from __future__ import annotations

import os
import signal

import pytest
from _procs import wait_dead, wait_for
from actors import Supervisor

from jupyter_mesh import ActorError, ProcState, SupervisionError

pytestmark = pytest.mark.integration


def test_supervise_handles_child_failure(host):
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        sup = pm.spawn("sup", Supervisor, True).slice(gpus=0)
        kids = sup.start_children.call_one(2).get(timeout=30)
        os.kill(kids[1], signal.SIGKILL)
        seen = wait_for(lambda: sup.seen_failures.call_one().get(timeout=5), 5)
        assert seen == ["signal:{'workers': 1}"]
        with pytest.raises(ActorError) as ei:  # the owner's own calls to the dead rank still fail...
            sup.call_children.call_one().get(timeout=10)
        assert isinstance(ei.value.exception, SupervisionError)
        assert sup.respawn_children.call_one().get(timeout=30) == [1]  # ...until it respawns it
        assert sup.call_children.call_one().get(timeout=10) == ["fine", "fine"]
        assert pm.state().ranks[0].state != ProcState.FAILED
    finally:
        pm.stop()
    assert not wait_dead(kids, 5)  # the grandchildren went with their owner


def test_unhandled_child_failure_escalates_to_the_owner(host):
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        sup = pm.spawn("sup", Supervisor, False).slice(gpus=0)
        kids = sup.start_children.call_one(1).get(timeout=30)
        os.kill(kids[0], signal.SIGKILL)
        assert wait_for(lambda: pm.state().ranks[0].state == ProcState.FAILED, 5)
        f = pm.state().ranks[0].failure
        assert f.exit_code == 75 and "unhandled failure of a mesh it owns" in f.traceback
        assert not wait_dead(kids, 5)
    finally:
        pm.stop()
