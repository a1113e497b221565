"""A proc busy in native code is not hung; an actor __init__ that never returns is shown and can time out."""

from __future__ import annotations

import os
import signal
import time

import pytest
from _procs import wait_dead, wait_for
from busy_actors import Native

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
        t0 = time.monotonic()
        with pytest.raises(SupervisionError, match="stopped answering heartbeats") as ei:
            fut.get(timeout=15)
        assert time.monotonic() - t0 < 8.0
        assert ei.value.failures[0].kind == "heartbeat"
        assert "state T" in ei.value.failures[0].detail
        assert not wait_dead([pid], 3)
        assert pm.state().ranks[0].state == ProcState.FAILED
        assert pm.state().ranks[0].note == ""
    finally:
        pm.stop(timeout=2)


def test_silent_proc_with_no_progress_is_still_hung(host):
    """A C call that sleeps holding the GIL (no CPU, no thread running) looks like a native deadlock:
    killed after the heartbeat timeout, with that cause."""
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        n = pm.spawn("n", Native)
        pid = n.pid.call_one().get(timeout=10)
        t0 = time.monotonic()
        fut = n.native_sleep.call_one(60)
        with pytest.raises(SupervisionError, match="made no progress") as ei:
            fut.get(timeout=15)
        assert time.monotonic() - t0 < 8.0
        assert ei.value.failures[0].kind == "heartbeat"
        assert not wait_dead([pid], 3)
    finally:
        pm.stop(timeout=2)


def test_notes_render_in_the_table_and_its_titles():
    """Unit: a rank's note reaches the text and HTML tables (the widget and sidebar get it on the wire)."""
    from jupyter_mesh._state import StateTracker
    from jupyter_mesh.ui.table import html_table, text_table
    from jupyter_mesh.ui.wire import mesh_wire

    st = StateTracker()
    events = []
    st.subscribe(events.append)
    st.created("m-1", "m", {"gpus": 2}, [{"gpus": 0}, {"gpus": 1}])
    st.ready("m-1", 0, 10)
    st.ready("m-1", 1, 11)
    st.note("m-1", 1, "no answer for 12 s, busy in native code holding the GIL (CPU 100 %)")
    st.initializing("m-1", [0], "trainer")
    wire = mesh_wire(st.snapshot("m-1"))
    assert wire["ranks"][0]["note"] == "initializing 'trainer' (0 s)"
    text = text_table([wire])
    assert "[gpus=1] no answer for 12 s, busy in native code" in text
    assert "[gpus=0] initializing 'trainer' (0 s)" in text
    assert "busy in native code holding the GIL (CPU 100 %)" in html_table([wire])
    assert [e.kind for e in events].count("note") == 2
    st.initializing("m-1", [0], "trainer", done=True)
    st.note("m-1", 1, "")
    assert [r.note for r in st.snapshot("m-1").ranks] == ["", ""]
    st.note("m-1", 1, "busy")
    st.failed("m-1", 1, __import__("jupyter_mesh").errors.Failure("m", {"gpus": 1}, "exit", "gone"))
    assert st.snapshot("m-1").ranks[1].note == ""
