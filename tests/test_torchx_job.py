"""Schedulers by name (the ``jupyter_mesh.jobs`` entry points) and ``TorchXJob`` on TorchX's real
``local_cwd`` scheduler: two replicas on this machine, each a dial-back agent over loopback TCP.

The TorchX runs go in their own process (``torchx_driver.py``, a kernel): their controller listens on
TCP, this process's serves the other tests on private unix sockets."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from jupyter_mesh import MeshValueError, TorchXJob
from jupyter_mesh.jobs import AttachJob, LocalJob, SlurmJob, job_class, job_names
from jupyter_mesh.jobs.registry import BUILTIN, GROUP, make_job

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent

torchx = pytest.importorskip("torchx", reason="TorchX is in the test extra: pip install -e '.[test]'")


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    d = tmp_path / "cfg"
    monkeypatch.setenv("JUPYTER_MESH_CONFIG_DIR", str(d))
    return d


def _env(*paths: pathlib.Path | str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*map(str, paths), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


# -- the registry ----------------------------------------------------------------------------------
def test_ours_are_declared_as_entry_points_and_known_by_name():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][GROUP]
    assert declared == BUILTIN
    assert {"local", "slurm", "attach", "torchx"} <= set(job_names())
    assert job_class("local") is LocalJob and job_class("slurm") is SlurmJob
    assert job_class("attach") is AttachJob and job_class("torchx") is TorchXJob


def test_an_unknown_scheduler_names_the_installed_ones():
    with pytest.raises(MeshValueError) as e:
        job_class("kubernetes")
    msg = str(e.value)
    assert "no scheduler named 'kubernetes'" in msg and "attach, local, slurm, torchx" in msg and GROUP in msg
    with pytest.raises(MeshValueError, match="NAME:SUB"):
        make_job("torchx:", 1)
    with pytest.raises(MeshValueError, match="--attach"):
        make_job("attach", 1)
    with pytest.raises(MeshValueError, match=r"'slurm:x' \(SlurmJob\) does not take"):
        make_job("slurm:x", 1)


def test_a_scheduler_of_another_package_is_one_entry_point(tmp_path):
    """A real installed distribution (a .dist-info with entry_points.txt on sys.path), not a mock of
    importlib: its scheduler is listed, loads, brings a mesh up through %mesh up's path (JobSpec), and
    gets what it was asked for. Its entry point under one of our names does not replace ours; a broken
    or wrong one says which package to fix."""
    site = tmp_path / "site"
    (site / "dummy_sched").mkdir(parents=True)
    (site / "dummy_sched" / "__init__.py").write_text(
        textwrap.dedent(
            '''
            from jupyter_mesh.jobs import LocalJob

            class DummyJob(LocalJob):
                """Hosts on this machine, remembering what it was asked for."""
                seen = {}

                def __init__(self, nodes, preload=(), scheduler=None, scheduler_args=None):
                    DummyJob.seen = dict(nodes=nodes, preload=list(preload), scheduler=scheduler, args=scheduler_args)
                    super().__init__(hosts=nodes, preload=preload)

            class NotAJob:
                pass
            '''
        )
    )
    info = site / "dummy_sched-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dummy-sched\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{GROUP}]\ndummy = dummy_sched:DummyJob\nnotajob = dummy_sched:NotAJob\n"
        "broken = dummy_sched.missing:Job\nslurm = dummy_sched:DummyJob\n"
    )
    code = textwrap.dedent(
        """
        import json
        import dummy_sched
        from jupyter_mesh.jobs import SlurmJob, job_class, job_names
        from jupyter_mesh.notebook.meshes import JobSpec, MeshRegistry
        from actors import Counter

        out = {"names": job_names(), "loads": job_class("dummy") is dummy_sched.DummyJob,
               "slurm_is_ours": job_class("slurm") is SlurmJob}
        for bad in ("notajob", "broken"):
            try:
                job_class(bad)
            except Exception as e:
                out[bad] = f"{type(e).__name__}: {e}"
        meshes = MeshRegistry()
        entry = meshes.up("m", 2, "procs", 1, ["json"], where=JobSpec("dummy:fast", scheduler_args={"queue": "q1"}))
        out["seen"] = dummy_sched.DummyJob.seen
        out["ranks"] = sorted(v["hosts"] for v in entry.procs.spawn("c", Counter, 0).whoami.call().get(30).values())
        meshes.down("m")
        print(json.dumps(out))
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env=_env(site, HERE), capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert "dummy" in out["names"] and "notajob" in out["names"], out
    assert out["loads"] and out["slurm_is_ours"], out
    assert out["seen"] == {"nodes": 2, "preload": ["json"], "scheduler": "fast", "args": {"queue": "q1"}}, out
    assert out["ranks"] == [0, 1], out
    assert "not a jupyter_mesh.jobs.Job subclass" in out["notajob"] and "dummy-sched" in out["notajob"], out
    assert out["broken"].startswith("MeshError: the scheduler 'broken' of dummy-sched") and "missing" in out["broken"]


