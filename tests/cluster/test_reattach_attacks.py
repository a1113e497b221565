"""A SLURM job kept alive past its kernel, attacked (issue 13): controllers that stall and wake up,
that race, that lost the job, nodes cut off while nobody drives the job, records that lie.

Each test is a reproduction of a finding of the attack review of ``keep_alive``/``reattach``. Every
controller is its own process (``reattach_driver.py``, steered through stdin), as a kernel would be.
The heartbeat timeout is 2 s here, so an agent takes a silent controller for gone after 6 s.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from test_multihost import _no_mesh_processes_in

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "reattach_driver.py")
PY = sys.executable
HB = 2.0
SILENCE = 3 * HB  # what an agent waits before it takes its controller for gone


def _env(slurm) -> dict[str, str]:
    return {
        **os.environ,
        **slurm.env,
        "PYTHONUNBUFFERED": "1",
        "JUPYTER_MESH_HEARTBEAT_TIMEOUT": str(HB),
    }


class Driver:
    """A controller process (reattach_driver.py) steered one command at a time; every read bounded."""

    def __init__(self, env: dict[str, str]):
        self.p = subprocess.Popen(
            [PY, DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.err: list[str] = []
        self._pump = threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True)
        self._pump.start()

    def send(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def read(self, timeout: float = 180.0) -> dict:
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert ready, f"the driver did not answer within {timeout:.0f} s; its stderr:\n{''.join(self.err)[-3000:]}"
        line = self.p.stdout.readline()
        assert line, f"the driver exited (rc={self.p.poll()}); its stderr:\n{''.join(self.err)[-3000:]}"
        return json.loads(line)

    def __call__(self, line: str, timeout: float = 180.0) -> dict:
        self.send(line)
        return self.read(timeout)

    def ok(self, line: str, timeout: float = 180.0) -> dict:
        r = self(line, timeout)
        assert "error" not in r, f"{line}: {r}\n{''.join(self.err)[-3000:]}"
        return r

    def signal(self, sig: int) -> None:
        os.kill(self.p.pid, sig)

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.p.send_signal(signal.SIGCONT)
                self.send("exit")
                self.p.wait(30)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.p.kill()
                self.p.wait(10)
        self._pump.join(5)
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            try:
                f.close()
            except (BrokenPipeError, OSError):
                pass


def _kept(slurm, nodes: int = 2) -> tuple[Driver, dict]:
    a = Driver(_env(slurm))
    try:
        kept = a.ok(f"keep {nodes}", timeout=240)
        assert kept["counts"] == [11] * (2 * nodes), kept
    except BaseException:
        a.close()
        raise
    return a, kept


def _kept_and_left(slurm, nodes: int = 2) -> dict:
    """A kept job whose controller exited normally (detached, as at a kernel restart)."""
    a, kept = _kept(slurm, nodes)
    a.ok("exit")
    a.p.wait(30)  # its shutdown detached the job
    a.close()
    return kept


def _stop_everything(slurm, hosts) -> None:
    """What a test left: cancelled, and nothing of ours left on the hosts."""
    for job in slurm.job_ids():
        slurm.run(["scancel", job], check=False)


def _files(config_dir) -> list[str]:
    return sorted(n for n in os.listdir(config_dir / "jobs") if not n.endswith(".log"))


# -- a controller stopped (SIGSTOP) while another took its job, then woken (SIGCONT) ---------------------
def test_an_old_controller_woken_after_a_takeover_neither_drives_nor_cancels_the_job(netns_hosts, slurm, config_dir):
    """A is stopped past the agents' silence limit: they detach, and B takes the job without force
    (right). A is woken: it must hear that it lost the job — its calls fail naming the new
    controller, its ``stop()`` neither cancels the SLURM job nor deletes the new owner's key."""
    a, kept = _kept(slurm)
    b = None
    try:
        a.signal(signal.SIGSTOP)
        time.sleep(SILENCE + 2)
        b = Driver(_env(slurm))
        r = b.ok("reattach")
        assert r["procs"] == ["train"] and r["notes"] == [], r
        assert b.ok("incr")["counts"] == [12] * 4
        a.signal(signal.SIGCONT)
        time.sleep(2 * HB)  # A's heartbeats reach the agents again, and are answered
        after = a("incr", timeout=60)
        assert "error" in after and "took it over" in after["error"], after
        one = a("incr_one 1", timeout=60)  # straight to the actor, not through its agent
        assert "error" in one, one
        assert a("stop_job")["step"] == "stop_job"
        time.sleep(1)
        assert slurm.job_state(kept["job_id"])[0] == "RUNNING", "the controller that lost the job cancelled it"
        assert b.ok("incr")["counts"] == [13] * 4  # B drives it still, and A's calls never ran
        assert _files(config_dir) != []  # B's key and record
        b.ok("stop_job")
    finally:
        a.close()
        if b is not None:
            b.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []
    assert _files(config_dir) == []


