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
