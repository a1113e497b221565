"""A proc busy in native code is not hung; an actor __init__ that never returns is shown and can time out."""

from __future__ import annotations

import os
import signal
import time

import pytest
from _procs import wait_dead, wait_for, wait_stopped
from busy_actors import Native, SlowInit, Waiter

from jupyter_mesh import ProcState, SupervisionError

pytestmark = pytest.mark.integration


def test_proc_holding_the_gil_in_native_code_is_busy_not_hung(host):
    """Its pong cannot be sent for 8 s (> the 3 s heartbeat timeout), yet it uses CPU: it lives on,
    its call returns, and the state says why it does not answer."""
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        n = pm.spawn("n", Native)
        n.initialized.get(timeout=10)
        t0 = time.monotonic()
        fut = n.slice(gpus=1).spin.call_one(8.0)
        assert wait_for(lambda: "busy" in pm.state().ranks[1].note, 12), pm.state().ranks[1]
        note = pm.state().ranks[1].note
        seen = time.monotonic() - t0
        assert "native" in note and "CPU" in note, note
        assert pm.state().ranks[0].note == ""
        assert fut.get(timeout=60) == "done"
        assert pm.state().ranks[1].state != ProcState.FAILED
        assert wait_for(lambda: pm.state().ranks[1].note == "", 5), pm.state().ranks[1]
        assert list(n.ping.call().get(timeout=10).values()) == ["pong", "pong"]
        print(f"busy note after {seen:.1f} s: {note!r}")
    finally:
        pm.stop(timeout=2)


def test_busy_proc_that_is_then_stopped_is_hung(host):
    """Busy protects only a proc that makes progress: SIGSTOP it while busy and heartbeats find it."""
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        n = pm.spawn("n", Native)
        pid = n.pid.call_one().get(timeout=10)
        fut = n.spin.call_one(30.0)
        assert wait_for(lambda: "busy" in pm.state().ranks[0].note, 12), pm.state().ranks[0]
        os.kill(pid, signal.SIGSTOP)
        assert wait_stopped(pid)
        # the call (30 s) cannot end on its own within the hang guard: only the heartbeat verdict ends it
        with pytest.raises(SupervisionError, match="stopped answering heartbeats") as ei:
            fut.get(timeout=15)
        assert ei.value.failures[0].kind == "heartbeat"
        assert "state T" in ei.value.failures[0].detail
        assert not wait_dead([pid], 3)
        assert pm.state().ranks[0].state == ProcState.FAILED
        assert pm.state().ranks[0].note == ""
    finally:
        pm.stop(timeout=2)


def test_silent_proc_with_no_progress_is_still_hung(host):
    """A native deadlock holding the GIL (stuck on a futex: no CPU, no thread running or asleep on a
    timer) is hung: killed after the heartbeat timeout, with that cause."""
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        n = pm.spawn("n", Native)
        pid = n.pid.call_one().get(timeout=10)
        fut = n.native_deadlock.call_one()  # never returns: only the heartbeat verdict ends the call
        with pytest.raises(SupervisionError, match="made no progress") as ei:
            fut.get(timeout=15)
        assert ei.value.failures[0].kind == "heartbeat"
        assert not wait_dead([pid], 3)
    finally:
        pm.stop(timeout=2)


def test_native_sleep_holding_the_gil_is_busy_not_hung(host):
    """The issue's example: ``ctypes.PyDLL(None).sleep(5)`` silences the proc for 5 s, past the 3 s
    timeout; its thread sleeps on a timer, so it is left alone and its call returns."""
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        n = pm.spawn("n", Native)
        n.initialized.get(timeout=10)
        fut = n.native_sleep.call_one(6)
        assert wait_for(lambda: "waiting in native code" in pm.state().ranks[0].note, 10), pm.state().ranks[0]
        assert fut.get(timeout=30) is None
        assert pm.state().ranks[0].state != ProcState.FAILED
        assert n.ping.call_one().get(timeout=10) == "pong"
    finally:
        pm.stop(timeout=2)


def test_notes_render_in_the_table_and_its_titles():
    """Unit: a rank's note reaches the text and HTML tables (the widget and sidebar get it on the wire)."""
    from jupyter_mesh._core.state import StateTracker
    from jupyter_mesh.ui.table import html_table, text_table
    from jupyter_mesh.ui.wire import mesh_wire

    st = StateTracker()
    events = []
    st.subscribe(events.append)
    st.created("m-1", "m", {"gpus": 2}, [{"gpus": 0}, {"gpus": 1}])
    st.ready("m-1", 0, 10)
    st.ready("m-1", 1, 11)
    st.note("m-1", 1, "no answer for 12 s, busy in native code holding the GIL (CPU 100 %)")
    st.initializing("m-1", [0], "trainer-1a2b", "trainer")
    wire = mesh_wire(st.snapshot("m-1"))
    assert wire["ranks"][0]["note"] == "initializing 'trainer' (0 s)"
    text = text_table([wire])
    assert "[gpus=1] no answer for 12 s, busy in native code" in text
    assert "[gpus=0] initializing 'trainer' (0 s)" in text
    assert "busy in native code holding the GIL (CPU 100 %)" in html_table([wire])
    assert [e.kind for e in events].count("note") == 2
    st.initializing("m-1", [0], "trainer-1a2b", done=True)
    st.note("m-1", 1, "")
    assert [r.note for r in st.snapshot("m-1").ranks] == ["", ""]
    st.note("m-1", 1, "busy")
    st.failed("m-1", 1, __import__("jupyter_mesh").errors.Failure("m", {"gpus": 1}, "exit", "gone"))
    assert st.snapshot("m-1").ranks[1].note == ""


