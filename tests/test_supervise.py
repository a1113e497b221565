"""Actors that own meshes supervise them: __supervise__ handles, or the failure escalates."""

from __future__ import annotations

import os
import signal
import time

import pytest
from _procs import wait_dead, wait_for
from actors import Faulty, Supervisor

from jupyter_mesh import ActorError, ProcState, SupervisionError
from jupyter_mesh.errors import MeshFailure

pytestmark = pytest.mark.integration


def test_supervise_handles_child_failure(host):
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        sup = pm.spawn("sup", Supervisor, True).slice(gpus=0)
        kids = sup.start_children.call_one(2, True).get(timeout=30)
        os.kill(kids[1], signal.SIGKILL)
        seen = wait_for(lambda: sup.seen_failures.call_one().get(timeout=5), 5)
        time.sleep(0.5)  # (a second, wrong, notice would come with the first)
        # as in Monarch: named after the actor mesh on it; not the mesh on worker 0 alone, whose actor lives
        assert sup.seen_failures.call_one().get(timeout=5) == seen == ["signal:kids:{'workers': 1}"]
        with pytest.raises(ActorError) as ei:  # the owner's own calls to the dead rank still fail...
            sup.call_children.call_one().get(timeout=10)
        assert isinstance(ei.value.exception, SupervisionError)
        assert sup.respawn_children.call_one().get(timeout=30) == [1]  # ...until it respawns it
        assert sup.call_children.call_one().get(timeout=10) == ["fine", "fine"]
        assert pm.state().ranks[0].state != ProcState.FAILED
    finally:
        pm.stop()
    assert not wait_dead(kids, 5)  # the grandchildren went with their owner


def test_unhandled_child_failure_fails_the_owner_actor_not_its_proc(host, recorded_faults):
    """As in Monarch: the owner actor fails (its mesh is named to the fault hook), its proc and a
    sibling actor there live on, and the meshes it spawned are stopped."""
    start = len(recorded_faults)
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        sib = pm.spawn("sib", Faulty).slice(gpus=0)
        sup = pm.spawn("sup", Supervisor, False).slice(gpus=0)
        kids = sup.start_children.call_one(1).get(timeout=30)
        os.kill(kids[0], signal.SIGKILL)
        faults = wait_for(lambda: [f for f in recorded_faults[start:] if isinstance(f, MeshFailure)], 10)
        assert faults and faults[0].mesh_name == "sup" and "did not handle a failure" in str(faults[0])
        with pytest.raises(SupervisionError, match="sup did not handle a failure of a mesh it owns"):
            sup.seen_failures.call_one().get(timeout=10)
        assert sib.ok.call_one().get(timeout=10) == "fine"  # the proc lives on, and its other actors
        assert pm.state().ranks[0].state != ProcState.FAILED
        assert not wait_dead(kids, 5)
    finally:
        pm.stop()
