"""Issue 16 in a real JupyterLab in Chromium: a running call shows "2/4 done" in the sidebar and the
widget (point 3); the sidebar's Stop mesh is `%mesh down` (point 5); after Run All each status cell
keeps its own state and only the widget is live, and says so (point 6); a failed rank's output opens
at its end and log panes open as a tab in the bottom panel (point 8).

Screenshots: see _lab.shot."""

from __future__ import annotations

import pytest
from _lab import notebook, notebook_panel, notebook_parts, output, run_cell, shot, sidebar_parts, start

pytestmark = [pytest.mark.ui, pytest.mark.timeout(240)]

GATE = """import os, time
from jupyter_mesh import Actor, endpoint, current_rank, ui

class Gate(Actor):
    @endpoint
    def wait(self, path, free):
        rank = current_rank().rank
        deadline = time.monotonic() + 120
        while rank not in free and not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return rank

g = {name}.spawn('g', Gate)
g.initialized.get(30)"""


def test_progress_live_and_stop_mesh_is_mesh_down(page, lab):
    marker = lab.root / "open-gate"
    notebook(
        lab.root / "progress.ipynb",
        [
            "%mesh up --gpus 4 --name lv",
            GATE.format(name="lv"),
            "ui.widget(lv)",
            f"fut = g.wait.call({str(marker)!r}, [0, 2])",
            f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nprint(list(fut.get(60).values()))",
            "%mesh status",
        ],
    )
    start(page, lab, "progress.ipynb")
    side = page.locator("#jupyter-mesh-sidebar section.jm-mesh[data-mesh='lv']")
    for i in range(3):
        run_cell(page, i)
    side.locator(".jm-cell[data-state='idle']").nth(3).wait_for(timeout=20_000)
    widget = page.locator(".jp-OutputArea .jm-widget")
    assert widget.locator("[data-testid='jm-live']").inner_text().strip().lower() == "live"

    # point 3: ranks 0 and 2 answered, 1 and 3 wait for the marker: "2/4 done" while the call runs
    run_cell(page, 3)
    for view in (side, widget):
        # a locator, not an element handle: the view redraws the bar as ranks report ("1/4 done" first)
        bar = view.locator("[data-progress='calls']", has_text="2/4 done")
        bar.wait_for(timeout=20_000)
        assert "left: 1, 3" in bar.inner_text()
        view.locator(".jm-cell[data-rank='1'][data-state='busy']").wait_for(timeout=5_000)
        view.locator(".jm-cell[data-rank='2'][data-state='idle']").wait_for(timeout=5_000)
    shot(page, lab, "progress-2-of-4.png", *sidebar_parts(page))
    run_cell(page, 4)
    assert "[0, 1, 2, 3]" in output(page, 4)
    side.locator("[data-progress='calls']").wait_for(state="detached", timeout=10_000)

    # point 5: Stop mesh in the sidebar is %mesh down: the magics see it gone and bring it up again
    side.locator("button[data-action='stop']").click()
    page.locator("#jupyter-mesh-sidebar [data-phase='empty']").wait_for(timeout=30_000)
    widget.locator(".jm-mesh.jm-stopped-mesh[data-mesh='lv']").wait_for(timeout=10_000)  # the live view follows
    run_cell(page, 5)
    assert "no mesh is up" in output(page, 5)
    run_cell(page, 0)
    assert "mesh 'lv' is up" in output(page, 0)
    side.locator(".jm-cell[data-state='idle']").nth(3).wait_for(timeout=20_000)
    shot(page, lab, "stop-then-up-again.png", *sidebar_parts(page))
    run_cell(page, 5)
    assert "4 idle" in output(page, 5)
    page.evaluate("() => window.__jmNb.sessionContext.session.kernel.shutdown()")


