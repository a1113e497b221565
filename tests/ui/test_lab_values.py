"""Issue 16 point 9 in a real JupyterLab in Chromium: a ValueMesh as a cell's value is a grid along its
dims (hosts as rows, gpus as columns), numbers shaded as a heat map, what a rank raised in red (its traceback on hover), a long
value cut with its full text on hover, nothing un-escaped. Leaves value-mesh.png (see _lab.shot)."""

from __future__ import annotations

import re

import pytest
from _lab import cell, notebook, run_cell, shot, start

from jupyter_mesh.ui.values import MAX_TEXT

pytestmark = [pytest.mark.ui, pytest.mark.timeout(180)]

# one %%mesh call on 2 hosts x 3 gpus: three numbers, a long list, markup, and a rank that raises
CALL = """%%mesh
rank = current_rank().rank
if rank == 5:
    raise ValueError('rank 5 ran out of data')
[0.25, 1.5, 3.0, list(range(40)), '<b>x</b>'][rank]"""


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", css)[:3])


def test_a_value_mesh_is_a_grid_along_its_dims(page, lab):
    notebook(lab.root / "values.ipynb", ["%mesh up --hosts 2 --gpus 3 --name vm", CALL, "%mesh down vm"])
    start(page, lab, "values.ipynb")
    run_cell(page, 0, allow_tracebacks=False)
    run_cell(page, 1)
    out = cell(page, 1).locator(".jp-OutputArea-output[data-mime-type='text/html']")
    out.wait_for(timeout=10_000)
    assert "ValueMesh hosts=2 \u00d7 gpus=3" in out.inner_text()
    assert "1 of 6 ranks raised" in cell(page, 1).locator(".jp-OutputArea").inner_text()  # said beside it
    table = out.locator("table")
    assert table.count() == 1

    # the grid: a header row (gpus=0..2), then one row per host, each with its label and 3 values
    rows = table.locator("tr")
    assert rows.count() == 3
    assert [t.strip() for t in rows.nth(0).locator("th").all_inner_texts()] == ["", "gpus=0", "gpus=1", "gpus=2"]
    cells = []
    for r in (1, 2):
        assert rows.nth(r).locator("th").inner_text().strip() == f"hosts={r - 1}"
        tds = rows.nth(r).locator("td")
        assert tds.count() == 3
        cells += [tds.nth(c) for c in range(3)]
    assert table.locator("td").count() == 6

    def style(loc, prop: str) -> str:
        return loc.evaluate("(el, p) => getComputedStyle(el)[p]", prop)

    # numbers: a heat map (larger, darker), their text as written
    assert [c.inner_text().strip() for c in cells[:3]] == ["0.25", "1.5", "3.0"]
    shades = [sum(_rgb(style(c, "backgroundColor"))) for c in cells[:3]]
    assert shades[0] > shades[1] > shades[2], shades
    for c in cells[3:]:  # no number, no shade
        assert style(c, "backgroundColor") in ("rgba(0, 0, 0, 0)", "transparent")

    # a long value: cut to MAX_TEXT characters, the full text on hover
    full = repr(list(range(40)))
    shown = cells[3].inner_text().strip()
    assert len(shown) == MAX_TEXT and shown.endswith("\u2026") and full.startswith(shown[:-1])
    assert cells[3].get_attribute("title") == full

    # markup is text: '<b>x</b>' shows as such and makes no element
    assert cells[4].inner_text().strip() == "<b>x</b>"
    assert cells[4].get_attribute("title") == "<b>x</b>"
    assert out.locator("b", has_text="x").count() == 0 and cells[4].locator("*").count() == 0

    # what rank 5 raised: red
    red = _rgb(style(cells[5], "color"))
    assert red[0] > 150 and red[1] < 80 and red[2] < 80, red
    assert cells[5].inner_text().strip() == "ValueError: rank 5 ran out of data"
    assert "Traceback" in cells[5].get_attribute("title")  # its traceback on hover

    cells[3].hover()  # the pointer on the long value (the tooltip itself is the browser's, not in a screenshot)
    shot(page, lab, "value-mesh.png", cell(page, 1))
    run_cell(page, 2, allow_tracebacks=False)
    page.evaluate("() => window.__jmNb.sessionContext.session.kernel.shutdown()")
