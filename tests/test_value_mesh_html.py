"""A ValueMesh in a notebook: a grid along its dims, numbers as a heat map, errors in red, long values
cut short (full text on hover), everything escaped; ``repr`` unchanged for terminals."""

from __future__ import annotations

import re

import jupyter_mesh  # noqa: F401 - the facade registers the UI's renderer
from jupyter_mesh import Failure, Shape, ValueMesh
from jupyter_mesh.ui.values import MAX_CELLS, MAX_TEXT


def _vm(values, **sizes):
    return ValueMesh(Shape.from_sizes(sizes), values)


def test_numbers_are_a_heat_map_along_the_last_two_dims():
    vm = _vm([0, 1, 2, 3, 4, 5], hosts=2, gpus=3)
    out = vm._repr_html_()
    assert out is not None and "hosts=2 \u00d7 gpus=3" in out and "min 0, max 5" in out
    assert out.count("<tr>") == 3  # the column header, then hosts=0 and hosts=1
    assert "gpus=2</th>" in out and "hosts=1</th>" in out
    shades = [int(s) for s in re.findall(r"hsl\(210,80%,(\d+)%\)", out)]
    assert len(shades) == 6 and shades == sorted(shades, reverse=True)  # larger values, darker cells
    assert repr(vm).startswith("ValueMesh({hosts: 2, gpus: 3}")  # terminals keep the text


def test_errors_are_red_long_values_cut_and_everything_escaped():
    long = "x" * 200
    vm = _vm([Failure("m", {"gpus": 0}, "exit", "boom"), "<script>alert(1)</script>", long, True], gpus=4)
    out = vm._repr_html_()
    assert out is not None
    assert "color:#c62828" in out.split("<td")[1]  # the failure
    assert "<script>" not in out and "&lt;script&gt;" in out
    cell = next(c for c in out.split("<td")[1:] if "xxx" in c)
    shown = cell.split(">", 1)[1].split("</td>")[0]
    assert len(shown) == MAX_TEXT and shown.endswith("\u2026") and f'title="{long}"' in cell
    assert "hsl(" not in out  # True is no number to shade


def test_outer_dims_get_a_grid_each_and_big_meshes_are_cut():
    vm = _vm(list(range(12)), hosts=2, nodes=2, gpus=3)
    out = vm._repr_html_()
    assert out is not None and "hosts=0</div>" in out and "hosts=1</div>" in out
    big = _vm(list(range(MAX_CELLS + 10)), gpus=MAX_CELLS + 10)
    assert f"{10} more values" in (big._repr_html_() or "")
    one = ValueMesh(Shape.from_sizes({}), [42])
    assert "42" in (one._repr_html_() or "")


def test_what_a_rank_raised_in_mesh_cell_is_red_its_traceback_on_hover():
    from jupyter_mesh.notebook.remote_exec import CellError

    tb = 'Traceback (most recent call last):\n  File "<cell>", line 1\nZeroDivisionError: division by zero\n'
    vm = _vm([1, CellError("ZeroDivisionError", "division by zero", tb)], gpus=2)
    out = vm._repr_html_() or ""
    err = out.split("<td")[2]
    assert "color:#c62828" in err and ">ZeroDivisionError: division by zero</td>" in err
    assert (
        'title="ZeroDivisionError: division by zero\n\nTraceback (most recent call last):\n  File &quot;&lt;cell&gt;&quot;'
        in err
    )
