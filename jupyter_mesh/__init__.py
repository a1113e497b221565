"""jupyter_mesh: drive meshes of processes and actors from one Python program (or Jupyter kernel).

Public API (Monarch-compatible where they overlap)::

    from jupyter_mesh import Actor, endpoint, this_host, current_rank

Importing this package imports neither ZeroMQ, torch, IPython nor ucxx; the runtime starts on first use.
"""

from ._actor import Actor, current_rank, endpoint
from ._future import Future
from ._mesh import ActorMesh, HostMesh, MeshEndpoint, ProcMesh
from ._rdma import RDMABuffer, get_rdma_backend
from ._shape import Extent, Point, Shape, Slice
from ._value_mesh import ValueMesh
from .errors import (
    ActorError,
    Failure,
    MeshClosedError,
    MeshError,
    MeshTimeoutError,
    MeshValueError,
    RemoteFailure,
    SerializationError,
    SupervisionError,
)
from .jobs import LocalJob, this_host

__version__ = "0.1.0"

__all__ = [
    "Actor",
    "ActorError",
    "ActorMesh",
    "Extent",
    "Failure",
    "Future",
    "HostMesh",
    "LocalJob",
    "MeshClosedError",
    "MeshEndpoint",
    "MeshError",
    "MeshTimeoutError",
    "MeshValueError",
    "Point",
    "ProcMesh",
    "RDMABuffer",
    "RemoteFailure",
    "SerializationError",
    "Shape",
    "Slice",
    "SupervisionError",
    "ValueMesh",
    "current_rank",
    "endpoint",
    "get_rdma_backend",
    "this_host",
]
