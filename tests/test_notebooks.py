"""The example notebooks execute with nbclient on the real `mesh` kernel."""

from __future__ import annotations

import re
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


def test_ddp_trains_loses_a_rank_and_resumes_headless():
    """notebooks/ddp.ipynb: DDP (gloo, CPU) by an unmodified torchrun script on 4 procs through
    %mesh torchrun; rank 2 killed mid-training, respawned, the run resumed from the last checkpoint."""
    isolate_jupyter_dirs()
    nb = execute(str(NOTEBOOKS / "ddp.ipynb"), timeout=120)
    errors = [o.ename for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == ["SupervisionError"], errors  # the run that lost rank 2, and nothing else
    text = render(nb, color=False)
    for rank in range(4):
        assert f"[gpus={rank}] rank {rank} of 4, local rank {rank}, pid" in text
    assert "[gpus=0] epoch 1: mean loss" in text and text.count("4 ranks finished (gpus 0-3)") == 2
    assert "[hosts=0,gpus=2] proc" in text and "killed by SIGKILL (killed on request)" in text
    assert "respawned ranks [2]" in text
    resumed = re.search(r"\[gpus=0\] resuming from epoch-(\d{3})\.pt", text)
    assert resumed and 2 <= int(resumed.group(1)) < 7, text
    assert "[gpus=0] epoch 7: mean loss" in text and "'epoch-007.pt'" in text
    assert "stopped: procs" in text
