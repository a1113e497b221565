"""The data-plane example notebook runs top to bottom in a real kernel (nbclient)."""

from __future__ import annotations

import os
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("torch")

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"


def _kernel_name() -> str:
    """The project's "mesh" kernel where it is installed, else the standard python3 kernel."""
    from jupyter_client.kernelspec import KernelSpecManager

    return "mesh" if "mesh" in KernelSpecManager().find_kernel_specs() else "python3"


@pytest.mark.notebook
@pytest.mark.timeout(240)
def test_rl_weight_sync_notebook_runs():
    nb = nbformat.read(NOTEBOOKS / "rl_weight_sync.ipynb", as_version=4)
    env_backup = os.environ.get("JUPYTER_MESH_RDMA_BACKEND")
    os.environ.pop("JUPYTER_MESH_RDMA_BACKEND", None)  # auto: the notebook shows what a user gets
    try:
        client = nbclient.NotebookClient(
            nb, kernel_name=_kernel_name(), timeout=180, resources={"metadata": {"path": str(NOTEBOOKS)}}
        )
        client.execute()
    finally:
        if env_backup is not None:
            os.environ["JUPYTER_MESH_RDMA_BACKEND"] = env_backup
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert text.count("generators in sync: True") == 5
    assert "via ['shm']" in text  # one host: one copy out of the trainer's shared memory
