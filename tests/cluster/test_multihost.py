"""Meshes over several hosts (issue 13): agents in network namespaces, attached by hand or placed by a
real SLURM; every adverb with every payload across hosts; faults across hosts; nothing left behind.

Each scenario's controller is its own process (``mesh_driver.py``): it listens on TCP + CURVE on the
bridge, while this test process keeps its private unix-socket controller for the other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import netns
import pytest

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mesh_driver.py")
PY = sys.executable


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def drive(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> list[dict]:
    p = subprocess.run([PY, DRIVER, *args], capture_output=True, text=True, timeout=timeout, env=env or _env())
    steps = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert p.returncode == 0, f"driver failed ({p.returncode}):\n{p.stdout}\n{p.stderr[-4000:]}"
    return steps


def step(steps: list[dict], name: str) -> dict:
    for s in steps:
        if s.get("step") == name:
            return s
    raise AssertionError(f"no step {name!r} in {steps}")


class Listeners:
    """``jupyter-mesh agent --listen`` in each given host, as a person would start them."""

    def __init__(self, hosts, port: int = 6000):
        self.procs = []
        self.addrs = []
        for h in hosts:
            addr = f"tcp://{h.ip}:{port}"
            p = netns.run_in(
                h,
                [PY, "-m", "jupyter_mesh.cli", "agent", "--listen", addr],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=_env(),
            )
            line = p.stdout.readline().decode()  # "waiting to be attached at ..."
            assert "waiting to be attached" in line, line
            self.procs.append(p)
            self.addrs.append(addr)

    def stop(self) -> list[str]:
        out = []
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                rest, _ = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                rest, _ = p.communicate(timeout=5)
            out.append(rest.decode())
            assert p.returncode is not None
        return out


def _no_mesh_processes_in(hosts) -> list[str]:
    left = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [
            f"{h.name}: {netns.cmdline(pid)}" for h in hosts for pid in netns.netns_pids(h.name) if netns.alive(pid)
        ]
        left = [x for x in left if "slurmd" not in x and "slurmstepd" not in x]
        if not left:
            return []
        time.sleep(0.2)
    return left


def test_attach_to_agents_started_by_hand_runs_every_adverb_across_hosts(netns_hosts, config_dir):
    hosts = [netns_hosts[0], netns_hosts[1]]
    ls = Listeners(hosts)
    try:
        steps = drive("attach", "2", *ls.addrs)
        spawned = step(steps, "spawned")
        where = spawned["where"]
        assert len(where) == 4
        spaces = {w["netns"] for w in where}
        assert len(spaces) == 2 and spawned["me"] not in spaces  # two hosts, neither is ours
        assert step(steps, "adverbs")["bad"] == []
        step(steps, "job_stopped")
        # the listeners wait for the next controller: a second session works too
        again = drive("attach", "1", *ls.addrs)
        assert step(again, "adverbs")["bad"] == []
    finally:
        logs = ls.stop()
    assert all("waiting again" in log for log in logs), logs
    assert _no_mesh_processes_in(hosts) == []


def test_rdma_buffers_across_hosts_never_use_shared_memory(netns_hosts, config_dir):
    """Namespace hosts share /dev/shm, so shared memory would *work* between them: the runtime must
    still pick it only within a host (same boot and network namespace), and move the bytes right."""
    hosts = [netns_hosts[2], netns_hosts[3]]
    ls = Listeners(hosts, port=6002)
    try:
        steps = drive("attach_rdma", *ls.addrs)
    finally:
        ls.stop()
    same, other = step(steps, "same_host"), step(steps, "other_host")
    assert same["ok"] and other["ok"], steps
    assert set(same["backends"]) == {"shm"}, same
    assert "shm" not in other["backends"] and set(other["backends"]) <= {"ucx", "zmq"}, other
    assert _no_mesh_processes_in(hosts) == []


def test_a_second_controller_is_refused_and_a_wrong_key_never_gets_in(netns_hosts, config_dir, tmp_path):
    hosts = [netns_hosts[2]]
    ls = Listeners(hosts, port=6001)
    holder = subprocess.Popen(
        [PY, DRIVER, "attach_hold", *ls.addrs], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env()
    )
    try:
        assert json.loads(holder.stdout.readline())["step"] == "attached"
        refused = step(drive("attach_refused", *ls.addrs), "refused")
        # the listener's own answer, not a start timeout ("no agent answered")
        assert "already serves another controller" in refused["error"], refused
        # another user's key (a fresh one) cannot even finish the CURVE handshake: a clear timeout
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        env = {**_env(), "JUPYTER_MESH_CONFIG_DIR": str(other)}
        subprocess.run([PY, "-m", "jupyter_mesh.cli", "keygen"], check=True, timeout=60, env=env, capture_output=True)
        failed = step(drive("attach_wrong_key", *ls.addrs, env=env), "failed")
        assert "no agent answered" in failed["error"] and "mesh key" in failed["error"], failed
    finally:
        holder.stdin.close()
        holder.wait(60)
        holder.stdout.close()
        ls.stop()
    assert _no_mesh_processes_in(hosts) == []


@pytest.mark.parametrize(("nodes", "per_host"), [(2, 2), (4, 1)])
def test_slurm_job_places_agents_on_its_nodes_and_leaves_nothing(netns_hosts, slurm, config_dir, nodes, per_host):
    steps = drive("slurm", str(nodes), str(per_host), env={**_env(), **slurm.env})
    agents = step(steps, "agents")
    assert agents["state"] == "RUNNING" and len(agents["nodes"]) == nodes
    where = step(steps, "spawned")["where"]
    assert {w["node"] for w in where} == set(agents["nodes"])  # each agent runs on its own node
    assert len({w["netns"] for w in where}) == nodes
    assert step(steps, "adverbs")["bad"] == []
    stopped = step(steps, "job_stopped")
    job_id = stopped["job_id"]
    status = step(steps, "status")["lines"]
    assert len(status) == 1 and f"slurm job {job_id}: {nodes} host(s)" in status[0] and "RUNNING" in status[0], status
    assert stopped["status"] == []  # the record goes with the job
    assert slurm.job_state(job_id)[0] in ("", "CANCELLED", "COMPLETED")
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []
    assert os.listdir(config_dir / "jobs") == [] or all(n.endswith(".log") for n in os.listdir(config_dir / "jobs"))


@pytest.mark.parametrize("fault", ["scancel", "kill_agent", "cut"])
def test_a_host_lost_under_slurm_fails_its_ranks_with_the_cause(netns_hosts, slurm, config_dir, fault):
    veth = netns_hosts[1].veth  # SLURM fills nodes in order: a 2-node job is on n0, n1
    steps = drive("slurm_fault", "2", fault, veth, env={**_env(), **slurm.env})
    f = step(steps, "fault")
    assert f["error"], f"the call did not fail after {fault}: {steps}"
    assert f["kind"] == "SupervisionError", f  # a failure with its cause, not the call's 30 s timeout
    if fault == "scancel":
        assert "got SIGTERM" in f["error"], f  # the agent said so as it went: no heartbeat timeout
        assert any(w in f["error"] for w in ("is ending (COMPLETING", "is CANCELLED", "no longer in the queue")), f
    elif fault == "kill_agent":
        assert "is lost" in f["error"], f
    else:
        assert f"host {netns_hosts[1].ip} unreachable" in f["error"], f
    step(steps, "job_stopped")  # stop() returned (it is bounded; the driver's own timeout catches a hang)
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


def test_the_state_names_each_hosts_ip_and_a_cut_one_unreachable(netns_hosts, slurm, config_dir):
    """What the widget, the sidebar and ``jupyter-mesh status`` render of a SLURM mesh: each host's IP
    and state, the job's id; a host cut off turns "unreachable" with why, the other stays up."""
    cut_host = netns_hosts[1]  # SLURM fills nodes in order: a 2-node job is on n0, n1
    steps = drive("slurm_fault", "2", "cut", cut_host.veth, env={**_env(), **slurm.env})
    job_id = step(steps, "job_stopped")["job_id"]
    before = step(steps, "hosts")
    assert before["job"] == {"kind": "slurm", "id": str(job_id), "keep_alive": False}, before
    by_ip = {h["address"]: h for h in before["hosts"]}
    assert sorted(by_ip) == sorted([netns_hosts[0].ip, cut_host.ip]), before["hosts"]
    assert all(h["state"] == "up" and h["why"] == "" for h in before["hosts"]), before["hosts"]
    assert f"SLURM job {job_id}" in before["table"] and f"\u00b7 {cut_host.ip} \u00b7 up" in before["table"]
    after = {h["address"]: h for h in step(steps, "state")["hosts"]}
    assert after[netns_hosts[0].ip]["state"] == "up", after
    lost = after[cut_host.ip]
    assert lost["state"] == "unreachable" and f"host {cut_host.ip} unreachable" in lost["why"], lost
    table = step(steps, "state")["table"]
    assert f"\u00b7 {cut_host.ip} \u00b7 unreachable \u00b7 1 proc: host {cut_host.ip} unreachable" in table, table
