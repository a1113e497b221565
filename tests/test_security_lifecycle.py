"""Lifelines (no orphans); proc death; multi-host; __main__ actors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from _procs import descendants, wait_dead
from actors import Counter, Faulty, Lingering, Sleeper

from jupyter_mesh import LocalJob, SupervisionError

pytestmark = pytest.mark.integration

# forged and fuzzed messages against every socket: tests/test_fuzz.py; who can reach the sockets at
# all (unix sockets in a private directory, another user refused): tests/test_private_channels.py


_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from jupyter_mesh import Actor, endpoint, this_host

    class Interactive(Actor):          # defined in __main__: travels by value
        def __init__(self, base):
            self.base = base
        @endpoint
        def add(self, x):
            return self.base + x

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    m = procs.spawn("i", Interactive, 40)
    print("RESULT", list(m.add.call(2).get(timeout=20).values()), flush=True)
    if sys.argv[1] == "hang":
        print("READY", flush=True)
        time.sleep(600)
    procs.stop()
    """
)


def test_interactively_defined_class_works_in_a_script(tmp_path):
    script = tmp_path / "main_script.py"
    script.write_text(_SCRIPT)
    out = subprocess.run([sys.executable, str(script), "exit"], capture_output=True, text=True, timeout=60)
    assert "RESULT [42, 42]" in out.stdout, out.stderr


