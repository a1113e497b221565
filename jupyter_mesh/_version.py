"""The version of jupyter_mesh, in one place (pyproject.toml reads it; a test checks package.json)."""

__version__ = "0.1.0"
