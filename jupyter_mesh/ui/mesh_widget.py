"""The live mesh widget (anywidget): a grid per mesh, coloured by proc state, with counts, calls in
flight, spawn and call progress bars, and a failed proc's cause and traceback on click.

The browser never polls: the kernel pushes a new ``meshes`` trait value when the hub flushes (at
most ten times a second). Where widgets cannot render, the same state shows as an HTML table.

Live only when asked for (``ui.widget()``, which shows a "live" badge): the output of a finished
cell -- ``%mesh status``, a ``ProcMesh`` as a cell's value -- is a :func:`snapshot` of that moment,
so a saved notebook, or one run top to bottom, shows each cell's own state, not the last one.
"""

from __future__ import annotations

import pathlib
import time
from typing import TYPE_CHECKING, Any

from .hub import hub
from .table import html_table, text_table
from .wire import MeshWire

if TYPE_CHECKING:
    from .._api.proc_mesh import ProcMesh

__all__ = ["MeshTable", "mimebundle", "snapshot", "widget"]  # and MeshWidget, built on first access

_STATIC = pathlib.Path(__file__).parent / "static"


class MeshTable:
    """A snapshot rendered as HTML (notebooks) or text (terminals, logs); it says when it was taken."""

    def __init__(self, meshes: list[MeshWire], taken: float | None = None):
        self.meshes = meshes
        self.taken = time.time() if taken is None else taken

    def caption(self) -> str:
        return f"snapshot at {time.strftime('%H:%M:%S', time.localtime(self.taken))}; ui.widget() shows it live"

    def _repr_html_(self) -> str:
        return f"<div class='jm-snapshot' style='font-size:90%;color:#666'>{self.caption()}</div>\n" + html_table(
            self.meshes
        )

    def __repr__(self) -> str:
        return text_table(self.meshes)


def _widget_class() -> type:
    import anywidget
    import traitlets

    class MeshWidget(anywidget.AnyWidget):  # type: ignore[misc]
        """Live view of one proc mesh (``mesh_id``) or of every mesh of the kernel (``mesh_id=""``)."""

        # built from the sidebar's renderer (labextension/src/grid.ts, style/) and committed, so
        # the widget works without a node build: labextension/build-widget.mjs
        _esm = _STATIC / "widget.js"
        _css = _STATIC / "widget.css"
        meshes: traitlets.List[MeshWire] = traitlets.List().tag(sync=True)
        mesh_id = traitlets.Unicode("").tag(sync=True)

        def __init__(self, mesh_id: str = "", **kwargs: Any):
            h = hub()
            super().__init__(mesh_id=mesh_id, meshes=h.meshes(mesh_id or None), **kwargs)
            self._remove_view = h.add_view(self._on_update)

        def _on_update(self, changed: list[MeshWire], gone: list[str]) -> None:
            mine = [m for m in changed if not self.mesh_id or m["mesh_id"] == self.mesh_id]
            if not mine and not gone:
                return
            by_id = {m["mesh_id"]: m for m in self.meshes}
            for m in mine:
                by_id[m["mesh_id"]] = m
            for g in gone:
                by_id.pop(g, None)
            self.meshes = list(by_id.values())

        def close(self) -> None:
            self._remove_view()
            super().close()

        def _repr_mimebundle_(self, **kwargs: Any) -> Any:
            bundle = super()._repr_mimebundle_(**kwargs)
            data = bundle[0] if isinstance(bundle, tuple) else bundle
            if isinstance(data, dict):
                data["text/html"] = html_table(self.meshes)
                data["text/plain"] = text_table(self.meshes)
            return bundle

    return MeshWidget


_cls: type | None = None


def __getattr__(name: str) -> Any:
    # ``MeshWidget`` is built on first use so importing this module does not import ipywidgets
    if name == "MeshWidget":
        return _get_class()
    raise AttributeError(name)


def _get_class() -> type:
    global _cls
    if _cls is None:
        _cls = _widget_class()
    return _cls


def _widgets_usable() -> bool:
    try:
        import anywidget  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def widget(mesh: ProcMesh | str | None = None) -> Any:
    """A live widget of ``mesh`` (a ProcMesh or its mesh_id) or of every running mesh of this kernel.

    Outside a kernel, or without anywidget installed (``pip install 'jupyter_mesh[ui]'``), a static
    :class:`MeshTable` of the state right now.
    """
    mesh_id = mesh if isinstance(mesh, str) or mesh is None else mesh.state().mesh_id
    if _widgets_usable():
        return _get_class()(mesh_id or "")
    return MeshTable(hub().meshes(mesh_id))


def snapshot(mesh: ProcMesh | str | None = None) -> MeshTable:
    """The state of ``mesh`` (or of every running mesh) now, as a table that stays as it is: what a
    finished cell shows (``%mesh status``, a ProcMesh as a cell's value)."""
    mesh_id = mesh if isinstance(mesh, str) or mesh is None else mesh.state().mesh_id
    return MeshTable(hub().meshes(mesh_id))


def mimebundle(mesh: ProcMesh) -> dict[str, Any]:
    """A ProcMesh's rich repr: a snapshot (``ui.widget(procs)`` is the live view); its repr as plain text."""
    view = snapshot(mesh)
    return {"text/html": view._repr_html_(), "text/plain": f"{mesh!r}\n{view!r}"}