def test_after_run_all_each_status_cell_keeps_its_state(page, lab):
    wait_failed = (
        "import time\nfor _ in range(200):\n    if rs.state().counts()['failed']:\n        break\n"
        "    time.sleep(0.05)\n%mesh status"
    )
    notebook(
        lab.root / "runall.ipynb",
        [
            "%mesh up --gpus 2 --name rs",
            "%mesh status",
            "%mesh kill gpus=1",
            wait_failed,
            "from jupyter_mesh import ui\nui.widget(rs)",
            "%mesh down rs",
        ],
    )
    start(page, lab, "runall.ipynb")
    page.evaluate(
        """() => { window.jupyterapp.shell.activateById(window.__jmNb.id);
                   return window.jupyterapp.commands.execute('notebook:run-all-cells'); }"""
    )
    page.wait_for_function(
        """() => { const nb = window.__jmNb;
                   return nb.content.widgets.every(c => c.model.executionCount !== null)
                     && nb.sessionContext.session.kernel.status === 'idle'; }""",
        timeout=120_000,
    )
    first, later = output(page, 1), output(page, 3)
    assert "\u2014 2 idle;" in first and "1 failed" not in first and "stopped" not in first, first
    assert "\u2014 1 idle, 1 failed;" in later and "stopped" not in later, later
    assert "snapshot at" in first and "snapshot at" in later
    widget = page.locator(".jp-OutputArea .jm-widget")
    assert widget.locator("[data-testid='jm-live']").is_visible()
    widget.locator(".jm-mesh.jm-stopped-mesh[data-mesh='rs']").wait_for(timeout=10_000)  # live: it went on
    assert output(page, 1) == first and output(page, 3) == later  # the snapshots did not
    page.locator(".jp-Notebook .jp-Cell").nth(1).scroll_into_view_if_needed()
    shot(page, lab, "run-all-snapshots.png", *notebook_parts(page), within=notebook_panel(page))
    page.evaluate("() => window.__jmNb.sessionContext.session.kernel.shutdown()")


def test_failed_rank_output_opens_at_its_end_and_logs_open_in_the_bottom_panel(page, lab):
    notebook(
        lab.root / "tail.ipynb",
        [
            "%mesh up --gpus 2 --name tl\nfrom jupyter_mesh import ui\nui.widget(tl)",
            "%%mesh --on gpus=1\nfor i in range(60):\n    print(f'tick {i}', flush=True)",
            "%mesh kill gpus=1",
        ],
    )
    start(page, lab, "tail.ipynb")
    for i in range(3):
        run_cell(page, i)
    side = page.locator("#jupyter-mesh-sidebar section.jm-mesh[data-mesh='tl']")
    widget = page.locator(".jp-OutputArea .jm-widget")
    for view in (widget, side):
        failed = view.locator(".jm-cell[data-rank='1'][data-state='failed']")
        failed.wait_for(timeout=20_000)
        failed.click()
        pre = view.locator(".jm-detail pre")
        pre.wait_for(timeout=5_000)
        assert pre.inner_text().rstrip().endswith("tick 59"), pre.inner_text()[-300:]  # no %%mesh sync marker
        geo = pre.evaluate("p => [p.scrollTop, p.clientHeight, p.scrollHeight]")
        assert geo[2] > geo[1], f"the tail fits: nothing to scroll {geo}"
        assert geo[0] + geo[1] >= geo[2] - 2, f"not scrolled to the end: {geo}"
    shot(page, lab, "failed-rank-tail.png", *sidebar_parts(page))

    notebook_width = page.evaluate("() => window.__jmNb.node.clientWidth")
    side.locator(".jm-detail button", has_text="Open logs").click()
    logs = page.locator(".jm-logs")
    logs.wait_for(timeout=10_000)
    page.wait_for_function(
        "() => document.querySelector('.jm-logs pre').innerText.trimEnd().endsWith('tick 59')", timeout=20_000
    )
    where = page.evaluate(
        """() => { const s = window.jupyterapp.shell;
                   const down = Array.from(s.widgets('down')).map(w => w.id);
                   const main = Array.from(s.widgets('main')).map(w => w.id);
                   return {down, main}; }"""
    )
    assert any(i.startswith("jupyter-mesh-logs-") for i in where["down"]), where
    assert not any(i.startswith("jupyter-mesh-logs-") for i in where["main"]), where
    assert page.evaluate("() => window.__jmNb.node.clientWidth") >= notebook_width - 2
    node = logs.evaluate("n => [n.scrollTop, n.clientHeight, n.scrollHeight]")
    assert node[0] + node[1] >= node[2] - 2, f"logs not scrolled to the end: {node}"
    shot(page, lab, "logs-in-bottom-panel.png")
    page.evaluate("() => window.__jmNb.sessionContext.session.kernel.shutdown()")
