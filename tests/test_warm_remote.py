"""Warm by default on hosts that agents bring up elsewhere: attached agents, TorchX replicas, ``%mesh up``.

Each agent's template imports what its host has of ``jobs.warm``'s list (torch, and what the controller
imported already), in the background: the agent reports in at once, and procs forked later start
with those modules loaded. The drivers (``warm_driver.py``) are processes of their own, as their
controllers listen on TCP; the rest of the suite runs with ``JUPYTER_MESH_WARM=0`` (conftest)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from jupyter_mesh.jobs import warm

pytestmark = pytest.mark.integration

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent
torch_installed = warm._installed("torch")


def drive(mode: str, flag: pathlib.Path, cfg: pathlib.Path, timeout: float = 240) -> dict[str, dict]:
    flag.write_text("")
    env = {
        **os.environ,
        "JUPYTER_MESH_WARM": "1",
        "JUPYTER_MESH_CONFIG_DIR": str(cfg),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    p = subprocess.run(
        [sys.executable, str(HERE / "warm_driver.py"), mode, str(flag)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cfg.parent,
    )
    steps = {d["step"]: d for d in (json.loads(x) for x in p.stdout.splitlines() if x.startswith("{"))}
    assert "error" not in steps, steps["error"].get("tb")
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    return steps


@pytest.fixture
def cfg(tmp_path):
    d = tmp_path / "cfg"
    d.mkdir(mode=0o700)
    env = {**os.environ, "JUPYTER_MESH_CONFIG_DIR": str(d)}
    subprocess.run([sys.executable, "-m", "jupyter_mesh.cli", "keygen"], check=True, timeout=60, env=env)
    return d


def test_remote_warm_names_torch_and_what_this_program_imported_and_nothing_when_opted_out(monkeypatch):
    import types

    monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
    monkeypatch.setitem(sys.modules, "pandas", types.ModuleType("pandas"))
    got = warm.remote_warm()
    assert "torch" in got and "pandas" in got  # torch whether or not *this* machine has it
    assert warm.split(None) == ([], got) and warm.split(["x"]) == (["x"], [])
    monkeypatch.setenv("JUPYTER_MESH_WARM", "0")
    assert warm.remote_warm() == [] and warm.split(None) == ([], [])


def _check(steps: dict[str, dict], hosts: int = 2) -> None:
    assert "slow_warm_import" in steps["list"]["remote"] and "torch" in steps["list"]["remote"]
    joined = steps["joined"]
    assert joined["hosts"] == hosts
    assert joined["flag_still_there"], "the agents reported in only after their templates' warm imports"
    spawned = steps["spawned"]
    expect = [{"torch": torch_installed, "slow_warm_import": True}] * hosts
    assert spawned["had"] == expect, spawned  # loaded before the actor's code ran: forked warm
    if spawned["templates"]:  # the agents run below the driver: the procs' parents are their templates'
        # warm children (the templates themselves import none of the warm list: they fork on meanwhile)
        assert spawned["grandparents"] == spawned["templates"]
        assert spawned["torch_in_parents"] == [torch_installed] * hosts
    assert steps["stopped"]["left"] == []


def test_attached_hosts_report_in_at_once_and_fork_warm_procs_unless_opted_out(tmp_path, cfg):
    steps = drive("attach", tmp_path / "flag", cfg)
    _check(steps)
    assert steps["opted_out"]["had"] == [{"torch": False, "slow_warm_import": False}] * 2


def test_torchx_replicas_report_in_at_once_and_fork_warm_procs(tmp_path, cfg):
    pytest.importorskip("torchx", reason="TorchX is in the test extra: pip install -e '.[test]'")
    _check(drive("torchx", tmp_path / "flag", cfg))


@pytest.mark.kernel
@pytest.mark.skipif(not torch_installed, reason="torch is not installed")
def test_mesh_up_without_preload_forks_warm_procs_on_every_host_and_preload_names_the_list(monkeypatch):
    """``%mesh up --hosts 2`` (no ``--preload``) warms both hosts; ``--preload colorsys`` names the list."""
    from _kernel import fresh_kernel

    monkeypatch.setenv("JUPYTER_MESH_WARM", "1")
    with fresh_kernel() as k:
        k.ok("%mesh up --hosts 2 --procs 1 --name w", timeout=180)
        k.ok("%mesh up --hosts 1 --procs 1 --name named --preload colorsys", timeout=180)
        probe = "import sys\n'torch' in sys.modules, 'colorsys' in sys.modules"
        warm_result = k.ok(f"%%mesh --name w\n{probe}", timeout=60).result or ""
        named_result = k.ok(f"%%mesh --name named\n{probe}", timeout=60).result or ""
        assert warm_result.count("(True, False)") == 2, warm_result  # torch was there before the cell
        assert named_result.count("(False, True)") == 1, named_result  # only what --preload named
        k.ok("%mesh down w", timeout=60)
        k.ok("%mesh down named", timeout=60)
