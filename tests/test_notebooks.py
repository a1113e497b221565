"""The example notebooks execute with nbclient on the real `mesh` kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
from _kernel import isolate_jupyter_dirs

from jupyter_mesh.notebook.headless import execute, render

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def test_quickstart_runs_headless():
    isolate_jupyter_dirs()
    nb = execute(str(NOTEBOOKS / "quickstart.ipynb"), timeout=60)
    errors = [
        (c.source, o.ename) for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    # exactly the two failures the notebook shows on purpose
    assert [e for _, e in errors] == ["ActorError", "SupervisionError"], errors
    text = render(nb, color=False)
    assert "mesh 'procs' is up: {'hosts': 1, 'gpus': 4}" in text
    assert "[gpus 0-3] epoch done, lr 0.1" in text  # folded across ranks
    assert "ValueMesh({hosts: 1, gpus: 4}, {hosts=0,gpus=0: 0, hosts=0,gpus=1: 1, hosts=0,gpus=2: 4" in text
    assert "remote traceback: trainer.fail_if on [hosts=0,gpus=3]" in text
    assert "respawned ranks [1]" in text
    assert "stopped: procs" in text


def test_debugging_runs_headless():
    isolate_jupyter_dirs()
    nb = execute(str(NOTEBOOKS / "debugging.ipynb"), timeout=60)
    errors = [o.ename for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == [], errors
    text = render(nb, color=False)
    assert "3 paused" in text, text
    assert "trainers  procs  hosts=0,gpus=2" in text, text
    assert "--- trainers on procs hosts=0,gpus=1 ---\n1.5" in text, text
    assert "continued trainers on procs hosts=0,gpus=2" in text, text