def test_kill_9_controller_leaves_no_process(tmp_path):
    script = tmp_path / "main_script.py"
    script.write_text(_SCRIPT)
    p = subprocess.Popen([sys.executable, str(script), "hang"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if "READY" in line or not line:
                break
        kids = descendants(p.pid)
        assert len(kids) >= 4, kids  # agent, template, 2 procs
        p.send_signal(signal.SIGKILL)
        p.wait(5)
        t0 = time.monotonic()
        left = wait_dead(kids, 2.0)
        assert not left, f"orphans {sorted(left)} after {time.monotonic() - t0:.2f}s"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
        p.stdout.close()


def test_killed_proc_fails_pending_call_and_later_calls(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        f = pm.spawn("f", Faulty)
        pid1 = f.slice(gpus=1).pid.call_one().get(timeout=10)
        fut = f.slice(gpus=1).sleep.call_one(30)
        gathered = f.sleep.call(30)
        time.sleep(0.2)
        os.kill(pid1, signal.SIGKILL)
        # failed by the exit itself (kind signal), not by a heartbeat verdict or a timeout
        with pytest.raises(SupervisionError, match="SIGKILL") as ei:
            fut.get(timeout=10)
        assert ei.value.failures[0].coords == {"gpus": 1}
        assert ei.value.failures[0].signal == signal.SIGKILL
        assert ei.value.failures[0].kind == "signal"
        with pytest.raises(SupervisionError):
            gathered.get(timeout=2)  # fails fast: rank 0 is still sleeping
        with pytest.raises(SupervisionError, match="gpus=1"):
            f.ok.call().get(timeout=5)
        g = pm.slice(gpus=0).spawn("g", Faulty)  # slices without the dead rank still work
        assert list(g.ok.call().get(timeout=5).values()) == ["fine"]
    finally:
        pm.stop(timeout=2)


@pytest.mark.parametrize("how", ["os.kill", "ProcMesh.kill"])
@pytest.mark.parametrize("endpoint", ["sync", "second_actor", "async"])
def test_a_call_cut_by_sigterm_fails_with_the_procs_death_not_a_keyboardinterrupt(host, tmp_path, how, endpoint):
    """SIGTERM stops a proc gracefully: its running call is interrupted and it dies of the signal.
    The call must fail with that death (kind signal, SIGTERM), not with the interrupt's
    KeyboardInterrupt and "the actors are still alive" (it raced the agent's report and won: a
    listener or scancel ending an agent mid-call told the user of an interrupt on a live actor)."""
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        if endpoint == "second_actor":  # not the proc's first actor: it runs on a thread of its own
            pm.spawn("first", Faulty).ok.call().get(timeout=10)
        s = pm.spawn("s", Sleeper)
        pid1 = pm.spawn("p", Faulty).slice(gpus=1).pid.call_one().get(timeout=10)
        started = str(tmp_path / "started")
        if endpoint == "async":
            fut = s.slice(gpus=1).nap.call_one(30, started)
        else:
            fut = s.slice(gpus=1).busy_loop.call_one(30, started)
        deadline = time.monotonic() + 10
        while not os.path.exists(f"{started}1") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(f"{started}1"), "the call never started"
        if how == "os.kill":
            os.kill(pid1, signal.SIGTERM)
        else:
            pm.kill(1)
        with pytest.raises(SupervisionError, match="SIGTERM") as ei:
            fut.get(timeout=10)
        assert ei.value.failures[0].kind == "signal" and ei.value.failures[0].signal == signal.SIGTERM
        assert "KeyboardInterrupt" not in str(ei.value)
        assert list(s.slice(gpus=0).counts.call().get(timeout=5).values()) == [(0, 0)]  # rank 0 untouched
    finally:
        pm.stop(timeout=2)


@pytest.mark.parametrize("endpoint", ["nap", "cnap"])
def test_a_call_cut_by_sigterm_on_a_proc_slow_to_die_fails_after_the_grace_not_its_timeout(host, tmp_path, endpoint):
    """The cut call waits for the proc's death: a proc whose exit handlers take long (here 20 s)
    answers it itself once CUT_GRACE passed, with SIGTERM as the cause, rather than leaving its caller
    to a timeout. A concurrent endpoint (its own task, no cancel bookkeeping) likewise: not the
    interrupt's CancelledError."""
    from jupyter_mesh._runtime.proc import CUT_GRACE

    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        a = pm.spawn("lingering", Lingering, 20.0)
        pid = a.pid.call_one().get(timeout=10)
        started = str(tmp_path / "started")
        fut = getattr(a, endpoint).call_one(30, started)
        deadline = time.monotonic() + 10
        while not os.path.exists(f"{started}0") and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(pid, signal.SIGTERM)
        with pytest.raises(SupervisionError, match="got SIGTERM") as ei:
            fut.get(timeout=CUT_GRACE + 8)  # (its exit takes 20 s)
        assert ei.value.failures[0].signal == signal.SIGTERM
        assert "CancelledError" not in str(ei.value) and "KeyboardInterrupt" not in str(ei.value)
    finally:
        pm.stop(timeout=2)


def test_procmesh_kill_ends_a_proc_slow_to_die_so_its_queued_calls_and_casts_fail_too(host, tmp_path):
    """``ProcMesh.kill`` (SIGTERM) of a proc whose exit handlers take 20 s: the running call is
    answered after the grace, and the calls queued behind it and a cast over both ranks (gathered by
    the agent: it waits for the death) fail once the agent's SIGKILL follows, 5 s on, not at 20 s."""
    from jupyter_mesh._runtime.agent import KILL_GRACE

    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        a = pm.spawn("lingering", Lingering, 20.0)
        a.pid.call().get(timeout=10)
        started = str(tmp_path / "started")
        one = a.slice(gpus=1)
        running = one.nap.call_one(30, started)
        queued = [one.pid.call_one() for _ in range(3)]
        cast = a.nap.call(1)
        deadline = time.monotonic() + 10
        while not os.path.exists(f"{started}1") and time.monotonic() < deadline:
            time.sleep(0.02)
        pm.kill(1)
        for fut in [running, *queued, cast]:
            with pytest.raises(SupervisionError, match=r"SIGTERM|SIGKILL"):
                fut.get(timeout=KILL_GRACE + 10)  # (its exit takes 20 s)
    finally:
        pm.stop(timeout=2)


def test_kill_9_agent_takes_its_procs_down():
    job = LocalJob(hosts=1)
    hm = job.host_mesh()
    pm = hm.spawn_procs(per_host={"gpus": 2})
    pids = set(pm.pids().values())
    agent_pid = job.pids()[0]
    kids = descendants(agent_pid)
    os.kill(agent_pid, signal.SIGKILL)
    assert not wait_dead(pids | kids, 3.0)
    job.stop()


def test_two_local_hosts_fan_out_and_gather():
    job = LocalJob(hosts=2)
    try:
        hm = job.host_mesh()
        assert hm.sizes == {"hosts": 2}
        pm = hm.spawn_procs(per_host={"gpus": 2})
        c = pm.spawn("c", Counter, 0)
        vm = c.whoami.call().get(timeout=10)
        assert [dict(v) for v in vm.values()] == [{"hosts": h, "gpus": g} for h in range(2) for g in range(2)]
        assert pm.slice(hosts=1).spawn("d", Counter, 5).incr.call().get(timeout=10).sizes == {"gpus": 2}
        assert len(set(pm._ref.agent_addrs)) == 2
        pm.stop()
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 3.0)


_FAIL_FAST = textwrap.dedent(
    """
    import atexit, os, signal, sys, time
    atexit.register(lambda: print("EARLY ATEXIT RAN", flush=True))  # before jupyter_mesh is imported
    sys.path.insert(0, sys.argv[2])
    from _procs import descendants
    from actors import Faulty
    from jupyter_mesh import SupervisionError, this_host

    atexit.register(lambda: print("ATEXIT RAN", flush=True))  # before the controller's: runs after it
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    f = procs.spawn("f", Faulty)
    pid = f.slice(gpus=1).pid.call_one().get(timeout=20)
    print("DESCENDANTS", sorted(descendants(os.getpid())), flush=True)
    if sys.argv[1] == "observe":
        try:
            os.kill(pid, signal.SIGKILL)  # nothing is waiting on rank 1: an unhandled failure
            time.sleep(60)                # stopped here at once, as Monarch's default hook does
            print("NOT INTERRUPTED", flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        try:
            f.slice(gpus=0).ok.call_one().get(timeout=5)   # any next API call raises it, once
        except SupervisionError as e:
            print("RAISED", e.failures[0].coords, flush=True)
        print("AFTER", f.slice(gpus=0).ok.call_one().get(timeout=5), flush=True)
    else:
        os.kill(pid, signal.SIGKILL)
        time.sleep(60)
        print("NOT INTERRUPTED", flush=True)  # never: the program stops in the sleep, exit code 1
    """
)


@pytest.mark.parametrize("mode", ["observe", "ignore"])
def test_fail_fast_is_the_default_in_scripts(tmp_path, mode):
    """An unhandled failure stops a script at once where it is (a KeyboardInterrupt in its main thread,
    as Monarch's default hook), its atexit handlers run, it exits 1 and leaves no process behind; a
    script that catches the interrupt gets the failure raised at its next API call and may go on."""
    script = tmp_path / "fail_fast.py"
    script.write_text(_FAIL_FAST)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, str(script), mode, tests_dir], capture_output=True, text=True, timeout=120)
    assert "NOT INTERRUPTED" not in out.stdout, out.stderr
    assert "\nATEXIT RAN" in out.stdout and "EARLY ATEXIT RAN" in out.stdout, out.stdout + out.stderr
    spawned = [int(p) for p in re.findall(r"\d+", out.stdout.split("DESCENDANTS", 1)[1].splitlines()[0])]
    assert len(spawned) >= 3 and not wait_dead(spawned, 10.0), spawned  # the agent, its fork server, the procs
    if mode == "observe":
        assert "INTERRUPTED" in out.stdout, out.stderr
        assert "RAISED {'gpus': 1}" in out.stdout, out.stderr
        assert "AFTER fine" in out.stdout
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode == 1, out.stderr
        assert "unhandled failure" in out.stderr and "SIGKILL" in out.stderr
        assert "KeyboardInterrupt" in out.stderr and "time.sleep(60)" in out.stderr


