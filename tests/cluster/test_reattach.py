"""A SLURM job kept alive past its controller, taken back by the next one (issue 13: "a new kernel can
reattach to a running job and its meshes"): actors keep their state, procs their pids; a proc that
died meanwhile is reported and respawned with its actor; a controller that still runs is not robbed
unless the new one forces it (and then hears why); stop leaves no job and no process.

Each controller is its own process (``mesh_driver.py keep|reattach``), as two kernels would be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import netns
from test_multihost import DRIVER, _env, _no_mesh_processes_in, drive, step

PY = sys.executable


def _first(env: dict[str, str], then: str) -> tuple[subprocess.Popen[str], dict]:
    """A first controller that keeps its job alive; returns it (running, or gone) and its 'kept' step."""
    p = subprocess.Popen(
        [PY, DRIVER, "keep", "2", then],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = p.stdout.readline()
    assert line.startswith("{"), f"{line}{p.stderr.read() if p.poll() is not None else ''}"
    return p, json.loads(line)


def _kept_agents_alive(hosts) -> list[str]:
    return [
        netns.cmdline(pid)
        for h in hosts
        for pid in netns.netns_pids(h.name)
        if netns.alive(pid) and netns.cmdline(pid).startswith(PY) and "jupyter_mesh.cli agent" in netns.cmdline(pid)
    ]


def test_a_kept_job_outlives_its_controller_and_the_next_takes_its_meshes_back(netns_hosts, slurm, config_dir):
    env = {**_env(), **slurm.env}
    p, kept = _first(env, "exit")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert kept["counts"] == [13, 13, 13, 13]
    job_id = kept["job_id"]
    assert slurm.job_state(job_id)[0] == "RUNNING"  # the controller exited; the job did not
    assert len(_kept_agents_alive(netns_hosts)) == 2
    steps = drive("reattach", "-", "stop", env=env)
    r = step(steps, "reattach")
    assert r["error"] is None and r["procs"] == ["train"] and r["actors"] == ["counter"], r
    assert r["notes"] == []
    counted = step(steps, "counted")
    assert counted["counts"] == [14, 14, 14, 14]  # the same actors, their state kept
    assert counted["pids"] == kept["pids"]  # the same procs
    assert step(steps, "job_stopped")["job_id"] == job_id
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []
    assert not [n for n in os.listdir(config_dir / "jobs") if not n.endswith(".log")]  # no key left


def test_a_killed_controllers_kept_job_is_taken_back_and_a_rank_that_died_meanwhile_is_respawned(
    netns_hosts, slurm, config_dir
):
    env = {**_env(), **slurm.env}
    p, kept = _first(env, "kill")
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    victim = kept["pids"][1]
    os.kill(victim, signal.SIGKILL)  # while nobody drives the job
    # at once, as a user whose kernel died reattaches: the agents heard the killed controller a moment
    # ago, so they wait out its silence (the heartbeat timeout; the driver's stderr says so) and then
    # hand the job over; a controller that answers heartbeats is refused (test_a_live_controller_...)
    steps = drive("reattach", "-", "stop", "kill", env=env)
    r = step(steps, "reattach")
    assert r["error"] is None, r
    assert any("ranks [1] are not running" in n for n in r["notes"]), r
    assert step(steps, "found")["running"] == [0, 2, 3]
    counted = step(steps, "counted")
    assert counted["counts"][0] == 14 and counted["counts"][2:] == [14, 14]
    assert counted["counts"][1] == 11  # respawned: its actor re-created from its spawn arguments
    assert counted["pids"][1] != victim and counted["pids"][0] == kept["pids"][0]
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


def test_a_live_controller_is_not_robbed_unless_forced_and_then_hears_why(netns_hosts, slurm, config_dir):
    env = {**_env(), **slurm.env}
    holder, _ = _first(env, "hold")
    try:
        steps = drive("reattach", "-", "exit", env=env)
        r = step(steps, "reattach")
        assert r["error"] and "still driven by a live controller" in r["error"] and "force=True" in r["error"], r
        steps = drive("reattach", "force", "exit", env=env)  # takes it; exits: the job is kept for the next
        assert step(steps, "reattach")["error"] is None
        assert step(steps, "counted")["counts"] == [14, 14, 14, 14]
        holder.stdin.write("\n")
        holder.stdin.flush()
        after = json.loads(holder.stdout.readline())
        assert after["error"] and "took it over" in after["error"], after
        holder.communicate(timeout=30)
        assert holder.returncode == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate(timeout=10)
    steps = drive("reattach", "-", "stop", env=env)  # and once more, after the forced one exited
    assert step(steps, "counted")["counts"] == [15, 15, 15, 15]
    assert slurm.job_ids() == []
    assert _no_mesh_processes_in(list(netns_hosts)) == []


def test_reattach_without_a_kept_job_says_how_to_keep_one(netns_hosts, slurm, config_dir):
    steps = drive("reattach", "-", "stop", env={**_env(), **slurm.env})
    err = step(steps, "reattach")["error"]
    assert "keep_alive=True" in err and "--keep-alive" in err, err
