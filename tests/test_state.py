"""Per-rank state and the event stream (the API widgets and the sidebar render)."""

from __future__ import annotations

import os
import signal
import sys
import threading

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


def test_a_listener_of_some_kinds_gets_only_those():
    """The debugger listens for failures only: busy/idle changes (two per rank per call) are then not
    even built into events, unless another listener wants everything."""
    t = StateTracker()
    some: list = []
    unsub = t.subscribe(some.append, kinds=("failed", "stopped"))
    t.created("m", "mesh", {"gpus": 2}, [{"gpus": 0}, {"gpus": 1}])
    t.ready("m", 0, 100)
    t.ready("m", 1, 101)
    t.activity("m", [0, 1], 1)
    t.activity("m", [0, 1], -1)
    assert some == []
    t.failed("m", 1, Failure("mesh", {"gpus": 1}, "signal", "killed", signal=9))
    assert [(e.kind, e.rank) for e in some] == [("failed", 1)]
    every: list = []
    unsub_every = t.subscribe(every.append)
    t.activity("m", [0], 1)
    assert [(e.kind, e.ranks, e.state, e.previous) for e in every] == [("calls", (0,), ProcState.BUSY, ProcState.IDLE)]
    assert len(some) == 1
    unsub_every()
    unsub()
    t.activity("m", [0], -1)
    assert len(every) == 1 and len(some) == 1


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
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: pm.state().ranks[0].state == ProcState.FAILED, 10)
        # failed by its exit (the signal is known), not by a later heartbeat verdict
        assert pm.state().ranks[0].failure.signal == signal.SIGKILL
        assert pm.state().ranks[0].failure.kind == "signal"
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


# -- hosts ------------------------------------------------------------------------------------------
A, B = "tcp://10.213.0.3:41234", "tcp://10.213.0.4:41234"


def _two_hosts(t: StateTracker, job=None) -> None:
    coords = [{"hosts": h, "gpus": g} for h in range(2) for g in range(2)]
    t.created("m", "mesh", {"hosts": 2, "gpus": 2}, coords, [A, B], [0, 0, 1, 1], job)


def test_hosts_and_job_in_snapshots_and_a_host_lost():
    from jupyter_mesh import HostState

    t = StateTracker()
    events = []
    t.subscribe(events.append)
    job = {"kind": "slurm", "id": "12", "keep_alive": False}
    _two_hosts(t, lambda: job)  # Job.describe itself: read at each snapshot
    snap = t.snapshot("m")
    assert [(h.index, h.address, h.state, h.why) for h in snap.hosts] == [
        (0, "10.213.0.3", HostState.UP, ""),
        (1, "10.213.0.4", HostState.UP, ""),
    ]
    assert [r.host for r in snap.ranks] == [0, 0, 1, 1]
    assert snap.job == {"kind": "slurm", "id": "12", "keep_alive": False}
    job["keep_alive"] = True  # set on the job after the spawn: the next snapshot shows it
    assert t.snapshot("m").job["keep_alive"] is True

    t.host_lost(B, "unreachable", "host 10.213.0.4 unreachable for 3.1 s (no answer to heartbeats)")
    ev = events[-1]
    assert (ev.kind, ev.mesh_id, ev.host) == ("host", "m", 1) and "unreachable for 3.1 s" in ev.note
    hosts = t.snapshot("m").hosts
    assert hosts[0].state is HostState.UP and hosts[1].state is HostState.UNREACHABLE
    assert hosts[1].why.startswith("host 10.213.0.4 unreachable")
    n = len(events)
    t.host_lost(B, "lost", "its process exited")  # final: the first cause stays, nothing new is said
    t.host_lost("tcp://10.9.9.9:1", "lost", "not one of ours")
    assert len(events) == n and t.snapshot("m").hosts[1].state is HostState.UNREACHABLE

    # a grown mesh keeps its lost host lost and adds the new one up
    coords = [{"hosts": h, "gpus": g} for h in range(3) for g in range(2)]
    C = "tcp://10.213.0.5:41234"
    t.resized("m", {"hosts": 3, "gpus": 2}, coords, [A, B, C], [0, 0, 1, 1, 2, 2])
    assert [str(h.state) for h in t.snapshot("m").hosts] == ["up", "unreachable", "up"]
    assert [r.host for r in t.snapshot("m").ranks] == [0, 0, 1, 1, 2, 2]
    t.stopped("m")
    t.host_lost(A, "exiting", "it got SIGTERM")  # a stopped mesh is history: it does not change
    assert t.snapshot("m").hosts[0].state is HostState.UP


