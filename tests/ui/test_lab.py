"""The views in a real JupyterLab in Chromium: a notebook brings a mesh up, the sidebar lists it and
the widget draws it; a killed proc turns failed in both, with its signal as the cause; the sidebar respawns it; the
sidebar follows the focus between notebooks. Leaves sidebar-widget.png (the README's first picture)."""

from __future__ import annotations

import time

import pytest
from _lab import kernel_name, notebook, open_notebook, run_cell, shot, sidebar_parts, start

pytestmark = [pytest.mark.ui, pytest.mark.timeout(180)]


def test_sidebar_and_widget_follow_a_live_mesh(page, lab):
    notebook(
        lab.root / "mesh.ipynb",
        [
            "%load_ext jupyter_mesh.ui\nfrom jupyter_mesh import LocalJob, ui\nui.widget()",
            "procs = LocalJob(hosts=2).host_mesh().spawn_procs(per_host={'gpus': 4}, name='trainers')",
            "import os, signal\nos.kill(procs.pids()[5], signal.SIGKILL)",
        ],
    )
    notebook(lab.root / "plain.ipynb", ["1 + 1"], kernel=("python3", "Python 3 (ipykernel)"))
    start(page, lab, "mesh.ipynb")  # the sidebar is open
    sidebar = page.locator("#jupyter-mesh-sidebar")
    if kernel_name()[0] == "python3":
        sidebar.locator("[data-phase='not-mesh']").wait_for(timeout=10_000)

    run_cell(page, 0, allow_tracebacks=False)  # %load_ext announces the sidebar channel
    sidebar.locator("[data-phase='empty']").wait_for(timeout=10_000)
    run_cell(page, 1, allow_tracebacks=False)
    side_mesh = sidebar.locator("section.jm-mesh[data-mesh='trainers']")
    widget = page.locator(".jp-OutputArea .jm-widget")
    side_mesh.locator(".jm-cell[data-state='idle']").nth(7).wait_for(timeout=10_000)
    assert side_mesh.get_attribute("data-procs") == "8"
    assert side_mesh.locator(".jm-cell").count() == 8
    widget.locator(".jm-mesh[data-mesh='trainers'] .jm-cell[data-state='idle']").nth(7).wait_for(timeout=10_000)

    # the sidebar follows the focus: a plain kernel is "not a mesh kernel", and back again
    open_notebook(page, "plain.ipynb")
    sidebar.locator("[data-phase='not-mesh']").wait_for(timeout=10_000)
    assert "not a mesh kernel" in sidebar.inner_text()
    open_notebook(page, "mesh.ipynb")
    side_mesh.locator(".jm-cell[data-state='idle']").nth(7).wait_for(timeout=10_000)

    # kill a proc: failed in both views (the waits are hang guards), with the signal as its cause
    page.evaluate("""() => { const nb = window.__jmNb; window.jupyterapp.shell.activateById(nb.id);
                             nb.content.activeCellIndex = 2;
                             return window.jupyterapp.commands.execute('notebook:run-cell'); }""")
    side_failed = side_mesh.locator(".jm-cell[data-rank='5'][data-state='failed']")
    widget_failed = widget.locator(".jm-cell[data-rank='5'][data-state='failed']")
    side_failed.wait_for(timeout=10_000)
    widget_failed.wait_for(timeout=10_000)

    # the cause on click, in both
    widget_failed.click()
    assert "SIGKILL" in widget.locator("[data-testid='jm-detail']").inner_text()
    side_failed.click()
    detail = side_mesh.locator(".jm-detail")
    assert "SIGKILL" in detail.inner_text()
    # the README's picture: the notebook (its kernel, "Python 3 (mesh)", in the toolbar) and the sidebar
    page.wait_for_function("() => window.__jmNb.sessionContext.session.kernel.status === 'idle'", timeout=30_000)
    shot(page, lab, "sidebar-widget.png", *sidebar_parts(page))

    # respawn it from the sidebar
    detail.locator("button[data-action='respawn']").click()
    side_mesh.locator(".jm-cell[data-rank='5'][data-state='idle']").wait_for(timeout=20_000)
    widget.locator(".jm-cell[data-rank='5'][data-state='idle']").wait_for(timeout=5_000)
    assert side_mesh.locator(".jm-cell[data-state='idle']").count() == 8
    page.evaluate("() => window.__jmNb.sessionContext.session.kernel.shutdown()")


def test_widget_in_notebook_7(page, lab):
    """The same widget in Notebook 7 (the classic-notebook UI served beside JupyterLab)."""
    notebook(
        lab.root / "nb7.ipynb",
        [
            "from jupyter_mesh import this_host\nprocs = this_host().spawn_procs(per_host={'gpus': 2}, name='nb7')",
            "from jupyter_mesh import ui\nui.widget(procs)",  # the live view (a ProcMesh as a value is a snapshot)
        ],
    )
    page.goto(f"{lab.url}/notebooks/nb7.ipynb?token={lab.token}")
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    # the kernel must be connected first (keys pressed while it connects may go nowhere)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    deadline = time.monotonic() + 60
    widget = page.locator(".jp-OutputArea .jm-widget .jm-mesh[data-mesh='nb7']")
    # Run > Run All Cells (keys pressed into a cell whose editor is not focused yet can run the wrong cell)
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()
    while time.monotonic() < deadline and widget.locator(".jm-cell[data-state='idle']").count() < 2:
        time.sleep(0.2)
    outputs = page.locator(".jp-Notebook .jp-OutputArea").all_inner_texts()
    prompts = page.locator(".jp-Notebook .jp-InputPrompt").all_inner_texts()
    assert widget.locator(".jm-cell[data-state='idle']").count() == 2, (prompts, outputs)
