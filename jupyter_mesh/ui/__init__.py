"""Views of the mesh: a live widget, the JupyterLab sidebar's kernel end, and rich terminal output.

    from jupyter_mesh import ui
    ui.widget(procs)            # live grid of one proc mesh (or ui.widget() for all of them)
    ui.snapshot(procs)          # the same, as it is now, a table that stays so (what %mesh status shows)
    %load_ext jupyter_mesh.ui   # any IPython kernel: serve the JupyterLab sidebar
    ui.install(kernel)          # what the ``mesh`` kernel calls at start for the same

Importing this package imports neither IPython nor ipywidgets; each view imports what it needs
when it is first used. The optional dependencies come with ``pip install 'jupyter_mesh[ui]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core import lazy as _lazy

if TYPE_CHECKING:  # what type checkers read; at run time each name loads on first use (_core.lazy says why)
    from .mesh_widget import MeshTable, snapshot, widget
    from .sidebar_comm import TARGET, install

_HOME = {
    **dict.fromkeys(["TARGET", "install"], ".sidebar_comm"),
    **dict.fromkeys(["MeshTable", "snapshot", "widget"], ".mesh_widget"),
}

if not TYPE_CHECKING:
    __getattr__ = _lazy.loader(__name__, _HOME, globals())

__all__ = ["TARGET", "MeshTable", "install", "load_ipython_extension", "snapshot", "widget"]


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext jupyter_mesh.ui``: serve the sidebar from this kernel (no-op outside a kernel)."""
    kernel = getattr(ip, "kernel", None)
    if kernel is None:
        print("jupyter_mesh.ui: not running in a Jupyter kernel; use jupyter_mesh.ui.widget() or `jupyter-mesh status`")
        return
    from .sidebar_comm import install

    install(kernel, name="python", announce=True)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
