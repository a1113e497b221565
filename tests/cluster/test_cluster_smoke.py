"""The multi-host test bed is real: separate addresses and loopbacks, a cut that really cuts, and a
SLURM whose job steps run on the namespace hosts. If these fail, every multi-host test above them
would prove nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import netns
import pytest

pytestmark = pytest.mark.cluster

PORT = 47123

# A TCP listener: prints "ready" once listening, answers each connection with its own address.
LISTEN = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.getsockname()[0].encode())
    c.close()
"""

# One connect: prints the listener's answer, or the error's name (ConnectionRefusedError, TimeoutError, ...).
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        print("ok", c.recv(64).decode())
except OSError as e:
    print(type(e).__name__, e.errno)
"""

# The task's own address: the source address of a route to the controller (stdlib only).
WHOAMI = """
import json, os, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((os.environ["SLURM_LAUNCH_NODE_IPADDR"], 9))
print(json.dumps({"node": os.environ["SLURMD_NODENAME"], "rank": int(os.environ["SLURM_PROCID"]),
                  "ip": s.getsockname()[0]}), flush=True)
"""


def _wait_for(pred, timeout: float):
    """``pred()`` once it is truthy, or its last (falsy) value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := pred()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def _connects(froms: list[netns.Host | None], addr: str, timeout: float = 3.0) -> list[str]:
    """Connect from each of ``froms`` (None: the root namespace) to ``addr:PORT`` at once; what
    CONNECT printed in each."""
    procs = []
    for host in froms:
        argv = [sys.executable, "-c", CONNECT, addr, str(PORT), str(timeout)]
        if host is not None:
            argv = netns.nsenter_argv(host, argv)
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
    return [p.communicate(timeout=timeout + 20)[0].strip() for p in procs]


def _connect(host: netns.Host | None, addr: str, timeout: float = 3.0) -> str:
    return _connects([host], addr, timeout)[0]


class Listener:
    """A LISTEN process in a namespace host, stopped on exit."""

    def __init__(self, host: netns.Host, addr: str) -> None:
        self.proc = netns.run_in(
            host, [sys.executable, "-c", LISTEN, addr, str(PORT)], stdout=subprocess.PIPE, text=True
        )

    def __enter__(self) -> Listener:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded by the test timeout; "" if it died
        assert line.strip() == "ready", f"listener did not start (rc={self.proc.poll()})"
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_each_host_has_its_own_address(netns_hosts):
    seen = []
    for h in netns_hosts:
        out = netns.check_output_in(h, ["ip", "-4", "-o", "addr", "show"])
        addrs = sorted(line.split()[3] for line in out.splitlines())
        assert addrs == sorted(["127.0.0.1/8", f"{h.ip}/24"]), f"{h.name}: {addrs}"
        seen.append(h.ip)
    assert len(set(seen)) == len(netns_hosts)
    assert netns_hosts.bridge_ip not in seen


def test_loopback_is_private_to_its_host(netns_hosts):
    a, b = netns_hosts[0], netns_hosts[1]
    with Listener(a, "127.0.0.1"):
        assert _connect(a, "127.0.0.1") == "ok 127.0.0.1"
        assert _connect(b, "127.0.0.1").startswith("ConnectionRefusedError")  # b's own loopback
        assert _connect(b, a.ip).startswith("ConnectionRefusedError")  # bound to a's loopback only
        assert _connect(None, "127.0.0.1").startswith("ConnectionRefusedError")  # nor the root namespace's


def test_hosts_reach_each_other_and_the_root_namespace(netns_hosts):
    a, b = netns_hosts[0], netns_hosts[1]
    with Listener(a, "0.0.0.0"):
        assert _connect(b, a.ip) == f"ok {a.ip}"
        assert _connect(None, a.ip) == f"ok {a.ip}"