def test_a_mesh_without_hosts_and_host_addresses():
    from jupyter_mesh._core.state import host_address

    t = StateTracker()
    t.created("m", "mesh", {"gpus": 2}, [{"gpus": 0}, {"gpus": 1}])  # fed by hand: no hosts known
    snap = t.snapshot("m")
    assert snap.hosts == () and snap.job is None and [r.host for r in snap.ranks] == [0, 0]
    t.resized("m", {"gpus": 3}, [{"gpus": i} for i in range(3)])
    assert [r.host for r in t.snapshot("m").ranks] == [0, 0, 0]
    assert host_address("tcp://10.0.0.2:6000") == "10.0.0.2"
    assert host_address("tcp://[fd00::2]:6000") == "fd00::2"
    assert host_address("ipc:///tmp/jupyter-mesh-0/agent-1") == "local"


def test_jobs_describe_themselves():
    from jupyter_mesh import SlurmJob
    from jupyter_mesh._runtime.hosts import Job
    from jupyter_mesh.jobs.torchx import TorchXJob

    class KubernetesJob(Job):  # a plugin's job: its kind comes from its class
        keep_alive = True

        def agents(self, timeout):
            return []

        def stop(self):
            pass

    assert KubernetesJob().describe() == {"kind": "kubernetes", "id": None, "keep_alive": True}
    slurm = SlurmJob.__new__(SlurmJob)  # no sbatch here: only what describe() reads
    slurm.job_id = "12"
    assert slurm.describe() == {"kind": "slurm", "id": "12", "keep_alive": False}
    torchx = TorchXJob.__new__(TorchXJob)
    torchx.app_handle = "local_cwd://torchx/app-1"
    assert torchx.describe() == {"kind": "torchx", "id": "local_cwd://torchx/app-1", "keep_alive": False}


@pytest.mark.integration
def test_two_local_hosts_in_the_state_and_how_each_was_lost(host):
    """Two agents on this machine are two hosts ("local"); a third comes with a resize. One killed is
    lost (with its signal), one sent SIGTERM is exiting (it said so), the other stays up."""
    from _procs import descendants, wait_dead

    from jupyter_mesh import HostState, LocalJob

    before = descendants(os.getpid())
    job = LocalJob(hosts=2)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 1}, name="two")
        st = pm.state()
        assert [(h.index, h.address, str(h.state)) for h in st.hosts] == [(0, "local", "up"), (1, "local", "up")]
        assert [r.host for r in st.ranks] == [0, 1]
        assert st.job == {"kind": "local", "id": None, "keep_alive": False}
        pm.resize(hosts=3)
        assert [r.host for r in pm.state().ranks] == [0, 1, 2] and len(pm.state().hosts) == 3
        os.kill(job.pids()[1], signal.SIGKILL)
        os.kill(job.pids()[2], signal.SIGTERM)
        assert wait_for(lambda: all(h.state is not HostState.UP for h in pm.state().hosts[1:]), 10), pm.state()
        hosts = pm.state().hosts
        assert hosts[0].state is HostState.UP
        assert hosts[1].state is HostState.LOST and "killed by SIGKILL" in hosts[1].why, hosts[1]
        assert hosts[2].state is HostState.EXITING and "got SIGTERM" in hosts[2].why, hosts[2]
        assert wait_for(lambda: [str(r.state) for r in pm.state().ranks] == ["idle", "failed", "failed"], 5)
        pm.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(descendants(os.getpid()) - before, 10), "the job's agents or procs outlived it"


def test_a_snapshot_taken_while_actors_start_and_end_their_init():
    """The receive thread adds and removes slow constructors while a view snapshots the mesh: a
    snapshot never sees the notes' dict change under it (it raised ``dictionary changed size``)."""
    t = StateTracker()
    t.created("m", "m", {"gpus": 2}, [{"gpus": 0}, {"gpus": 1}])
    stop, errors = threading.Event(), []

    def churn() -> None:
        i = 0
        while not stop.is_set():
            t.initializing("m", [0, 1], f"a{i % 50}", "slow")
            if i % 3 == 0:
                t.initializing("m", [0, 1], f"a{(i * 7) % 50}", done=True)
            i += 1

    def read() -> None:
        while not stop.is_set():
            try:
                t.snapshot("m")
            except RuntimeError as e:
                errors.append(e)
                return

    threads = [threading.Thread(target=churn), threading.Thread(target=read)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (switch threads often: the race shows within a second)
    try:
        for th in threads:
            th.start()
        stop.wait(1.5)
    finally:
        stop.set()
        for th in threads:
            th.join(10)
        sys.setswitchinterval(old)
    assert not errors, errors
