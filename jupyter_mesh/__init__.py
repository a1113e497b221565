"""jupyter_mesh: drive meshes of processes and actors from one Python program (or Jupyter kernel).

Public API (Monarch-compatible where they overlap)::

    from jupyter_mesh import Actor, endpoint, this_host, current_rank

Importing this package imports neither ZeroMQ, torch, IPython nor ucxx; the runtime starts on first use.
"""

from typing import Any

from ._api.mesh import ActorMesh, HostMesh, MeshEndpoint, ProcMesh
from ._api.mesh import set_renderer as _set_renderer
from ._api.session import shutdown
from ._core import value_mesh as _value_mesh_module
from ._core.actor import Actor, Endpoint, current_rank, endpoint
from ._core.future import Future
from ._core.shape import Extent, Point, Shape, Slice
from ._core.state import HostInfo, HostState, MeshEvent, MeshState, ProcState, RankState
from ._core.value_mesh import ValueMesh
from ._data.buffer import RDMABuffer, get_rdma_backend
from ._version import __version__ as __version__
from .errors import (
    ActorError,
    DeliveryError,
    Failure,
    MeshCancelledError,
    MeshClosedError,
    MeshError,
    MeshInterrupted,
    MeshTimeoutError,
    MeshValueError,
    ProtocolError,
    RemoteFailure,
    SerializationError,
    SupervisionError,
)
from .jobs import AttachJob, LocalJob, SlurmJob, TorchXJob, attach_to_workers, this_host


def _render(mesh: ProcMesh) -> dict[str, Any]:
    from .ui.widget import mimebundle  # on first display: importing jupyter_mesh stays light

    return mimebundle(mesh)


def _render_values(vm: ValueMesh[Any]) -> str:
    from .ui.values import value_mesh_html

    return value_mesh_html(vm)


_set_renderer(_render)
_value_mesh_module.html_renderer = _render_values


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext jupyter_mesh`` in any IPython kernel: the %mesh magics and notebook output routing."""
    from .notebook import load_ipython_extension as load

    load(ipython)
    kernel = getattr(ipython, "kernel", None)
    if kernel is not None:  # and the JupyterLab sidebar, for this plain kernel too
        from .ui import install

        install(kernel, name="python", announce=True)


__all__ = [
    "Actor",
    "ActorError",
    "ActorMesh",
    "AttachJob",
    "DeliveryError",
    "Endpoint",
    "Extent",
    "Failure",
    "Future",
    "HostInfo",
    "HostMesh",
    "HostState",
    "LocalJob",
    "MeshCancelledError",
    "MeshClosedError",
    "MeshEndpoint",
    "MeshError",
    "MeshEvent",
    "MeshInterrupted",
    "MeshState",
    "MeshTimeoutError",
    "MeshValueError",
    "Point",
    "ProcMesh",
    "ProcState",
    "ProtocolError",
    "RDMABuffer",
    "RankState",
    "RemoteFailure",
    "SerializationError",
    "Shape",
    "Slice",
    "SlurmJob",
    "SupervisionError",
    "TorchXJob",
    "ValueMesh",
    "attach_to_workers",
    "current_rank",
    "endpoint",
    "get_rdma_backend",
    "shutdown",
    "this_host",
]
