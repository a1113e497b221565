"""``ProcMesh.stacks()`` / ``%mesh stacks``: where each rank is now, identical stacks folded (issue 15)."""

from __future__ import annotations

import os
import signal
import time

from _procs import wait_stopped
from stack_actors import Stuck


def test_stuck_ranks_show_where_they_are_and_identical_stacks_fold(procs):
    stuck = procs.spawn("stuck", Stuck)
    fut = stuck.step.call(30)
    time.sleep(1.0)
    st = procs.stacks()
    text = str(st)
    assert "ranks 0-2:" in text and "rank 3 (gpus=3):" in text, text
    assert text.count("in wait_for_peers") == 1, text  # three ranks, printed once
    assert "in load_next_batch" in text and "time.sleep(timeout)" in text, text
    assert "stack_actors.py" in text and "jupyter_mesh/_runtime" not in text, text  # our frames left out
    one = procs.stacks(rank={"gpus": 3})
    assert [r.rank for r in one.ranks] == [3] and "load_next_batch" in str(one)
    full = str(procs.stacks(rank=0, all_threads=True))
    assert "thread lifeline" in full and "jupyter_mesh" in full, full  # asked for: the runtime's too
    assert not fut.done()  # looking did not disturb them


def test_idle_ranks_say_so(procs):
    procs.spawn("stuck", Stuck).initialized.get(30)
    text = str(procs.stacks())
    assert "ranks 0-3:" in text and "idle: no thread runs user code" in text, text


def test_a_rank_that_holds_the_gil_or_is_stopped_or_failed_says_why(procs):
    stuck = procs.spawn("stuck", Stuck)
    stuck.initialized.get(30)
    stuck.slice(gpus=0).hold_the_gil.broadcast()
    pids = procs.pids()
    os.kill(pids[1], signal.SIGSTOP)
    assert wait_stopped(pids[1])
    os.kill(pids[2], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while procs.state().ranks[2].state.value != "failed" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    try:
        st = procs.stacks(timeout=2.0)
        by_rank = {r.rank: r for r in st.ranks}
        assert (
            "no answer within 2 s" in by_rank[0].error and f"py-spy dump --native --pid {pids[0]}" in by_rank[0].error
        )
        assert "no answer within 2 s" in by_rank[1].error
        assert by_rank[2].error.startswith("failed:") and "SIGKILL" in by_rank[2].error, by_rank[2].error
        assert not by_rank[3].error and "idle" in str(st)
    finally:
        os.kill(pids[1], signal.SIGCONT)