def test_a_controller_stalled_past_the_silence_limit_gets_its_job_back_when_it_wakes(netns_hosts, slurm, config_dir):
    """A controller that stalls (SIGSTOP here; a long C call that holds the GIL, swapping) longer than
    the agents' silence limit, and wakes with nobody having taken its job: the agents took it for
    gone and detached. When its heartbeats come back they must report to it again: a proc that dies
    is reported, worker output reaches it. (Before: detached for good, silently — no failure, no
    output ever again, while calls still worked.)"""
    a, kept = _kept(slurm)
    try:
        a.signal(signal.SIGSTOP)
        time.sleep(SILENCE + 2)
        a.signal(signal.SIGCONT)
        time.sleep(2 * HB)
        assert a.ok("incr")["counts"] == [12] * 4
        assert a.ok("shout 5")["lines"] == 20
        os.kill(kept["pids"][2], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (st := a.ok("state"))["failed"]:
            time.sleep(0.5)
        assert st["failed"] == [2], st
        a.ok("stop_job")
    finally:
        a.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


# -- a reattach that gives up: its late answers must not end the job ------------------------------------
def test_a_reattach_that_times_out_leaves_the_job_whole_for_the_next_try(netns_hosts, slurm, config_dir):
    """``reattach(timeout=0.001)``: the agents accept, but their hellos come after the controller gave
    up. A hello nobody waits for is answered with SHUTDOWN — which ended a kept agent and every proc
    of its host. It must be told to wait for the next controller instead; the next try takes the
    job back whole (same pids, counters on)."""
    kept = _kept_and_left(slurm)
    b = Driver(_env(slurm))
    try:
        r = b("reattach 0.001")
        assert "error" in r and "did not answer" in r["error"], r
        time.sleep(2)  # the late hellos arrive
        r = b.ok("reattach")
        assert r["notes"] == [], r
        assert b.ok("pids")["pids"] == kept["pids"]
        assert b.ok("incr")["counts"] == [12] * 4
        b.ok("stop_job")
    finally:
        b.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


def test_a_node_cut_off_while_detached_times_out_by_name_and_a_try_after_healing_works(netns_hosts, slurm, config_dir):
    kept = _kept_and_left(slurm)
    host1 = netns_hosts.by_ip(kept["agents"][1][0].split("//")[1].rsplit(":", 1)[0])
    b = Driver(_env(slurm))
    try:
        netns_hosts.cut(host1)
        r = b("reattach 5")
        assert "error" in r and host1.ip in r["error"] and "scancel" in r["error"], r
        netns_hosts.heal(host1)
        time.sleep(3)  # what was queued for the cut host goes out now
        r = b.ok("reattach")
        assert r["notes"] == [], r
        assert b.ok("pids")["pids"] == kept["pids"]
        assert b.ok("incr")["counts"] == [12] * 4
        b.ok("stop_job")
    finally:
        if netns_hosts.is_cut(host1):
            netns_hosts.heal(host1)
        b.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


def test_two_kernels_reattaching_at_once_never_end_the_job(netns_hosts, slurm, config_dir):
    """Both ask every agent at the same moment; the agents may answer them in different orders, so
    both may be refused by one agent — the job must be left whole (detached) for a next try, never
    shut down by a late answer, never split between the two."""
    kept = _kept_and_left(slurm)
    drivers = [Driver(_env(slurm)) for _ in range(2)]
    try:
        for _ in range(3):
            for d in drivers:
                d.send("reattach 10")
            got = [d.read() for d in drivers]
            won = [i for i, r in enumerate(got) if "error" not in r]
            assert len(won) <= 1, got
            for r in got:
                if "error" in r:
                    assert "still driven by a live controller" in r["error"], got
            if won:
                d = drivers[won[0]]
                assert d.ok("incr")["counts"][0] >= 12
                d.ok("exit")
                d.p.wait(30)
                d.close()
                drivers[won[0]] = Driver(_env(slurm))
            else:
                time.sleep(SILENCE + 1)
        c = Driver(_env(slurm))
        try:
            r = c.ok("reattach")
            assert r["notes"] == [], r
            assert c.ok("pids")["pids"] == kept["pids"]
            c.ok("stop_job")
        finally:
            c.close()
    finally:
        for d in drivers:
            d.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


# -- the kernel that lost the job to a forced takeover ---------------------------------------------------
def test_the_kernel_that_lost_the_job_cannot_cancel_it_nor_rewrite_its_record(netns_hosts, slurm, config_dir):
    """B forces the takeover; A (alive) hears it lost the job. A's ``procs.stop()`` and
    ``job.stop()`` must then leave the job, its key and its record alone: before, ``stop()`` ran
    ``scancel`` on B's job and deleted its key, and a stop rewrote the record with A's view."""
    a, kept = _kept(slurm)
    b = c = None
    try:
        b = Driver(_env(slurm))
        assert b.ok("reattach force")["procs"] == ["train"]
        time.sleep(1)
        r = a("incr", timeout=60)
        assert "took it over" in r.get("error", ""), r
        a("stop_procs")
        a("stop_job")
        a.ok("exit")  # and its shutdown
        a.p.wait(30)
        assert slurm.job_state(kept["job_id"])[0] == "RUNNING", "the kernel that lost the job cancelled it"
        assert len(_files(config_dir)) == 2, _files(config_dir)
        assert b.ok("incr")["counts"] == [12] * 4  # A's calls never ran
        b.ok("exit")
        b.p.wait(30)
        c = Driver(_env(slurm))
        r = c.ok("reattach")
        assert r["procs"] == ["train"] and r["actors"] == ["counter"], r
        assert c.ok("incr")["counts"] == [13] * 4
        c.ok("stop_job")
    finally:
        for d in (a, b, c):
            if d is not None:
                d.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


# -- what is left while nobody drives the job ------------------------------------------------------------
def test_an_agent_killed_while_detached_is_named_with_what_to_do(netns_hosts, slurm, config_dir):
    kept = _kept_and_left(slurm)
    addr, pid = kept["agents"][1]
    os.kill(pid, signal.SIGKILL)
    b = Driver(_env(slurm))
    try:
        r = b("reattach 5")
        assert "error" in r, r
        assert addr in r["error"] and f"scancel {kept['job_id']}" in r["error"], r
        assert len(_files(config_dir)) == 2  # the job runs still: its key and record stay
    finally:
        b.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.wait_job_state(kept["job_id"], [""], timeout=30)
    assert _no_mesh_processes_in(list(netns_hosts)) == []


def test_a_job_cancelled_while_detached_is_refused_clearly_and_its_files_go(netns_hosts, slurm, config_dir):
    kept = _kept_and_left(slurm)
    slurm.run(["scancel", kept["job_id"]])
    slurm.wait_job_state(kept["job_id"], ["", "CANCELLED", "COMPLETING"], timeout=30)
    b = Driver(_env(slurm))
    try:
        r = b("reattach 5")
        assert r.get("error", "").startswith(f"MeshError: SLURM job {kept['job_id']} ("), r
        assert "ended while no kernel was attached" in r["error"] and "start a new job" in r["error"], r
        assert _files(config_dir) == []
        r = b("reattach 5")
        assert "no record of any SLURM job kept alive" in r.get("error", ""), r
    finally:
        b.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.wait_job_state(kept["job_id"], [""], timeout=30) == ("", "")
    assert _no_mesh_processes_in(list(netns_hosts)) == []


def test_a_mesh_resized_and_respawned_after_a_reattach_is_taken_back_as_it_is_now(netns_hosts, slurm, config_dir):
    kept = _kept_and_left(slurm, nodes=1)
    b = Driver(_env(slurm))
    c = None
    try:
        b.ok("reattach")
        r = b.ok("resize 3")
        assert r["sizes"] == {"hosts": 1, "gpus": 3}, r
        assert b.ok("incr")["counts"] == [12, 12, 11]  # the new rank's actor made from its spawn arguments
        os.kill(kept["pids"][0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not b.ok("state")["failed"]:
            time.sleep(0.5)
        b.ok("respawn")
        assert b.ok("incr")["counts"] == [11, 13, 12]
        b.ok("exit")
        b.p.wait(30)
        c = Driver(_env(slurm))
        r = c.ok("reattach")
        assert r["notes"] == [], r
        assert c.ok("incr")["counts"] == [12, 14, 13]
        c.ok("stop_job")
    finally:
        b.close()
        if c is not None:
            c.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_procs_that_print_a_lot_while_detached_cost_the_agents_nothing_and_nested_meshes_live_on(
    netns_hosts, slurm, config_dir
):
    """Output nobody is attached to read is dropped, not queued: the agents' memory stays flat while
    every proc prints ~100 MB; after the reattach output flows again. A proc mesh an actor made of
    its own (nested, not in the record) lives on with its actor, which still reaches it."""
    a, kept = _kept(slurm)
    nested = a.ok("nest")["pid"]
    a.ok("flood 1000000")
    a.ok("exit")
    a.p.wait(30)
    a.close()
    agents = [pid for _, pid in kept["agents"]]
    before = [_rss_kib(p) for p in agents]
    time.sleep(15)  # the procs print on, detached
    after = [_rss_kib(p) for p in agents]
    print("agents RSS KiB before, after", before, after)
    assert all(y - x < 30 * 1024 for x, y in zip(before, after)), (before, after)
    b = Driver(_env(slurm))
    try:
        b.ok("reattach")
        assert b.ok("nest")["pid"] == nested
        assert b.ok("shout 5")["lines"] == 20
        b.ok("stop_job")
    finally:
        b.close()
        _stop_everything(slurm, netns_hosts)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


# -- a record that lies ----------------------------------------------------------------------------------
class _Boom:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_corrupted_record_is_a_clear_error_runs_nothing_and_leaves_the_job(netns_hosts, slurm, config_dir, tmp_path):
    """The record (``jobs/TOKEN.json``) is the user's file, but it is read back as data, never
    trusted: garbage, wrong types, an option for a job id, addresses that are none, a million
    agents: each a MeshError that names the record, before any message leaves, nothing run, nothing
    deleted; the job is still there for a good record. A pickle in an actor's spawn arguments is
    not unpickled by a reattach (only a respawn re-creates actors, in the procs)."""
    import base64
    import pickle

    kept = _kept_and_left(slurm)
    jobs = config_dir / "jobs"
    [rec_path] = [jobs / n for n in os.listdir(jobs) if n.endswith(".json")]
    key_path = rec_path.with_suffix(".key")
    good, key = rec_path.read_bytes(), key_path.read_bytes()
    rec = json.loads(good)
    m0 = rec["meshes"][0]
    variants = {
        "not json": b"{garbage",
        "job id an option": {**rec, "job_id": "--help"},
        "job id a list": {**rec, "job_id": [1, 2]},
        "agents not addresses": {**rec, "agents": ["garbage", 3]},
        "a million agents": {**rec, "agents": [f"tcp://10.213.0.2:{i % 60000 + 1}" for i in range(10**6)]},
        "meshes not a list": {**rec, "meshes": "x"},
        "a mesh of wrong types": {**rec, "meshes": [{**m0, "id": 3, "name": None, "agents": "x"}]},
        "an actor of wrong types": {**rec, "meshes": [{**m0, "actors": [{"id": 1, "endpoints": 5}]}]},
    }
    b = Driver(_env(slurm))
    seen = {}
    try:
        for what, bad in variants.items():
            rec_path.write_bytes(bad if isinstance(bad, bytes) else json.dumps(bad).encode())
            os.chmod(rec_path, 0o600)
            r = b("reattach 5", timeout=120)
            seen[what] = r.get("error", "") or "reattached"
            key_path.write_bytes(key)  # whatever happened, the next variant starts from the job's key
            os.chmod(key_path, 0o600)
        marker = tmp_path / "unpickled"
        payload = base64.b64encode(pickle.dumps(((_Boom(str(marker)),), {}))).decode()
        rec_path.write_text(
            json.dumps({**rec, "meshes": [{**m0, "actors": [{**m0["actors"][0], "spawn": [payload, []]}]}]})
        )
        r = b.ok("reattach")
        assert r["actors"] == ["counter"], r
        assert not marker.exists(), "a reattach unpickled spawn arguments from the record"
        assert b.ok("pids")["pids"] == kept["pids"]
        assert b.ok("incr")["counts"] == [12] * 4
        b.ok("stop_job")
    finally:
        b.close()
        _stop_everything(slurm, netns_hosts)
    bad = {w: e for w, e in seen.items() if not e.startswith(("MeshError", "MeshValueError")) or rec_path.name not in e}
    assert not bad, json.dumps(seen, indent=1)
    assert _no_mesh_processes_in(list(netns_hosts)) == []


# -- %mesh reattach in a kernel ---------------------------------------------------------------------------
def test_mesh_reattach_beside_a_local_mesh_twice_and_after_a_python_kept_job(
    netns_hosts, slurm, tmp_path, monkeypatch, config_dir
):
    """A kept job from Python (no ``mesh_exec`` executor) with a rank that died: ``%mesh reattach``
    in a kernel that runs a local mesh is refused and the local mesh goes on; after ``%mesh down``
    it reattaches (the executor is spawned on the ranks that live, the dead one reported); a second
    ``%mesh reattach`` says the job is attached already; ``%mesh down`` ends it. No traceback."""
    sys.path.insert(0, os.path.dirname(HERE))
    from _kernel import Kernel, isolate_jupyter_dirs

    isolate_jupyter_dirs()
    for k, v in _env(slurm).items():
        monkeypatch.setenv(k, v)
    kept = _kept_and_left(slurm)
    os.kill(kept["pids"][3], signal.SIGKILL)
    k = Kernel()
    try:
        k.ok("%mesh up --procs 1 --name here")
        refused = k.run("%mesh reattach", timeout=120)
        text = refused.stream() + json.dumps(refused.error or {})
        assert refused.status == "error" and "UsageError" in text and "already runs 'here'" in text, text
        assert "Traceback" not in text
        k.ok("%%mesh --name here\n1 + 1")
        k.ok("%mesh down here")
        again = k.run("%mesh reattach", timeout=120)
        text = again.stream() + json.dumps(again.error or {})
        assert again.status == "ok", text
        assert f"reattached SLURM job {kept['job_id']}" in text and "bound: train, counter" in text, text
        assert "ranks [3] are not running" in text and "%%mesh on 'train' waits for its ranks" in text, text
        got = k.ok("print(list(counter.slice(hosts=0).incr.call().get(60).values()))")
        assert "[12, 12]" in got.stream(), got.stream()
        k.ok("train.respawn()", timeout=120)
        cell = k.ok("%%mesh --name train\nimport os\nos.getpid()", timeout=120)
        assert str(kept["pids"][0]) in (cell.result or ""), cell.result
        twice = k.run("%mesh reattach", timeout=120)
        text = twice.stream() + json.dumps(twice.error or {})
        assert twice.status == "error" and "attached to this session already" in text and "Traceback" not in text
        k.ok("%mesh down train", timeout=120)
    finally:
        k.shutdown()
        _stop_everything(slurm, netns_hosts)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []
    assert _files(config_dir) == []
