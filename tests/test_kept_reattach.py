"""A kept-alive agent taken over by a new controller, on this host with real processes (the same
agent and hand-over as a SLURM job's: tests/cluster/test_reattach.py; the state machine alone:
tests/test_keep_alive.py). A kernel killed and reattached at once is waited out, not refused; one
that still runs is refused (unless forced)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _procs import wait_dead

pytestmark = pytest.mark.integration

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kept_driver.py")


@pytest.fixture
def kept(tmp_path):
    """A first controller (its own process) driving a kept-alive agent the test started: (that
    process, {"key", "controller", "agent", "pid"}, env). Both are reaped after the test; a reattach
    that took the agent stops it."""
    env = {
        **os.environ,
        "JUPYTER_MESH_CONFIG_DIR": str(tmp_path / "cfg"),
        # the agents wait out a silent controller this long: longer than a new controller takes to
        # start on a loaded machine, so the test always sees the wait
        "JUPYTER_MESH_HEARTBEAT_TIMEOUT": "8",
    }
    first = subprocess.Popen(
        [sys.executable, DRIVER, "first"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    agent = None
    try:
        got = json.loads(first.stdout.readline())
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_mesh.cli",
                "agent",
                "--key-file",
                got["key"],
                "--controller",
                got["controller"],
            ],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # as under srun: not the first controller's child
            env=env,
        )
        got.update(json.loads(first.stdout.readline()))
        yield first, got, env
    finally:
        for p in (first, agent):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait(10)
        for f in (first.stdin, first.stdout):
            if f is not None:
                f.close()
        if agent is not None:
            assert not wait_dead([agent.pid], 1)


def reattach(got: dict, env: dict, *more: str) -> tuple[dict, str]:
    p = subprocess.run(
        [sys.executable, DRIVER, "reattach", got["key"], got["agent"], *more],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[0]), p.stderr


def test_a_controller_killed_a_moment_ago_is_waited_out_and_its_job_taken_back(kept):
    first, got, env = kept
    first.kill()  # SIGKILL: no detach; the agent last heard it a moment ago
    first.wait(10)
    r, err = reattach(got, env)
    assert r["error"] is None, (r, err)
    assert "was last heard from" in err and "taken for dead" in err, err  # the user is told why it waits


def test_a_live_controller_is_refused_and_a_forced_reattach_takes_the_job(kept):
    _, got, env = kept
    r, _ = reattach(got, env)
    assert "still driven by a live controller" in r["error"] and "force=True" in r["error"], r
    assert "answered heartbeats" in r["error"]
    r, _ = reattach(got, env, "force")
    assert r["error"] is None, r
