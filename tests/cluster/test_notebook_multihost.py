"""notebooks/multi_host.ipynb runs on the `mesh` kernel against the real SLURM over namespace hosts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_mesh.notebook.headless import execute, render

pytestmark = [
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "multi_host.ipynb"


def test_the_multi_host_notebook_runs_on_slurm(netns_hosts, slurm, tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _kernel import isolate_jupyter_dirs

    isolate_jupyter_dirs()
    cfg = tmp_path / "cfg"
    monkeypatch.setenv("JUPYTER_MESH_CONFIG_DIR", str(cfg))
    for k, v in slurm.env.items():
        monkeypatch.setenv(k, v)
    nb = execute(str(NOTEBOOK), timeout=240)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    text = render(nb, color=False)
    assert not errors, text
    assert "mesh 'procs' is up: {'hosts': 2, 'gpus': 2}" in text, text
    assert "['n0', 'n1']" in text, text  # four ranks over two nodes
    assert "n0" in text and "n1" in text
    assert slurm.job_ids() == []  # %mesh down cancelled the job
    assert not [n for n in os.listdir(cfg / "jobs") if not n.endswith(".log")]


def test_a_second_kernel_reattaches_to_a_kept_slurm_job_and_its_actors(netns_hosts, slurm, tmp_path, monkeypatch):
    """Kernel A brings a mesh up on SLURM with --keep-alive and shuts down (a restart); kernel B takes
    the job back with %mesh reattach: the proc mesh and the actor mesh are bound again, the actors'
    state is kept, %%mesh works, and %mesh down ends the job."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _kernel import Kernel, isolate_jupyter_dirs

    isolate_jupyter_dirs()
    cfg = tmp_path / "cfg"
    monkeypatch.setenv("JUPYTER_MESH_CONFIG_DIR", str(cfg))
    for k, v in slurm.env.items():
        monkeypatch.setenv(k, v)
    counter_cls = (
        "from jupyter_mesh import Actor, endpoint\n"
        "class Counter(Actor):\n"
        "    def __init__(self):\n"
        "        self.n = 0\n"
        "    @endpoint\n"
        "    def incr(self):\n"
        "        self.n += 1\n"
        "        return self.n\n"
    )
    a = Kernel()
    try:
        up = a.ok("%mesh up --slurm --hosts 2 --procs 1 --keep-alive", timeout=240)
        assert "outlives this kernel" in up.stream(), up.stream()
        a.ok(counter_cls)
        a.ok("counter = procs.spawn('counter', Counter)\nfor _ in range(3): counter.incr.call().get(60)")
    finally:
        a.shutdown()
    [job_id] = slurm.job_ids()  # the kernel is gone, its job is not
    b = Kernel()
    try:
        again = b.ok("%mesh reattach", timeout=120)
        text = again.stream()
        assert f"reattached SLURM job {job_id} (2 hosts: 10.213.0." in text and "bound: procs, counter" in text, text
        got = b.ok("print(list(counter.incr.call().get(60).values()))")
        assert "[4, 4]" in got.stream(), got.stream()  # the same actors, their state kept
        cell = b.ok("%%mesh\nimport os\nos.environ.get('SLURMD_NODENAME')")
        assert "n0" in (cell.result or "") and "n1" in (cell.result or ""), cell.result
        b.ok("%mesh down")
    finally:
        b.shutdown()
    assert slurm.job_ids() == []
    assert not [n for n in os.listdir(cfg / "jobs") if not n.endswith(".log")]
