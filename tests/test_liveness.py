"""Hung procs and silent hosts are found by heartbeats (default timeout 3 s)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from _procs import wait_dead, wait_for, wait_stopped
from actors import Faulty

from jupyter_mesh import LocalJob, MeshTimeoutError, ProcState, SupervisionError

pytestmark = pytest.mark.integration

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stall_driver.py")


def test_sigstopped_proc_is_declared_dead_by_heartbeat(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        f = pm.spawn("f", Faulty)
        pid = f.slice(gpus=1).pid.call_one().get(timeout=10)
        fut = f.slice(gpus=1).sleep.call_one(60)
        os.kill(pid, signal.SIGSTOP)
        assert wait_stopped(pid)
        # the call (60 s) cannot end on its own within the hang guard: the heartbeat verdict ends it
        with pytest.raises(SupervisionError, match="stopped answering heartbeats") as ei:
            fut.get(timeout=10)
        assert ei.value.failures[0].kind == "heartbeat"
        assert not wait_dead([pid], 3)  # killed, so the rank can be respawned
        assert pm.state().ranks[1].state == ProcState.FAILED
        assert pm.respawn() == [1]
        assert f.slice(gpus=1).ok.call_one().get(timeout=10) == "fine"
    finally:
        pm.stop(timeout=2)


def _io_counters(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/io") as f:
        d = dict(line.split(": ") for line in f.read().splitlines())
    return int(d["syscr"]), int(d["syscw"])


def test_idle_procs_are_not_woken_by_heartbeats():
    """An idle proc is told alive from /proc (``quiet``), not pinged: nothing reaches it while it idles
    (its ZeroMQ I/O thread would signal an eventfd: a read and a write the kernel counts). A host of its
    own: the session's host, after the whole suite, did not let its procs count as idle (not understood
    yet; they are then pinged as before)."""
    job = LocalJob(hosts=1)
    pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
    try:
        f = pm.spawn("f", Faulty)
        pid = f.slice(gpus=1).pid.call_one().get(timeout=10)
        f.ok.call().get(timeout=10)

        def untouched_for_3_intervals() -> bool:  # pinged, it would see I/O every 0.75 s
            before = _io_counters(pid)
            time.sleep(2.5)
            return _io_counters(pid) == before

        # known idle after one answered ping with every thread asleep (a loaded host may take longer)
        assert wait_for(untouched_for_3_intervals, 30)
        assert list(f.ok.call().get(timeout=10).values()) == ["fine", "fine"]  # and it still answers
    finally:
        pm.stop(timeout=2)
        job.stop()


def test_idle_sigstopped_proc_is_declared_dead_by_heartbeat(host):
    """A stopped proc does no I/O either: the state in /proc/<pid>/stat, not silence, gets it pinged,
    and its silence then kills it as before, with nobody calling it."""
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        f = pm.spawn("f", Faulty)
        pid = f.slice(gpus=1).pid.call_one().get(timeout=10)
        time.sleep(3.0)  # known idle by now
        os.kill(pid, signal.SIGSTOP)
        assert wait_stopped(pid)
        assert wait_for(lambda: pm.state().ranks[1].state == ProcState.FAILED, 8)
        assert not wait_dead([pid], 3)
        assert pm.state().ranks[0].state != ProcState.FAILED
        with pytest.raises(SupervisionError, match="stopped answering heartbeats"):
            f.slice(gpus=1).ok.call_one().get(timeout=10)
    finally:
        pm.stop(timeout=2)


def test_stop_with_a_hung_proc_is_bounded(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    pids = list(pm.pids().values())
    os.kill(pids[0], signal.SIGSTOP)
    assert wait_stopped(pids[0])
    # a stopped proc cannot finalize: stop() kills it after its timeout and returns (the join is a hang guard)
    stopper = threading.Thread(target=pm.stop, kwargs={"timeout": 1.0}, daemon=True)
    stopper.start()
    stopper.join(30)
    assert not stopper.is_alive(), "pm.stop hung on a stopped proc"
    assert not wait_dead(pids, 3)


def test_silent_host_agent_fails_its_ranks():
    job = LocalJob(hosts=1)
    agent = job.pids()[0]
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        f = pm.spawn("f", Faulty)
        f.initialized.get(timeout=10)
        fut = f.sleep.call(60)
        os.kill(agent, signal.SIGSTOP)
        assert wait_stopped(agent)
        # the calls (60 s) cannot end on their own within the hang guard: the agent's verdict ends them
        with pytest.raises(SupervisionError, match="stopped answering heartbeats") as ei:
            fut.get(timeout=10)
        assert {x.kind for x in ei.value.failures} == {"agent"}
        assert wait_for(lambda: all(r.state == ProcState.FAILED for r in pm.state().ranks), 10)
    finally:
        with contextlib.suppress(ProcessLookupError):  # a lost agent is killed: it may be gone
            os.kill(agent, signal.SIGCONT)
        job.stop()
    assert not wait_dead([agent], 5)


@pytest.mark.parametrize("moment", ["idle", "mid-call"])
def test_an_agent_stalled_past_its_procs_timeout_keeps_them(moment, monkeypatch):
    """An agent that could not run for longer than its procs' heartbeat timeout (SIGSTOP here; a starved
    or suspended host the same) finds their pongs unread when it resumes: that silence is its own, and it
    must not kill them as deadlocked (it did: every idle proc, each "no thread running ... a deadlock").
    The controller is made lenient so that only the agent's verdict on its procs is tested."""
    job = LocalJob(hosts=1)
    agent = job.pids()[0]
    try:
        # the agent itself keeps the 3 s it was started with; the controller is the session's: put back after
        monkeypatch.setattr(job._controller.links, "hb_timeout", 120.0)
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        f = pm.spawn("f", Faulty)
        pids = f.pid.call().get(timeout=10)
        fut = None
        if moment == "idle":  # told idle from /proc and not pinged: no pong on its way to refresh it

            def untouched() -> bool:
                before = [_io_counters(p) for p in pids.values()]
                time.sleep(1.6)
                return [_io_counters(p) for p in pids.values()] == before

            assert wait_for(untouched, 20, 0.0)
        else:
            fut = f.sleep.call(6.0)
        os.kill(agent, signal.SIGSTOP)
        assert wait_stopped(agent)
        time.sleep(4.5)  # past the agent's 3 s verdict on a silent proc
        os.kill(agent, signal.SIGCONT)
        time.sleep(2.0)  # the agent's next ticks (every 0.75 s) get their chance to judge
        if fut is not None:
            assert set(fut.get(timeout=20).values()) == {6.0}
        assert f.pid.call().get(timeout=10) == pids
        assert [r.state for r in pm.state().ranks] != [ProcState.FAILED] * 2
        assert all(r.failure is None for r in pm.state().ranks)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signal.SIGCONT)
        job.stop()
    assert not wait_dead([agent, *pids.values()], 5)


