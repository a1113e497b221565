"""Warm by default under SLURM: each node's agent reports in at once while its template imports what
the node has of ``jobs.warm``'s list in the background, and procs forked later start with it loaded.

The controller is ``tests/warm_driver.py slurm`` (its own process: it listens on TCP); its list gets
``slow_warm_import``, whose import waits while a flag file exists (the agents must report in first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)


def test_slurm_nodes_report_in_at_once_and_fork_warm_procs(netns_hosts, slurm, config_dir, tmp_path):
    from jupyter_mesh.jobs import warm

    flag = tmp_path / "flag"
    flag.write_text("")
    env = {
        **os.environ,
        **slurm.env,
        "JUPYTER_MESH_WARM": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([TESTS, ROOT, os.environ.get("PYTHONPATH", "")]),
    }
    p = subprocess.run(
        [sys.executable, os.path.join(TESTS, "warm_driver.py"), "slurm", str(flag)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    steps = {d["step"]: d for d in (json.loads(x) for x in p.stdout.splitlines() if x.startswith("{"))}
    assert "error" not in steps, steps["error"].get("tb")
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    assert steps["joined"] == {"step": "joined", "hosts": 2, "flag_still_there": True}
    torch_here = warm._installed("torch")  # the nodes share this machine's file system
    assert steps["spawned"]["had"] == [{"torch": torch_here, "slow_warm_import": True}] * 2
    assert steps["stopped"]["left"] == []
    assert slurm.job_ids() == []