# -- TorchXJob -------------------------------------------------------------------------------------
def test_torchx_is_imported_only_when_a_job_is_made():
    code = "import sys, jupyter_mesh, jupyter_mesh.jobs; print(any(m.split('.')[0] == 'torchx' for m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "False", p.stderr


def test_a_torchx_scheduler_that_does_not_exist_is_named_with_the_installed_ones(cfg):
    from jupyter_mesh._runtime.controller import Controller

    before, sigint = Controller._instance, signal.getsignal(signal.SIGINT)
    with pytest.raises(MeshValueError, match=r"TorchX has no scheduler 'kubernets': installed are .*kubernetes"):
        TorchXJob(nodes=2, scheduler="kubernets")
    with pytest.raises(MeshValueError, match=r"no option 'lgo_dir': its options are .*log_dir, prepend_cwd"):
        TorchXJob(nodes=1, scheduler_args={"lgo_dir": "/tmp/x"})  # TorchX itself would ignore it
    with pytest.raises(MeshValueError, match="needs nodes >= 1"):
        TorchXJob(nodes=0)
    with pytest.raises(MeshValueError, match="needs bind="):  # where the pods reach us cannot be guessed
        TorchXJob(nodes=1, scheduler="kubernetes")
    assert Controller._instance is before  # refused before the session moved to TCP
    assert signal.getsignal(signal.SIGINT) is sigint  # TorchX's local scheduler was made: our handler stays
    assert not (cfg / "jobs").exists() or not os.listdir(cfg / "jobs")


def test_local_cwd_job_spawns_on_both_replicas_loses_one_with_its_cause_and_stops_clean(cfg):
    p = subprocess.run(
        [sys.executable, str(HERE / "torchx_driver.py")],
        env=_env(HERE),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cfg.parent,
    )
    steps = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            assert "error" not in d, d.get("tb") or d
            steps[d["step"]] = d
    assert p.returncode == 0, p.stdout + p.stderr
    assert steps["imported"]["torchx"] == []  # jupyter_mesh alone does not import TorchX

    sub = steps["submitted"]
    assert sub["handle"].startswith("local_cwd://") and sub["sigint_kept"]  # Ctrl-C stays KeyboardInterrupt
    assert len(sub["keys"]) == 1 and sub["record"]["scheduler"] == "torchx:local_cwd"
    assert sub["record"]["job_id"] == sub["handle"] and sub["record"]["controller"].startswith("tcp://127.0.0.1:")

    up = steps["up"]
    assert [json.loads(r) for r in up["ranks"]] == [
        {"hosts": h, "procs": i} for h in (0, 1) for i in (0, 1)
    ]  # two hosts, each its replica's index
    assert [a["index"] for a in up["agents"]] == [0, 1]
    assert {a["pid"] for a in up["agents"]} <= set(up["children"])  # local_cwd: replicas are our children
    assert up["keys"] == [] and up["state"] == "RUNNING"  # every agent read the key: it left the disk
    assert up["status"] == [
        f"torchx:local_cwd job {sub['handle']}: 2 host(s) (127.0.0.1, 127.0.0.1); controller pid {sub['record']['controller_pid']}"
    ], up["status"]

    lost = steps["lost"]["cause"]
    victim = up["agents"][1]
    assert lost and "[hosts=1," in lost and "[hosts=0," not in lost, lost
    assert f"its process (pid {victim['pid']}) exited" in lost and f"TorchX app {sub['handle']}" in lost, lost
    assert steps["host0"]["values"] == [2, 2]  # the other host's ranks keep working

    end = steps["stopped"]
    assert end["left"] == [] and end["files"] == [] and end["status"] == [] and end["sigint_kept"]
    assert end["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")


