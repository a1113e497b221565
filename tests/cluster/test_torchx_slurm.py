"""TorchX's slurm scheduler (``TorchXJob(scheduler="slurm")``) on the test SLURM, which runs no
accounting (no slurmdbd), like many small clusters: what works, and what TorchX cannot do without
``sacct``.

Works: TorchX's sbatch (one het-job group per host), our agents on two nodes with their replica's
index, a mesh over them, and stopping (our agents exit, their srun ends, the job with it). Needs
accounting: TorchX's ``status`` and ``cancel`` (both run ``sacct``), so the job's state is UNKNOWN
with why, and stop() says that TorchX could not cancel it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import netns
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
DRIVER = os.path.join(TESTS, "torchx_driver.py")

pytest.importorskip("torchx", reason="TorchX is in the test extra: pip install -e '.[test]'")


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    d = tmp_path / "cfg"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("JUPYTER_MESH_CONFIG_DIR", str(d))
    return d


def _mesh_processes_in(hosts, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = [f"{h.name}: {netns.cmdline(p)}" for h in hosts for p in netns.netns_pids(h.name) if netns.alive(p)]
        left = [x for x in left if "slurmd" not in x and "slurmstepd" not in x]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_torchx_slurm_places_agents_but_cannot_follow_the_job_without_sacct(netns_hosts, slurm, config_dir):
    path = os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])  # the nodes import tests/actors.py
    env = {**os.environ, **slurm.env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    p = subprocess.run(
        [sys.executable, DRIVER, "slurm"], capture_output=True, text=True, timeout=240, env=env, cwd=config_dir.parent
    )
    lines = [json.loads(s) for s in p.stdout.splitlines() if s.startswith("{")]
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    steps = {d["step"]: d for d in lines}

    state, why = steps["submitted"]["state"]
    assert steps["submitted"]["handle"].startswith("slurm://")
    assert state == "UNKNOWN" and "sacct" in why, why  # TorchX's describe reads sacct: no accounting here

    up = steps["up"]
    assert up["ranks"] == [0, 1]  # each agent got its replica's index (--host-index ${replica_id})
    ips = {a.split("//")[1].rsplit(":", 1)[0] for a in up["agents"]}
    assert len(ips) == 2 and ips <= {h.ip for h in netns_hosts}, up  # two nodes, each its own host
    assert "TorchX could not cancel" in p.stderr and "sacct" in p.stderr  # stop() says so, and why

    deadline = time.monotonic() + 30  # the agents exited: their srun ends, and the batch job with it
    while slurm.job_ids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm.job_ids() == []
    assert _mesh_processes_in(list(netns_hosts)) == []
    assert sorted(os.listdir(config_dir / "jobs")) == []  # key and record gone; TorchX's output is in cwd
