"""Per-rank progress of a call (issue 16, point 3): an agent gathers a host's replies into one message,
yet the controller learns which ranks are done as they finish, from small rate-limited events."""

from __future__ import annotations

import os
import threading
import time

import pytest
from _procs import wait_for
from gate_actors import Gate

from jupyter_mesh import ProcState
from jupyter_mesh._runtime.progress import ProgressSender
from jupyter_mesh._wire.protocol import Kind, progress, progress_calls


def test_a_progress_header_off_the_wire_keeps_only_what_parses():
    h = progress({7: [0, 2], 9: [1]})
    assert h["k"] == Kind.PROGRESS and progress_calls(h) == [(7, [0, 2]), (9, [1])]
    bad = {"k": Kind.PROGRESS, "p": [[1, [0, "x", 2.0, True, 3]], ["7", [1]], [2], "junk", [3, "ranks"], [4, []]]}
    assert progress_calls(bad) == [(1, [0, 3]), (4, [])]
    assert progress_calls({"k": Kind.PROGRESS, "p": "no list"}) == [] and progress_calls({}) == []


def test_the_sender_batches_ranks_and_skips_completed_gathers():
    """News waits one interval: the ranks done meanwhile leave as one message per caller, and a gather
    that completed meanwhile (``forget``: its gathered reply went out) sends none."""
    sent: list[tuple[str, dict]] = []
    two = threading.Event()

    def send(to, header):
        sent.append((to, header))
        if len(sent) == 2:
            two.set()

    s = ProgressSender(send, interval=1.0)
    try:
        for r in range(100):
            s.done("ctl", 1, r)
        s.done("ctl", 2, 5)
        s.done("other", 3, 1)
        s.forget("ctl", 2)
        assert sent == []  # nothing at once: the interval first
        assert two.wait(10)
        assert sorted(sent) == [("ctl", progress({1: list(range(100))})), ("other", progress({3: [1]}))]
        s.done("ctl", 4, 0)  # a fast cast: its gather completes within the interval
        s.forget("ctl", 4)
        time.sleep(2.0)
        assert s.sent == 2
    finally:
        s.close()


@pytest.mark.integration
def test_state_shows_which_ranks_are_done_before_the_call_ends(procs, tmp_path):
    """Ranks 0 and 2 answer at once, 1 and 3 when the test creates a file: meanwhile the state says 2/4
    done, which are left and that they are busy, though the host's gathered reply has not come."""
    gate = procs.spawn("gate", Gate)
    gate.initialized.get(timeout=30)
    opened = tmp_path / "open"
    fut = gate.wait.call(str(opened), [0, 2])
    try:
        assert wait_for(lambda: (p := procs.state().progress) is not None and p.done == (0, 2), 30), procs.state()
        st = procs.state()
        assert st.progress is not None and st.progress.left == (1, 3)
        assert str(st.progress).startswith("2/4 done, left: 1, 3 (")
        assert [r.state for r in st.ranks] == [ProcState.IDLE, ProcState.BUSY, ProcState.IDLE, ProcState.BUSY]
        assert st.ranks[0].busy_s == 0 and st.ranks[1].busy_s > 0
        assert not fut.done()
    finally:
        opened.touch()
    assert list(fut.get(timeout=60).values()) == [0, 1, 2, 3]
    st = procs.state()
    assert st.progress is None and [r.state for r in st.ranks] == [ProcState.IDLE] * 4
    assert all(r.inflight == 0 for r in st.ranks)
    # a rank reported done and a second call to it: it is busy again, and counted once
    opened.unlink()
    fut = gate.wait.call(str(opened), [3])
    try:
        assert wait_for(lambda: (p := procs.state().progress) is not None and p.done == (3,), 30), procs.state()
        assert procs.state().progress.left == (0, 1, 2)  # type: ignore[union-attr]
    finally:
        opened.touch()
    assert list(fut.get(timeout=60).values()) == [0, 1, 2, 3]
    assert [r.inflight for r in procs.state().ranks] == [0] * 4


@pytest.mark.integration
def test_each_host_agent_reports_its_own_ranks(tmp_path):
    """Two hosts, one rank done on each: both agents' reports reach the state before either gather ends."""
    from _procs import descendants, wait_dead

    from jupyter_mesh import LocalJob

    before = descendants(os.getpid())
    job = LocalJob(hosts=2)
    opened = tmp_path / "open"
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        gate = pm.spawn("gate", Gate)
        gate.initialized.get(timeout=30)
        fut = gate.wait.call(str(opened), [0, 3])  # rank 0 on host 0, rank 3 on host 1
        try:
            assert wait_for(lambda: (p := pm.state().progress) is not None and p.done == (0, 3), 30), pm.state()
            assert [str(r.state) for r in pm.state().ranks] == ["idle", "busy", "busy", "idle"]
        finally:
            opened.touch()
        assert list(fut.get(timeout=60).values()) == [0, 1, 2, 3]
        pm.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(descendants(os.getpid()) - before, 10), "the job's agents or procs outlived it"
