"""Elasticity: kill a rank, respawn it in place with its actors re-created; logs are kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

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
    procs.kill({"gpus": 2})
    assert not wait_dead([old[2]], 3)
    assert wait_for(lambda: procs.state().ranks[2].state == ProcState.FAILED, 3)
    with pytest.raises(SupervisionError, match="killed on request"):
        counters.incr.call().get(timeout=5)
    assert procs.respawn() == [2]
    assert procs.pids()[2] != old[2] and procs.state().ranks[2].state == ProcState.IDLE
    # the respawned rank has fresh actors built from the original spawn arguments
    assert list(counters.incr.call().get(timeout=10).values()) == [12, 12, 11, 12]
    assert counters.whoami.call().get(timeout=10).item(gpus=2) == {"gpus": 2}
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
    assert one == ["[" + procs.name + " gpus=3] line for the log"]


def test_grow_and_shrink_per_host_dim(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        c = pm.spawn("c", Counter, 7)
        part = c.slice(gpus=0)
        assert list(c.incr.call().get(timeout=10).values()) == [8, 8]
        pm.resize(gpus=4)
        assert pm.sizes == {"gpus": 4} and len(pm.pids()) == 4
        # the whole-mesh actor mesh followed: new ranks got actors built with the spawn arguments
        assert list(c.incr.call().get(timeout=10).values()) == [9, 9, 8, 8]
        assert c.whoami.call().get(timeout=10).item(gpus=3) == {"gpus": 3}
        assert part.incr.call_one().get(timeout=10) == 10  # views stay as they were
        assert [r.state for r in pm.state().ranks] == [ProcState.IDLE] * 4
        removed = [pm.pids()[2], pm.pids()[3]]
        last = c.slice(gpus=3)
        pm.resize(gpus=1)
        assert not wait_dead(removed, 5)
        assert list(c.incr.call().get(timeout=10).values()) == [11]
        with pytest.raises(MeshValueError, match="removed when the mesh shrank"):
            last.incr.call_one()  # a view of a removed rank
        pm.resize(gpus=3)  # growing again starts fresh procs at the old ranks
        assert list(c.incr.call().get(timeout=10).values()) == [12, 8, 8]
    finally:
        pm.stop()


def test_grow_hosts_adds_agents():
    from jupyter_mesh import LocalJob

    job = LocalJob(hosts=1)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        c = pm.spawn("c", Counter, 0)
        pm.resize(hosts=2)
        assert len(job.pids()) == 2 and len(set(pm._ref.agent_addrs)) == 2
        vm = c.whoami.call().get(timeout=10)
        assert [dict(v) for v in vm.values()] == [{"hosts": h, "gpus": g} for h in range(2) for g in range(2)]
        with pytest.raises(MeshValueError, match="renumbered"):
            pm.resize(gpus=3)
        pm.stop()
    finally:
        job.stop()


def test_actors_calling_a_rank_hear_of_its_death_and_respawn(host):
    from actors import Caller

    target = host.spawn_procs(per_host={"gpus": 1})
    callers = host.spawn_procs(per_host={"gpus": 1})
    try:
        faulty = target.spawn("faulty", Faulty)
        caller = callers.spawn("caller", Caller).slice(gpus=0)
        pending = caller.sleep_on.call_one(faulty, 30)  # the caller waits on a direct call to rank 0
        time.sleep(0.5)
        target.kill(0, signal.SIGKILL)
        outcome = pending.get(timeout=10)
        assert outcome.startswith("SupervisionError"), outcome  # told, not left to time out
        target.respawn()
        assert caller.ok_on.call_one(faulty).get(timeout=10) == "fine"  # reaches the new proc
    finally:
        target.stop()
        callers.stop()


_RESPAWN_HANDLES = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[1])
    from actors import Faulty
    from jupyter_mesh import SupervisionError, this_host

    procs = this_host().spawn_procs(per_host={"gpus": 3})
    f = procs.spawn("f", Faulty)

    def lose(*ranks):  # SIGKILL from outside: nothing waits on them, so fail fast holds the failures
        for r in ranks:
            os.kill(procs.pids()[r], signal.SIGKILL)
        try:
            time.sleep(30)  # fail fast stops the program here, with a KeyboardInterrupt...
            print("NOT INTERRUPTED", flush=True)
        except KeyboardInterrupt:
            pass  # ...that this one catches: it handles the failures
        deadline = time.monotonic() + 20
        while any(procs.state().ranks[r].state != "failed" for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.02)

    lose(1, 2)
    procs.respawn([1])                    # rank 1's failure is handled; rank 2's is not
    try:
        f.slice(gpus=0).ok.call_one().get(timeout=10)
        print("NOT RAISED", flush=True)
    except SupervisionError as e:
        print("RAISED", sorted(x.rank for x in e.failures), flush=True)
    lose(1)
    procs.respawn()                       # every failed rank: nothing is left to raise
    print("AFTER", list(f.ok.call().get(timeout=10).values()), flush=True)
    """
)