def test_init_that_does_not_return_is_shown_then_times_out(host, tmp_path):
    """The state says "initializing" while __init__ runs; past init_timeout the spawn, a call waiting
    behind it and later calls fail with kind init on the ranks that overran; their procs are killed
    and can be respawned (the marker file makes the second __init__ return)."""
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        pids = pm.pids()
        t0 = time.monotonic()
        s = pm.spawn("slow", SlowInit, [1], str(tmp_path / "tried"), init_timeout=4)
        waiting = s.ping.call()
        # rank 0 is up while rank 1 is still initializing: nothing fails before the init timeout
        assert wait_for(lambda: pm.state().ranks[0].note == "", 10), pm.state().ranks[0]
        assert "initializing 'slow'" in pm.state().ranks[1].note
        assert not s.initialized.done() and not waiting.done()
        # the __init__ never returns: the init timeout is the only thing that can end the spawn
        with pytest.raises(SupervisionError) as ei:
            s.initialized.get(timeout=30)
        took = time.monotonic() - t0
        [f] = ei.value.failures
        assert f.kind == "init" and dict(f.coords) == {"gpus": 1}
        assert "__init__ of SlowInit (actor mesh 'slow') did not return within 4 s" in str(ei.value)
        assert "respawn" in str(ei.value).lower()
        with pytest.raises(SupervisionError, match="did not return within 4 s"):
            waiting.get(timeout=10)
        with pytest.raises(SupervisionError, match="did not return within 4 s"):
            s.slice(gpus=1).ping.call_one().get(timeout=10)
        assert s.slice(gpus=0).ping.call_one().get(timeout=10) == "pong"
        assert not wait_dead([pids[1]], 5)
        r1 = pm.state().ranks[1]
        assert r1.state == ProcState.FAILED and r1.failure.kind == "init" and r1.note == ""
        assert pm.respawn() == [1]
        assert list(s.ping.call().get(timeout=10).values()) == ["pong", "pong"]
        print(f"init timeout (4 s) reported after {took:.1f} s: {f.detail!r}")
    finally:
        pm.stop(timeout=2)


def test_init_timeout_from_the_environment_and_unbounded_by_default(host, monkeypatch):
    pm = host.spawn_procs(per_host={"gpus": 1})
    notes = []
    unsubscribe = pm.subscribe(lambda ev: notes.append(ev.note) if ev.kind == "note" else None)
    try:
        s = pm.spawn("free", SlowInit, [0])  # no limit: it keeps initializing, shown as such
        # live views are told how long, every few seconds
        assert wait_for(lambda: any(n.startswith("initializing 'free' (") and n != notes[0] for n in notes), 12), notes
        assert "initializing 'free' (" in pm.state().ranks[0].note
        assert not s.initialized.done()
        monkeypatch.setenv("JUPYTER_MESH_INIT_TIMEOUT", "2")
        s2 = pm.spawn("capped", SlowInit, [0])  # queued behind the first one's __init__
        with pytest.raises(SupervisionError, match="did not return within 2 s") as ei:
            s2.initialized.get(timeout=20)
        assert ei.value.failures[0].kind == "init"
        with pytest.raises(SupervisionError, match="did not return within 2 s"):
            s.initialized.get(timeout=10)  # same proc, killed: the first spawn fails as well
    finally:
        unsubscribe()
        pm.stop(timeout=2)


def test_init_timeout_argument_is_checked():
    from jupyter_mesh import Actor, MeshValueError
    from jupyter_mesh._api.proc_mesh import ProcMesh

    class Takes(Actor):
        def __init__(self, init_timeout: float):
            self.t = init_timeout

    pm = ProcMesh.__new__(ProcMesh)
    pm._check_open = lambda: None  # type: ignore[method-assign]
    with pytest.raises(MeshValueError, match="keeps the keyword init_timeout"):
        pm.spawn("t", Takes, init_timeout=3)
    with pytest.raises(MeshValueError, match="positive number"):
        pm.spawn("t", SlowInit, [], init_timeout=-1)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("JUPYTER_MESH_INIT_TIMEOUT", "soon")
    try:
        with pytest.raises(MeshValueError, match="JUPYTER_MESH_INIT_TIMEOUT='soon'"):
            pm.spawn("t", SlowInit, [])
    finally:
        monkeypatch.undo()


def test_native_wait_on_a_child_holding_the_gil_is_busy(host):
    """``system()`` through PyDLL: the actor thread waits for its child in the kernel, holding the GIL."""
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        w = pm.spawn("w", Waiter)
        w.initialized.get(timeout=10)
        fut = w.native_system.call_one(b"sleep 6")
        assert wait_for(lambda: "waiting in native code" in pm.state().ranks[0].note, 10), pm.state().ranks[0]
        assert fut.get(timeout=30) == 0
        assert pm.state().ranks[0].state != ProcState.FAILED
    finally:
        pm.stop(timeout=2)


def test_a_deadlock_is_hung_even_beside_a_sleeping_thread(host):
    """Only the threads that run endpoints are evidence: a user's background thread in ``time.sleep``
    does not make a deadlocked proc look busy."""
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        w = pm.spawn("w", Waiter)
        w.initialized.get(timeout=10)
        # the deadlock never ends: the heartbeat verdict ("made no progress") is the only way out;
        # "busy" (the sleeper counted as progress) would leave the call waiting past the hang guard
        with pytest.raises(SupervisionError, match="made no progress") as ei:
            w.deadlock_beside_a_sleeper.call_one().get(timeout=15)
        assert ei.value.failures[0].kind == "heartbeat"
    finally:
        pm.stop(timeout=2)
