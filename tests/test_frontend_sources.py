"""What the front end repeats of the Python side, checked: a literal that must stay in step fails here
when it drifts (the fix is in each failure's message)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

import jupyter_mesh
from jupyter_mesh import MeshState, ProcState, RankState
from jupyter_mesh.ui import codegen
from jupyter_mesh.ui.wire import mesh_wire

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_one_version():
    # pyproject.toml reads __version__ (hatch's [tool.hatch.version]); npm needs a literal in package.json
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "jupyter_mesh/_version.py"
    package = json.loads((ROOT / "package.json").read_text())
    assert package["version"] == jupyter_mesh.__version__, (
        f"package.json says {package['version']}, jupyter_mesh/_version.py {jupyter_mesh.__version__}: "
        "change the version in both"
    )


@pytest.mark.parametrize("rel", sorted(codegen.FILES))
def test_generated_from_python(rel):
    assert codegen.ROOT == ROOT
    assert (ROOT / rel).read_text() == codegen.FILES[rel](), (
        f"{rel} is out of date: run `python -m jupyter_mesh.ui.codegen`, then `npm run build:lib`"
    )


def test_the_wire_carries_the_states_in_order():
    # the front end draws a mesh's state chips in the order of the keys of its counts
    ranks = (RankState(0, {"gpus": 0}, ProcState.FAILED), RankState(1, {"gpus": 1}, ProcState.IDLE))
    wire = json.loads(json.dumps(mesh_wire(MeshState("m", "m", {"gpus": 2}, ranks))))
    assert list(wire["counts"]) == [s.value for s in ProcState]


def test_widget_is_built_from_the_typescript():
    # jupyter_mesh/ui/static/widget.{js,css} are committed build outputs of labextension/src/grid.ts and
    # labextension/style/{states,grid}.css (the sidebar's renderer and look)
    node = shutil.which("node")
    if node is None or not (ROOT / "node_modules" / "typescript").is_dir():
        pytest.skip("needs node and node_modules/typescript (`make setup` installs them)")
    out = subprocess.run(
        [node, "labextension/build-widget.mjs", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