def _run_script(script, text: str) -> subprocess.CompletedProcess:
    """Run ``text`` as a script of its own (the tests' folder is its first argument), to its end."""
    script.write_text(text)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run([sys.executable, str(script), tests_dir], capture_output=True, text=True, timeout=120)


def test_respawn_handles_the_failures_of_its_ranks_for_fail_fast(tmp_path):
    """In a script, a rank lost and then respawned is handled: the next call does not raise its old
    failure (another rank's, not respawned, still is), and the program exits 0."""
    out = _run_script(tmp_path / "respawn.py", _RESPAWN_HANDLES)
    assert "RAISED [2]" in out.stdout, out.stdout + out.stderr
    assert "AFTER ['fine', 'fine', 'fine']" in out.stdout, out.stdout + out.stderr
    assert out.returncode == 0, out.stderr


_HOOK_AT_EXIT = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[1])
    from actors import Faulty
    from jupyter_mesh import this_host
    from jupyter_mesh.lowlevel import set_fault_hook

    def hook(err):
        print("HOOK BEGAN", flush=True)
        respawned = procs.respawn()
        print("HOOK DONE", respawned, f.ok.call_one().get(timeout=30), flush=True)

    set_fault_hook(hook)
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    f = procs.spawn("f", Faulty)
    os.kill(procs.pids()[0], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while procs.state().ranks[0].state != "failed" and time.monotonic() < deadline:
        time.sleep(0.005)
    print("MAIN ENDS", flush=True)  # the program ends as soon as it sees the failure
    """
)


def test_a_fault_hook_handed_a_failure_finishes_when_the_program_ends_right_after(tmp_path):
    """A script that ends just after a failure: its fault hook, handed the failure, still runs to its
    end, with the mesh up (it respawns and calls). Run inline on the receive thread, it always had;
    on its own (daemon) thread it was cut off at exit, or never began."""
    out = _run_script(tmp_path / "hook_at_exit.py", _HOOK_AT_EXIT)
    assert "MAIN ENDS" in out.stdout, out.stdout + out.stderr
    assert "HOOK DONE [0] fine" in out.stdout, out.stdout + out.stderr
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("which", ["ours", "monarch"])
def test_a_fault_hook_may_respawn_and_call(host, which):
    """The natural answer to a failure is to respawn and go on, from the hook itself: a hook runs on a
    thread of its own (``hooks.fault_hook``), so its waits are answered. On the receive thread, where it
    ran before, respawn() hung (and the mesh's stop after it), then raised MeshDeadlockError."""
    import threading

    import jupyter_mesh
    from jupyter_mesh.lowlevel import set_fault_hook

    pm = host.spawn_procs(per_host={"gpus": 2})
    report: dict = {}
    ran = threading.Event()

    def hook(err) -> None:
        try:
            report["thread"] = threading.current_thread().name
            report["respawned"] = pm.respawn()
            report["pids"] = sorted(f.pid.call().get(timeout=30).values())
        except Exception as e:  # noqa: BLE001 - the report says what it was
            report["error"] = repr(e)
        finally:
            ran.set()

    prev = set_fault_hook(hook) if which == "ours" else None
    if which == "monarch":
        jupyter_mesh.unhandled_fault_hook = hook
    try:
        f = pm.spawn("f", Faulty)
        kept, killed = f.pid.call().get(timeout=10).values()
        os.kill(killed, signal.SIGKILL)  # nothing waits on it: the hook hears
        assert ran.wait(60), report
        assert report.get("thread") == "jupyter-mesh-faults" and "error" not in report, report
        assert report["respawned"] == [1] and kept in report["pids"] and killed not in report["pids"], report
        assert [r.state for r in pm.state().ranks] == [ProcState.IDLE] * 2
    finally:
        if which == "ours":
            set_fault_hook(prev)
        else:
            jupyter_mesh.unhandled_fault_hook = None
        pm.stop(timeout=5)
