"""A kept job's record and key (``SlurmJob(keep_alive=True)``) as the next kernel finds them: SLURM
that cannot be asked is not SLURM saying the job ended, and a record is read as data, never trusted.

No SLURM here: ``scontrol`` and ``squeue`` are small scripts first on ``PATH`` that say what a test
wants and note how they were called. (Reattaching to a real job: tests/cluster/test_reattach*.py.)
"""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from jupyter_mesh import SlurmJob
from jupyter_mesh.errors import MeshError, MeshValueError

UNREACHABLE = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
GONE = "slurm_load_jobs error: Invalid job id specified"


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    d = tmp_path / "cfg"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("JUPYTER_MESH_CONFIG_DIR", str(d))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return d


def _slurm(tmp_path, monkeypatch, state: str | None, err: str = "") -> str:
    """Fake ``scontrol``/``squeue``: the job is ``state`` (None: they fail with ``err``). Returns the
    file where each call's arguments are noted."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    for name, ok in (
        ("scontrol", f"echo JobId=$5 JobState={state} Reason=None"),
        ("squeue", f"echo {state}"),
    ):
        body = ok if state is not None else f"echo '{err}' >&2; exit 1"
        p = bin_dir / name
        p.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{body}\n')
        p.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return str(calls)


def _kept_job(cfg, job_id: object = "12", token: str = "a1b2c3d4e5f60718", **rec: object) -> tuple[str, str]:
    """A kept job's key (0600) and record, as ``SlurmJob(keep_alive=True)`` leaves them."""
    from jupyter_mesh._wire.channels import CurveKeys
    from jupyter_mesh._wire.keyfile import KeyFile, write_key_file

    jobs = cfg / "jobs"
    jobs.mkdir(mode=0o700, exist_ok=True)
    key = str(jobs / f"{token}.key")
    write_key_file(key, KeyFile(os.urandom(32), CurveKeys.new(), {"keep_alive": True, "nonce": token}))
    record = {
        "scheduler": "slurm",
        "job_id": job_id,
        "nodes": 2,
        "controller": "tcp://10.9.0.1:40000",
        "controller_pid": 1,
        "controller_host": "elsewhere",
        "agents": ["tcp://10.9.0.2:41000", "tcp://10.9.0.3:41000"],
        "hosts": ["10.9.0.2", "10.9.0.3"],
        "created": time.time(),
        "keep_alive": True,
        "meshes": [],
        **rec,
    }
    path = str(jobs / f"{token}.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    return key, path


def _called(calls: str) -> list[str]:
    try:
        with open(calls) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


# -- SLURM that cannot be asked -------------------------------------------------------------------------
def test_a_reattach_while_slurm_cannot_be_asked_keeps_the_jobs_key_and_says_so(cfg, tmp_path, monkeypatch):
    """slurmctld down for a moment (or no SLURM client on this machine): the job may well run. Before,
    the sweep took "squeue printed nothing" for "ended" and deleted the key and record — the only way
    back to the job — and the reattach said the job was "no longer in the queue"."""
    key, rec = _kept_job(cfg)
    _slurm(tmp_path, monkeypatch, None, UNREACHABLE)
    with pytest.raises(MeshError) as e:
        SlurmJob.reattach()
    assert "cannot ask SLURM about job 12" in str(e.value) and "Unable to contact" in str(e.value), e.value
    assert "try again" in str(e.value)
    assert os.path.exists(key) and os.path.exists(rec)


def test_without_a_slurm_client_a_reattach_keeps_the_files(cfg, tmp_path, monkeypatch):
    key, rec = _kept_job(cfg)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(MeshError) as e:
        SlurmJob.reattach()
    assert "not installed" in str(e.value), e.value
    assert os.path.exists(key) and os.path.exists(rec)


@pytest.mark.parametrize(
    ("state", "err", "left"),
    [
        ("RUNNING", "", True),
        ("PENDING", "", True),
        ("COMPLETED", "", False),
        ("CANCELLED", "", False),
        (None, GONE, False),  # SLURM forgot it: it ended
        (None, UNREACHABLE, True),  # SLURM cannot say: the job may run
    ],
)
def test_the_sweep_drops_a_kept_jobs_files_only_when_slurm_says_it_ended(cfg, tmp_path, monkeypatch, state, err, left):
    from jupyter_mesh.jobs._dialback import jobs_dir, sweep_stale

    key, rec = _kept_job(cfg)
    _slurm(tmp_path, monkeypatch, state, err)
    sweep_stale(jobs_dir())
    assert os.path.exists(key) is left and os.path.exists(rec) is left


def test_a_job_slurm_says_ended_is_refused_and_its_files_go(cfg, tmp_path, monkeypatch):
    key, rec = _kept_job(cfg)
    calls = _slurm(tmp_path, monkeypatch, None, GONE)
    with pytest.raises(MeshError) as e:
        SlurmJob.reattach(job_id=12)
    assert "SLURM job 12 (no longer known to SLURM) ended while no kernel was attached" in str(e.value), e.value
    assert not os.path.exists(key) and not os.path.exists(rec)
    assert _called(calls)


def test_a_record_that_is_json_but_no_object_does_not_break_the_sweep(cfg, tmp_path, monkeypatch):
    """Every new SLURM or TorchX job sweeps the records first: one that is a JSON list raised an
    AttributeError out of it, so no job could start until the file was removed by hand."""
    from jupyter_mesh.jobs._dialback import jobs_dir, sweep_stale

    key, rec = _kept_job(cfg)
    with open(rec, "w") as f:
        f.write("[1, 2]")
    _slurm(tmp_path, monkeypatch, "RUNNING")
    assert sweep_stale(jobs_dir()) == []
    assert os.path.exists(key) and os.path.exists(rec)


# -- a record that lies ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("what", "change", "says"),
    [
        ("an option for a job id", {"job_id": "--help"}, "job_id"),
        ("a job id with a space", {"job_id": "12 13"}, "job_id"),
        ("a list for a job id", {"job_id": [12]}, "job_id"),
        ("addresses that are none", {"agents": ["garbage", 3]}, "agents"),
        ("a million agents", {"agents": [f"tcp://10.9.0.2:{i % 60000 + 1}" for i in range(10**6)]}, "agents"),
        ("more agents than nodes", {"agents": ["tcp://10.9.0.2:1", "tcp://10.9.0.2:2", "tcp://10.9.0.2:3"]}, "agents"),
        ("nodes a text", {"nodes": "2"}, "nodes"),
        ("meshes a text", {"meshes": "x"}, "meshes"),
        ("a mesh of wrong types", {"meshes": [{"id": 3, "name": None, "agents": "x"}]}, "meshes"),
        ("an actor of wrong types", {"meshes": [{"id": "m", "name": "m", "actors": [{"id": 1}]}]}, "meshes"),
    ],
)
def test_a_record_that_lies_is_refused_naming_it_before_anything_runs(cfg, tmp_path, monkeypatch, what, change, says):
    key, rec = _kept_job(cfg, **change)
    calls = _slurm(tmp_path, monkeypatch, "RUNNING")
    with pytest.raises(MeshError) as e:
        SlurmJob.reattach()
    assert os.path.basename(rec) in str(e.value) and says in str(e.value), (what, e.value)
    assert [c for c in _called(calls) if not c.startswith("squeue -h -j 12 ")] == []  # nothing asked of it
    assert os.path.exists(key) and os.path.exists(rec)  # the user's file: reported, not deleted


def test_a_record_that_is_not_json_is_named(cfg, tmp_path, monkeypatch):
    _, rec = _kept_job(cfg)
    with open(rec, "w") as f:
        f.write("{garbage")
    _slurm(tmp_path, monkeypatch, "RUNNING")
    with pytest.raises(MeshError) as e:
        SlurmJob.reattach()
    assert os.path.basename(rec) in str(e.value) and "not JSON" in str(e.value), e.value


def test_records_whose_dates_are_not_numbers_are_still_listed(cfg, tmp_path, monkeypatch):
    _kept_job(cfg, job_id="12", token="a" * 16, created="yesterday")
    _kept_job(cfg, job_id="13", token="b" * 16)
    _slurm(tmp_path, monkeypatch, "RUNNING")
    with pytest.raises(MeshValueError) as e:
        SlurmJob.reattach()
    assert "several SLURM jobs are kept alive (13, 12)" in str(e.value) or "(12, 13)" in str(e.value), e.value


def test_keep_alive_inside_an_allocation_needs_a_batch_job_of_its_own(cfg, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    for use in (None, True):
        with pytest.raises(MeshValueError, match="use_allocation=False"):
            SlurmJob(nodes=1, keep_alive=True, use_allocation=use)