def test_agents_that_cannot_start_fail_the_wait_with_their_output(cfg, tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'this node has no python for jupyter_mesh' >&2\nexit 3\n")
    fake.chmod(0o755)
    p = subprocess.run(
        [sys.executable, str(HERE / "torchx_driver.py"), "fails", str(fake)],
        env=_env(HERE),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    steps = {d["step"]: d for d in (json.loads(x) for x in p.stdout.splitlines() if x.startswith("{"))}
    assert p.returncode == 0, p.stdout + p.stderr
    cause = steps["failed"]["cause"]
    assert cause.startswith("MeshError: TorchX app local_cwd://") and "ended (FAILED) before the agent" in cause
    assert "this node has no python for jupyter_mesh" in cause and steps["failed"]["within_timeout"], cause
    assert steps["stopped"] == {"step": "stopped", "files": [], "children": []}


def test_torchx_slurm_submits_one_group_per_host_with_its_index(monkeypatch, tmp_path):
    """What TorchX's slurm scheduler would sbatch (its dry run; no SLURM needed): each replica is its own
    het-job group running our agent with its index; the key file's path is there, never a key. TorchX's
    own options differ from SlurmJob's: ``--kill-on-bad-exit=1`` (one agent lost ends the job)."""
    from torchx.runner import get_runner

    from jupyter_mesh.jobs.torchx import agent_app

    monkeypatch.setenv("PATH", str(tmp_path))  # no `sinfo`: TorchX then sizes no memory request
    key = "/home/u/.jupyter_mesh/jobs/0123abcd.key"
    with get_runner() as runner:
        info = runner.dryrun(agent_app("jupyter-mesh", 2, key, "/usr/bin/python3"), "slurm", cfg={"partition": "debug"})
    script = info.request.materialize()
    assert script.count("#SBATCH hetjob") == 1 and script.count("--partition=debug") == 2, script
    for i in (0, 1):
        assert f"jupyter_mesh.cli agent --key-file {key} --host-index {i}" in script, script
    assert "--kill-on-bad-exit=1" in script


def test_mesh_up_scheduler_torchx_in_a_kernel(cfg):
    """``%mesh up --scheduler torchx:local_cwd --hosts 2``: a %%mesh cell runs on both replicas' procs,
    ``%mesh down`` ends the TorchX app and leaves no process."""
    from _kernel import Kernel, isolate_jupyter_dirs
    from _procs import wait_dead

    isolate_jupyter_dirs()
    k = Kernel()
    try:
        cell = k.ok("%mesh up --scheduler torchx:local_cwd --hosts 2 --procs 1 --name tx", timeout=120)
        assert "mesh 'tx' is up: {'hosts': 2, 'procs': 1}" in cell.stream(), cell.stream()
        workers = k.workers()
        result = k.ok("%%mesh --name tx\ncurrent_rank()['hosts']").result or ""
        assert "hosts=0" in result and "hosts=1" in result, result
        k.ok("%mesh down tx", timeout=60)
        assert not wait_dead(workers, 10.0), "processes left after %mesh down"
    finally:
        left = k.shutdown()
    assert not left, f"processes left after the kernel shut down: {sorted(left)}"
