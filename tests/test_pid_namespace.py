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


needs_unshare = pytest.mark.skipif(not _can_unshare_pids(), reason="needs `unshare --pid` (root, util-linux)")


def _drive(tmp_path, *args: str, **env: str) -> dict:
    key = tmp_path / "mesh.key"
    subprocess.run([sys.executable, "-m", "jupyter_mesh.cli", "keygen", str(key)], check=True, timeout=60)
    path = os.pathsep.join([TESTS, ROOT, os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, os.path.join(TESTS, "pidns_driver.py"), str(key), *args],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": path, **env},
    )  # fmt: skip
    steps = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            s = json.loads(line)
            steps[s["step"]] = s
    assert out.returncode == 0 and "done" in steps, out.stdout[-3000:] + out.stderr[-3000:]
    return steps


@needs_unshare
def test_an_agent_in_another_pid_namespace_gets_large_results_and_arguments_across(tmp_path):
    steps = _drive(tmp_path)
    assert steps["call"]["ok"] and steps["call_one"]["ok"], steps


@needs_unshare
def test_a_message_over_the_tcp_frame_limit_fails_its_call_with_why(tmp_path):
    """A result or argument with a frame above JUPYTER_MESH_MAX_FRAME to a peer over TCP, or a host's
    gathered results that together are: the peer dropped it with the connection, and the call waited
    for ever; now it fails at once, saying why."""
    steps = _drive(tmp_path, "limit", JUPYTER_MESH_MAX_FRAME=str(1 << 20))
    for step in ("result", "argument", "gathered", "cast"):
        assert "JUPYTER_MESH_MAX_FRAME" in steps[step]["error"], steps
    assert "cannot be sent to its caller" in steps["result"]["error"], steps
    assert "DeliveryError: 2 rank(s)" in steps["cast"]["error"], steps  # (it said 1, for the whole mesh)
    # what to do: not a retry (a DeliveryError said "make the call again ... report it"), but how to
    # send less or raise the limit, for an argument (DeliveryError) as for a result (ActorError)
    for step in ("result", "argument", "gathered", "cast"):
        todo = steps[step]["error"].rpartition("\n")[2]
        assert "a retry fails the same way" in todo and "RDMABuffer" in todo, steps[step]["error"]
        assert "JUPYTER_MESH_MAX_FRAME to the same value on every host" in todo, todo
        assert "make the call again" not in todo and "call again." not in todo, todo
    assert steps["after"]["ok"], steps


def test_an_agent_with_another_frame_limit_is_refused_with_why(tmp_path):
    """Its sockets over TCP take frames up to 2 MiB, the controller's up to 256 MiB: a message between
    the two sizes was dropped with the connection, which then stalled on it for good. It is refused at
    attach, naming both limits, and told to stop."""
    steps = _drive(tmp_path, "mismatch")
    assert "takes frames up to 2097152 bytes" in steps["attached"]["error"], steps
    assert "JUPYTER_MESH_MAX_FRAME" in steps["attached"]["error"], steps
    assert steps["agent"]["exited"], steps
