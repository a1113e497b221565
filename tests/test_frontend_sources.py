"""What the front end repeats of the Python side, checked: a literal that must stay in step fails here
when it drifts (the fix is in each failure's message)."""

from __future__ import annotations

import json
import pathlib

import pytest

import jupyter_mesh

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_one_version():
    # pyproject.toml reads __version__ (hatch's [tool.hatch.version]); npm needs a literal in package.json
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "jupyter_mesh/__init__.py"
    package = json.loads((ROOT / "package.json").read_text())
    assert package["version"] == jupyter_mesh.__version__, (
        f"package.json says {package['version']}, jupyter_mesh/__init__.py {jupyter_mesh.__version__}: "
        "change the version in both"
    )
