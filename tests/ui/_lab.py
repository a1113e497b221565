"""Driving a notebook in the JupyterLab of ``conftest.lab`` (shared by the browser tests).

Each test starts in a workspace of its own (nothing restored from an earlier test: open notebooks, a
toggled sidebar) and keeps the notebook it drives in ``window.__jmNb``: ``shell.currentWidget``
follows the focus, which a headless page does not always give the notebook it just opened (it can
stay null after ``docmanager:open``).

Screenshots go to $JUPYTER_MESH_SCREENSHOTS when set (``docs/screenshots.sh`` keeps the README's),
else to the server's temp root; each is cropped to what it shows.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ERRORS = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"


def kernel_name() -> tuple[str, str]:
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    return ("mesh", "Python 3 (mesh)") if "mesh" in specs else ("python3", "Python 3 (ipykernel)")


def notebook(path: Path, cells: list[str], kernel: tuple[str, str] | None = None) -> None:
    name, display = kernel or kernel_name()
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
                    for c in cells
                ],
                "metadata": {"kernelspec": {"name": name, "display_name": display, "language": "python"}},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )


def start(page, lab, path: str) -> None:
    """A fresh workspace (named after the notebook) with the notebook ``path`` open, its kernel idle."""
    from playwright.sync_api import Error

    page.goto(f"{lab.url}/lab/workspaces/{path.split('.')[0]}?reset&token={lab.token}")
    deadline = time.monotonic() + 60
    while True:
        try:
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
            # plugins register their commands after the splash goes
            if page.evaluate("() => !!window.jupyterapp && window.jupyterapp.commands.hasCommand('docmanager:open')"):
                open_notebook(page, path)
                return
        except Error as e:
            # while the workspace resets, a request can be cut short ("Failed to fetch") or the page
            # reloaded under the call ("Execution context was destroyed"): try again
            if "Failed to fetch" not in str(e) and "context was destroyed" not in str(e):
                raise
        assert time.monotonic() < deadline, "JupyterLab never opened " + path
        time.sleep(0.2)


def open_notebook(page, path: str) -> None:
    """Open (or bring forward) ``path`` and drive it from now on; waits until its kernel is idle."""
    page.evaluate(
        """async p => { const app = window.jupyterapp;
                        const w = await app.commands.execute('docmanager:open', {path: p});
                        window.__jmNb = w; app.shell.activateById('jupyter-mesh-sidebar'); app.shell.activateById(w.id); }""",
        path,
    )
    page.wait_for_function(
        """p => { const w = window.__jmNb; return w && w.context.path === p
                     && w.sessionContext.session && w.sessionContext.session.kernel
                     && w.sessionContext.session.kernel.status === 'idle'; }""",
        arg=path,
        timeout=60_000,
    )


def run_cell(page, index: int, timeout: float = 60_000, allow_tracebacks: bool = True) -> None:
    """Run cell ``index`` and wait until it has run (its execution count is a new one) and the kernel is
    idle. ``allow_tracebacks=False``: fail if the cell shows a traceback."""
    before = page.evaluate("i => window.__jmNb.content.widgets[i].model.executionCount", index)
    page.evaluate(
        """i => { const nb = window.__jmNb; window.jupyterapp.shell.activateById(nb.id);
                  nb.content.activeCellIndex = i;
                  return window.jupyterapp.commands.execute('notebook:run-cell'); }""",
        index,
    )
    page.wait_for_function(
        """([i, before]) => { const nb = window.__jmNb; const n = nb.content.widgets[i].model.executionCount;
                  return n !== null && n !== before && nb.sessionContext.session.kernel.status === 'idle'; }""",
        arg=[index, before],
        timeout=timeout,
    )
    if not allow_tracebacks:
        errors = cell(page, index).locator(ERRORS).all_inner_texts()
        assert not [e for e in errors if "Traceback" in e], errors


def output(page, index: int) -> str:
    return page.evaluate(
        "i => window.__jmNb.content.widgets[i].node.querySelector('.jp-OutputArea').innerText",
        index,
    )


def cell(page, index: int):
    """A locator for cell ``index`` of the notebook driven."""
    node_id = page.evaluate("() => window.__jmNb.id")
    return page.locator(f"[id='{node_id}'] .jp-Notebook .jp-Cell").nth(index)


def notebook_panel(page):
    return page.locator(f"[id='{page.evaluate('() => window.__jmNb.id')}']")


def notebook_parts(page) -> tuple:
    """What a screenshot of the notebook shows: its toolbar (with the kernel's name) and its cells."""
    panel = notebook_panel(page)
    return panel.locator(".jp-Toolbar").first, panel.locator(".jp-Notebook .jp-Cell")


def sidebar_parts(page) -> tuple:
    """The notebook's parts and what the sidebar holds (not the empty space below)."""
    return (*notebook_parts(page), page.locator("#jupyter-mesh-sidebar .jm-sidebar-body"))


def shot(page, lab, name: str, *parts, within=None, pad: int = 6) -> Path:
    """A screenshot of the page cropped to the box around ``parts`` (locators, each of one or more
    elements; the whole page if none), and to ``within``'s box (a locator) when given."""
    d = Path(os.environ.get("JUPYTER_MESH_SCREENSHOTS") or lab.root)
    d.mkdir(parents=True, exist_ok=True)
    clip = None
    if parts:
        boxes = [b for p in parts for e in p.all() if (b := e.bounding_box(timeout=5_000))]
        assert boxes, f"nothing to show in {name}"
        view = page.viewport_size or {"width": 1440, "height": 900}
        frame = {"x": 0, "y": 0, **view}
        if within is not None:
            frame = within.bounding_box(timeout=5_000) or frame
        x0 = max(0, frame["x"], min(b["x"] for b in boxes) - pad)
        y0 = max(0, frame["y"], min(b["y"] for b in boxes) - pad)
        x1 = min(view["width"], frame["x"] + frame["width"], max(b["x"] + b["width"] for b in boxes) + pad)
        y1 = min(view["height"], frame["y"] + frame["height"], max(b["y"] + b["height"] for b in boxes) + pad)
        clip = {"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0}
    page.screenshot(path=str(d / name), clip=clip)
    assert (d / name).stat().st_size > 3_000
    return d / name