def test_fail_fast_never_interrupts_a_kernel():
    """In a plain ipykernel (no ``%load_ext``: no hook of ours) an unhandled failure is shown, and the
    cell and the kernel run on: fail fast stops scripts, never a notebook's kernel."""
    from _kernel import Kernel, isolate_jupyter_dirs

    isolate_jupyter_dirs()
    k = Kernel("python3")
    try:
        tests_dir = os.path.dirname(os.path.abspath(__file__))
        cell = k.ok(
            textwrap.dedent(
                f"""
                import os, signal, sys, time
                sys.path.insert(0, {tests_dir!r})
                from actors import Faulty
                from jupyter_mesh import this_host
                procs = this_host().spawn_procs(per_host={{"gpus": 2}})
                f = procs.spawn("f", Faulty)
                os.kill(f.slice(gpus=1).pid.call_one().get(timeout=20), signal.SIGKILL)
                deadline = time.monotonic() + 20
                while procs.state().ranks[1].state != "failed" and time.monotonic() < deadline:
                    time.sleep(0.02)
                time.sleep(1)
                print("SLEPT", procs.state().ranks[1].state)
                """
            )
        )
        assert "SLEPT failed" in cell.stream(), cell.stream()
        assert "unhandled failure" in cell.stream() and "stopping the program" not in cell.stream()
        assert "2" in k.ok("print(1 + 1)").stream()
        k.ok("procs.stop()")
    finally:
        assert not k.shutdown(), "processes left after the kernel shut down"