def test_a_controller_stalled_past_the_heartbeat_timeout_keeps_its_agent():
    """A controller that could not run for longer than the heartbeat timeout (SIGSTOP here; a kernel
    holding the GIL in a long C call, a laptop's lid closed) finds its agent's answers unread when it
    resumes: that silence is its own (``AgentLinks._forgive``), so the agent is not lost, no rank fails,
    the call that ended meanwhile returns its value, and the mesh answers from the same procs. Its own
    process, for the test to stop; it reports what it sees (``stall_driver.py``)."""
    driver = subprocess.Popen(
        [sys.executable, DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    pids: list[int] = []
    try:
        assert driver.stdout is not None and driver.stdin is not None
        ready = json.loads(driver.stdout.readline() or "{}")
        assert ready, "the driver did not start its mesh"
        pids = [ready["agent"], *ready["procs"].values()]
        os.kill(driver.pid, signal.SIGSTOP)
        assert wait_stopped(driver.pid)
        time.sleep(4.5)  # past the 3 s heartbeat timeout (the agent waits 9 s for a silent controller)
        os.kill(driver.pid, signal.SIGCONT)
        driver.stdin.write("resumed\n")
        driver.stdin.flush()
        seen = json.loads(driver.stdout.readline() or "{}")
        assert "error" not in seen, seen["error"]
        assert seen["lost"] == {} and seen["hosts"] == ["up"], seen["lost"]
        assert seen["faults"] == [], "the fault hook was told of a failure"
        assert seen["call"] == [3.0] and seen["answers"] == ["fine", "fine"]
        assert seen["same_agent"] and seen["same_procs"]
        assert seen["ranks"] == [["idle", "None"]] * 2
        assert json.loads(driver.stdout.readline() or "{}") == {"stopped": True}
        assert driver.wait(30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(driver.pid, signal.SIGCONT)
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        for f in (driver.stdin, driver.stdout):
            if f is not None:
                f.close()
    assert not wait_dead(pids, 5)


def test_a_tensor_call_to_a_sigstopped_proc_returns_at_once_and_keeps_value_semantics(host):
    """A proc that reads nothing (SIGSTOP) must not hold the caller: call_one returned only once
    ZeroMQ let go of the argument's memory, i.e. once the agent declared the proc dead (~3 s) and its
    socket closed. A buffer below the shared-memory size is now copied as it is sent, a larger one goes
    through a segment: the call returns a pending future that times out, and what the actor gets is
    the argument as it was at the call (the caller changed it afterwards)."""
    np = pytest.importorskip("numpy")

    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        f = pm.spawn("f", Faulty)
        pid = f.pid.call_one().get(timeout=10)
        small, large = np.zeros(512 << 10, np.uint8), np.zeros(4 << 20, np.uint8)
        os.kill(pid, signal.SIGSTOP)
        try:
            assert wait_stopped(pid)
            futs = [f.echo.call_one(x) for x in (small, large)]
            small[:], large[:] = 1, 1  # value semantics: the calls carry what the arrays held then
            assert not any(fut.done() for fut in futs)  # not failed: the caller was not held until the kill
            for fut in futs:
                with pytest.raises(MeshTimeoutError):
                    fut.get(timeout=0.3)
        finally:
            os.kill(pid, signal.SIGCONT)
        got = [fut.get(timeout=30) for fut in futs]  # a timed-out get cancels nothing: the replies come
        assert [g.nbytes for g in got] == [small.nbytes, large.nbytes]
        assert not any(g.any() for g in got)
    finally:
        pm.stop(timeout=2)


def test_the_heartbeat_thread_sleeps_between_pings_and_ends_when_the_controller_closes_it():
    """It sleeps until its next ping (it woke every 0.1 s to look for a close: 0.2 % of a core,
    idle); a close rings its bell. With a 20 s timeout its next ping is 5 s away: over 1.5 s it polls
    once or twice, and it ends well before that ping."""
    script = (
        "import threading, time, zmq\n"
        "polls = []\n"
        "inner = zmq.Poller.poll\n"
        "def counting(self, *a, **k):\n"
        "    if threading.current_thread().name == 'jupyter-mesh-heartbeat':\n"
        "        polls.append(time.monotonic())\n"
        "    return inner(self, *a, **k)\n"
        "zmq.Poller.poll = counting\n"
        "from jupyter_mesh._runtime.controller import Controller\n"
        "c = Controller.get()\n"
        "time.sleep(1.5)\n"
        "t = c.links._thread\n"
        "assert t.is_alive()\n"
        "t0 = time.monotonic()\n"
        "c.links.close()\n"
        "t.join(4.0)\n"
        "print('ended' if not t.is_alive() else 'alive', round(time.monotonic() - t0, 2), len(polls))\n"
        "c.shutdown()\n"
    )
    env = dict(os.environ, JUPYTER_MESH_HEARTBEAT_TIMEOUT="20")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    state, took, polls = out.stdout.split()
    assert state == "ended" and float(took) < 2.0, out.stdout
    assert int(polls) <= 3, out.stdout  # the close's wake-up included (15 with 0.1 s slices)


_POLLER = "import select, sys\nsys.stdout.write('up\\n'); sys.stdout.flush()\nselect.poll().poll()\n"


def test_idle_procs_are_still_pinged_now_and_then_each_at_its_own_tick():
    """``QuietProcs`` on real processes asleep in poll (as an idle proc's threads are): once known
    idle after traffic, each goes 3/4 to all of ``FIRST_QUIET_PING`` ticks without a ping; once that
    ping found it idle all along, 3/4 to all of ``QUIET_PING_EVERY``. Their phases differ, so the
    forced pings of procs that went idle together do not all fall on one tick; a stopped one is no
    longer idle."""
    from jupyter_mesh._runtime.quiet import FIRST_QUIET_PING, QUIET_PING_EVERY, QuietProcs, idle_shaped

    kids = [subprocess.Popen([sys.executable, "-c", _POLLER], stdout=subprocess.PIPE) for _ in range(6)]
    try:
        for k in kids:
            assert k.stdout is not None and k.stdout.readline() == b"up\n"
            assert wait_for(lambda pid=k.pid: idle_shaped(pid), 10)  # asleep in poll by now (ticks below are not)
        q = QuietProcs()
        firsts, laters = [], []
        for k in kids:
            pong, seq = 0.0, []
            for tick in range(1, 3 * QUIET_PING_EVERY):
                idle = q.idle(k.pid, pong, float(tick))
                if not idle:
                    pong = float(tick)  # pinged; it answers at once (a ping's own I/O aside, as here)
                seq.append(idle)
            first = seq.index(True)
            firsts.append(seq.index(False, first) - first)  # ticks without a ping once known idle
            second = seq.index(True, first + firsts[-1])
            laters.append(seq.index(False, second) - second)
            assert second - (first + firsts[-1]) <= 2  # idle again right after that ping
        assert all(3 * FIRST_QUIET_PING // 4 <= r <= FIRST_QUIET_PING for r in firsts), firsts
        assert all(3 * QUIET_PING_EVERY // 4 <= r <= QUIET_PING_EVERY for r in laters), laters
        assert len(set(laters)) > 1, laters  # consecutive pids: their own phases
        os.kill(kids[0].pid, signal.SIGSTOP)
        assert wait_stopped(kids[0].pid)
        assert not q.idle(kids[0].pid, 1e9, 1e9)  # stopped: no longer as good as a pong
        q.close()
    finally:
        for k in kids:
            k.kill()
            k.wait(5)
            if k.stdout is not None:
                k.stdout.close()
