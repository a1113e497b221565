"""Per-rank state and the event stream (the API widgets and the sidebar render)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from _procs import wait_for
from actors import Faulty

from jupyter_mesh import Failure, ProcState
from jupyter_mesh._core.state import StateTracker
from jupyter_mesh.lowlevel import mesh_states, subscribe


def test_tracker_transitions_without_processes():
    t = StateTracker()
    events = []
    unsub = t.subscribe(events.append)
    t.created("m", "mesh", {"gpus": 2}, [{"gpus": 0}, {"gpus": 1}])
    assert [r.state for r in t.snapshot("m").ranks] == [ProcState.STARTING] * 2
    t.ready("m", 0, 100)
    t.ready("m", 1, 101)
    t.activity("m", [0, 1], 1)
    t.activity("m", [0], -1)
    snap = t.snapshot("m")
    assert [r.state for r in snap.ranks] == [ProcState.IDLE, ProcState.BUSY]
    assert snap.counts()["busy"] == 1 and snap.ranks[1].inflight == 1
    f = Failure("mesh", {"gpus": 1}, "signal", "killed", signal=9)
    t.failed("m", 1, f)
    assert t.snapshot("m").failures == [f]
    t.stopped("m")
    assert t.snapshot("m").stopped
    kinds = [(e.kind, e.rank, e.state) for e in events]
    assert kinds[0] == ("created", None, None)
    assert ("failed", 1, ProcState.FAILED) in kinds and kinds[-1][0] == "stopped"
    unsub()
    t.created("n", "other", {}, [{}])
    assert events[-1].kind == "stopped"


@pytest.mark.integration
def test_live_state_and_events(host):
    events = []
    lock = threading.Lock()

    def listen(ev):
        with lock:
            events.append(ev)

    unsub = subscribe(listen)
    try:
        pm = host.spawn_procs(per_host={"gpus": 2}, name="watched")
        assert [r.state for r in pm.state().ranks] == [ProcState.IDLE] * 2 or wait_for(
            lambda: all(r.state == ProcState.IDLE for r in pm.state().ranks), 2
        )
        assert any(s.name == "watched" for s in mesh_states())
        f = pm.spawn("f", Faulty)
        fut = f.slice(gpus=1).sleep.call_one(0.5)
        assert wait_for(lambda: pm.state().ranks[1].state == ProcState.BUSY, 2)
        fut.get(timeout=5)
        assert wait_for(lambda: pm.state().ranks[1].state == ProcState.IDLE, 2)
        pid = pm.pids()[0]
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: pm.state().ranks[0].state == ProcState.FAILED, 2)
        assert time.monotonic() - t0 < 2
        assert pm.state().ranks[0].failure.signal == signal.SIGKILL
        pm.stop()
        assert all(r.state == ProcState.STOPPED for r in pm.state().ranks)
        assert not any(s.name == "watched" for s in mesh_states())
    finally:
        unsub()
    with lock:
        mine = [e for e in events if e.name == "watched"]
    kinds = [e.kind for e in mine]
    assert kinds[0] == "created" and "failed" in kinds and kinds[-1] == "stopped"
    ready = [e for e in mine if e.kind == "state" and e.previous == ProcState.STARTING]
    assert len(ready) == 2  # one progress step per proc


@pytest.mark.integration
def test_proc_mesh_lookup_by_id(procs):
    from jupyter_mesh import MeshValueError
    from jupyter_mesh.lowlevel import proc_mesh

    same = proc_mesh(procs.state().mesh_id)
    assert same.pids() == procs.pids() and same.name == procs.name
    with pytest.raises(MeshValueError, match="no proc mesh with id") as ei:
        proc_mesh("nope")
    assert "jupyter_mesh.lowlevel.mesh_states()" in str(ei.value)  # where to look, by a name that exists


def test_agent_output_lines_from_a_pipe():
    import os

    from jupyter_mesh._runtime.agent_state import read_lines

    r, w = os.pipe()
    os.set_blocking(r, False)
    buf = bytearray()
    try:
        assert read_lines(r, buf) == ([], False, False)  # nothing yet
        os.write(w, b"one\ntw")
        assert read_lines(r, buf) == (["one"], False, True)  # the partial line waits
        os.write(w, b"o\n")
        assert read_lines(r, buf) == (["two"], False, True)
        os.write(w, b"last words")
        os.close(w)
        w = -1
        assert read_lines(r, buf) == ([], False, True)
        assert read_lines(r, buf) == (["last words"], True, True)  # EOF flushes the rest
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