def test_cut_fails_connects_and_heal_restores_them(netns_hosts):
    h = netns_hosts[2]
    with Listener(h, "0.0.0.0"):
        assert _connect(None, h.ip) == f"ok {h.ip}"
        netns_hosts.cut(h)
        try:
            t0 = time.monotonic()
            got, peer = _connects([None, netns_hosts[3]], h.ip, timeout=8.0)  # from the root ns and a peer
            failed_after = time.monotonic() - t0
            assert got.split()[0] in ("OSError", "TimeoutError"), got  # EHOSTUNREACH once ARP gives up
            assert peer.split()[0] in ("OSError", "TimeoutError"), peer
        finally:
            netns_hosts.heal(h)
        assert _connect(None, h.ip, timeout=5.0) == f"ok {h.ip}"
    print(f"connect to a cut host failed after {failed_after:.2f} s with {got}")


def test_srun_runs_tasks_on_two_hosts(slurm):
    r = slurm.run(["srun", "-N2", "-n2", sys.executable, "-c", WHOAMI], timeout=60)
    tasks = sorted((json.loads(line) for line in r.stdout.splitlines()), key=lambda t: t["rank"])
    assert [t["rank"] for t in tasks] == [0, 1], r.stdout
    ips = [t["ip"] for t in tasks]
    assert len(set(ips)) == 2, f"both tasks on one address: {tasks}"
    for t in tasks:
        assert t["ip"] == slurm.node_addr(t["node"]), f"task on {t['node']} saw address {t['ip']}: {tasks}"


def test_sbatch_runs_then_scancel_ends_it(slurm, tmp_path):
    t0 = time.monotonic()
    job = slurm.run(["sbatch", "--parsable", "-N1", "-o", str(tmp_path / "out"), "--wrap", "sleep 300"]).stdout
    job = job.strip().split(";")[0]
    _, node = slurm.wait_job_state(job, ["RUNNING"], timeout=30)
    running_after = time.monotonic() - t0
    assert node in slurm.nodes
    host = slurm.host_of(node)
    sleeping = _wait_for(  # squeue says RUNNING a moment before the batch script has started it
        lambda: [p for p in netns.netns_pids(host.name) if netns.cmdline(p).split()[:2] == ["sleep", "300"]], 10.0
    )
    assert sleeping, f"job {job} is RUNNING on {node} but after 10 s no `sleep 300` runs in {host.name}"
    t0 = time.monotonic()
    slurm.run(["scancel", job])
    slurm.wait_job_state(job, [""], timeout=30)
    ended_after = time.monotonic() - t0
    assert not [p for p in sleeping if netns.alive(p)], "scancel left the job's process running"
    final = slurm.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"]).stdout.strip()
    assert final == "CANCELLED"
    print(f"sbatch -> RUNNING in {running_after:.2f} s; scancel -> gone from squeue in {ended_after:.2f} s")


def test_srun_overlap_joins_a_running_allocation(slurm, tmp_path):
    """What `SlurmJob` does: one allocation, then its agents started with `srun --jobid --overlap`."""
    job = slurm.run(["sbatch", "--parsable", "-N2", "-o", str(tmp_path / "out"), "--wrap", "sleep 300"]).stdout
    job = job.strip().split(";")[0]
    try:
        _, nodelist = slurm.wait_job_state(job, ["RUNNING"], timeout=30)
        nodes = slurm.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()
        r = slurm.run(["srun", f"--jobid={job}", "--overlap", "-N2", "-n2", sys.executable, "-c", WHOAMI], timeout=60)
        seen = sorted(json.loads(line)["node"] for line in r.stdout.splitlines())
        assert seen == sorted(nodes)
    finally:
        slurm.run(["scancel", job])
        slurm.wait_job_state(job, [""], timeout=30)


def test_scontrol_expands_a_nodelist(slurm):
    out = slurm.run(["scontrol", "show", "hostnames", "n[0-2],n3"]).stdout.split()
    assert out == ["n0", "n1", "n2", "n3"] == slurm.nodes
    assert [slurm.node_addr(n) for n in out] == [h.ip for h in slurm.hosts]
