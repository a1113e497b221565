"""Issue 15 in a real JupyterLab in Chromium: a rank paused in ``breakpoint()`` is highlighted in the
sidebar with where it stopped; Stacks shows the mesh's folded stacks; Attach opens a console bound to
its pdb (``p x`` prints the value) while the cell awaiting the call runs, and ``continue`` closes it and
the call returns. The widget says where the ranks of the long call are. Leaves debug-attach.png."""

from __future__ import annotations

import pytest
from _lab import notebook, notebook_parts, output, run_cell, shot, start

pytestmark = [pytest.mark.ui, pytest.mark.timeout(240)]

ACTORS = """from jupyter_mesh import Actor, endpoint, ui
from jupyter_mesh.config import configure

class Stopper(Actor):
    @endpoint
    def stop_here(self, x):
        breakpoint()
        return x + 1

s = dbg.spawn('s', Stopper)
s.initialized.get(30)
configure(slow_call_after=1)"""


def test_paused_rank_attach_continue_and_stacks(page, lab):
    notebook(
        lab.root / "debug.ipynb",
        [
            "%mesh up --gpus 2 --name dbg",
            ACTORS,
            "ui.widget(dbg)",
            # awaited: nothing prompts in the cell (a .get() would), the sidebar is the way in
            "x = await s.slice(gpus=1).stop_here.call_one(41)\nprint('returned', x)",
        ],
    )
    start(page, lab, "debug.ipynb")
    for i in range(3):
        run_cell(page, i, allow_tracebacks=False)
    side = page.locator("#jupyter-mesh-sidebar section.jm-mesh[data-mesh='dbg']")
    side.locator(".jm-cell[data-state='idle']").nth(1).wait_for(timeout=20_000)
    # not waited for: the cell runs until the paused rank continues
    page.evaluate("""() => { const nb = window.__jmNb; window.jupyterapp.shell.activateById(nb.id);
                             nb.content.activeCellIndex = 3;
                             void window.jupyterapp.commands.execute('notebook:run-cell'); }""")

    # highlighted: the paused rank, and a line saying where, with Attach
    side.locator(".jm-cell[data-rank='1'][data-state='paused']").wait_for(timeout=30_000)
    paused = side.locator(".jm-paused-rank[data-rank='1']")
    paused.wait_for(timeout=5_000)
    assert "paused at In[2]:" in paused.inner_text(), paused.inner_text()  # the cell, as the notebook names it
    assert side.locator(".jm-paused-rank").count() == 1
    # the widget: the long call's rank left, paused (slow_call_after=1)
    widget = page.locator(".jp-OutputArea .jm-widget")
    widget.locator(".jm-waits li[data-rank='1']", has_text="paused at").wait_for(timeout=20_000)

    # Stacks: the mesh's folded stacks, in the bottom panel (the kernel is busy with the await)
    side.locator("button[data-action='stacks']").click()
    stacks = page.locator(".jm-stacks pre[data-state='ok']")
    stacks.wait_for(timeout=20_000)
    text = stacks.inner_text()
    assert "stacks of 'dbg' (2 ranks)" in text and "stop_here" in text, text

    # Attach: a console on rank 1's pdb
    paused.locator("button[data-action='attach']").click()
    panel = page.locator(".jm-pdb")
    panel.wait_for(timeout=10_000)
    panel.locator(".jm-pdb-head", has_text="paused at").wait_for(timeout=20_000)
    line = panel.locator(".jm-pdb-input input")
    line.fill("p x * 2")
    line.press("Enter")
    # its answer, after the command (the attach output may hold an 82 of its own: a line number), and
    # the input enabled again (it is disabled while a command runs, and ignores keys then)
    page.wait_for_function(
        """() => { const out = document.querySelector('.jm-pdb .jm-pdb-out').textContent;
                   const input = document.querySelector('.jm-pdb .jm-pdb-input input');
                   const at = out.lastIndexOf('(Pdb) p x * 2');
                   return at >= 0 && out.slice(at).includes('82') && !input.disabled; }""",
        timeout=20_000,
    )
    line.press("ArrowUp")  # the last command again
    assert line.input_value() == "p x * 2"
    line.fill("")
    shot(
        page,
        lab,
        "debug-attach.png",
        *notebook_parts(page),
        page.locator("#jupyter-mesh-sidebar .jm-sidebar-body"),
        panel,
    )

    # continue: the panel closes, the rank runs on and the awaited call returns
    line.fill("continue")
    line.press("Enter")
    panel.wait_for(state="detached", timeout=20_000)
    side.locator(".jm-cell[data-rank='1'][data-state='idle']").wait_for(timeout=20_000)
    page.wait_for_function(
        """() => window.__jmNb.content.widgets[3].model.executionCount !== null
                 && window.__jmNb.sessionContext.session.kernel.status === 'idle'""",
        timeout=30_000,
    )
    assert "returned 42" in output(page, 3)
    assert side.locator(".jm-paused-rank").count() == 0
    assert "runs on" in page.locator("#jupyter-mesh-sidebar .jm-message").inner_text()
    page.evaluate("() => window.__jmNb.sessionContext.session.kernel.shutdown()")
