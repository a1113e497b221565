"""Processes on this machine but in another pid namespace (a container run with ``--network=host``)
are another host: their pids are not ours, and the shared memory we name through ``/proc/<pid>/fd`` is
not theirs. Both sides used to take them for this host (same boot, same network), so a large result
or argument went through shared memory the other side could not open, and the call waited for ever."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def _can_unshare_pids() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_unshare_pids(), reason="needs `unshare --pid` (root, util-linux)")
def test_an_agent_in_another_pid_namespace_gets_large_results_and_arguments_across(tmp_path):
    key = tmp_path / "mesh.key"
    subprocess.run([sys.executable, "-m", "jupyter_mesh.cli", "keygen", str(key)], check=True, timeout=60)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, ROOT, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, os.path.join(TESTS, "pidns_driver.py"), str(key)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    steps = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            s = json.loads(line)
            steps[s["step"]] = s
    assert out.returncode == 0 and "done" in steps, out.stdout[-3000:] + out.stderr[-3000:]
    assert steps["call"]["ok"] and steps["call_one"]["ok"], steps
