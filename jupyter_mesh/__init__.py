"""jupyter_mesh: drive meshes of processes and actors from one Python program (or Jupyter kernel).

Public API (Monarch-compatible where they overlap)::

    from jupyter_mesh import Actor, endpoint, this_host, current_rank

Importing this package imports neither ZeroMQ, torch, IPython nor ucxx; the runtime starts on first use.
"""

import sys as _sys
import types as _types
from collections.abc import Callable
from typing import Any

from . import config as config
from ._api.adverbs import Accumulator, send
from ._api.host_mesh import HostMesh
from ._api.mesh import ActorMesh, MeshEndpoint, ProcMesh
from ._api.mesh import set_renderer as _set_renderer
from ._api.session import shutdown, shutdown_context
from ._api.tensor_engine import fetch_shard, remote
from ._core import value_mesh as _value_mesh_module
from ._core.actor import Actor, Endpoint, concurrent_endpoint, current_rank, endpoint
from ._core.future import Future
from ._core.instance import Context, context, current_actor_name, current_size
from ._core.ports import Channel, Port, PortReceiver
from ._core.shape import Extent, Point, Shape, Slice
from ._core.state import HostInfo, HostState, MeshEvent, MeshState, ProcState, RankState
from ._core.value_mesh import ValueMesh
from ._data.buffer import RDMABuffer, get_rdma_backend, is_ibverbs_available
from ._version import __version__ as __version__
from .errors import (
    ActorError,
    DeliveryError,
    Failure,
    MeshCancelledError,
    MeshClosedError,
    MeshDeadlockError,
    MeshError,
    MeshFailure,
    MeshInterrupted,
    MeshTimeoutError,
    MeshValueError,
    ProtocolError,
    ReduceError,
    RemoteFailure,
    SerializationError,
    SupervisionError,
)
from .jobs import (
    AttachJob,
    JobState,
    LocalJob,
    ProcessJob,
    SlurmJob,
    TorchXJob,
    attach_to_workers,
    default_bootstrap_cmd,
    get_or_spawn_controller,
    hosts_from_config,
    this_host,
    this_proc,
)


def _render(mesh: ProcMesh) -> dict[str, Any]:
    from .ui.widget import mimebundle  # on first display: importing jupyter_mesh stays light

    return mimebundle(mesh)


def _render_values(vm: ValueMesh[Any]) -> str:
    from .ui.values import value_mesh_html

    return value_mesh_html(vm)


_set_renderer(_render)
_value_mesh_module.html_renderer = _render_values


class _Facade(_types.ModuleType):
    """``jupyter_mesh.unhandled_fault_hook = f`` (Monarch's way to handle failures nobody waited for)
    installs ``f``: the runtime reads it when such a failure comes, not at import."""

    @property
    def unhandled_fault_hook(self) -> Callable[[MeshFailure], object]:
        from ._runtime import hooks

        return hooks.monarch_fault_hook()

    @unhandled_fault_hook.setter
    def unhandled_fault_hook(self, hook: Callable[[MeshFailure], object] | None) -> None:
        from ._runtime import hooks

        hooks.set_monarch_fault_hook(hook)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled by name, as any module (cloudpickle needs it)
        import importlib

        return (importlib.import_module, (self.__name__,))


_sys.modules[__name__].__class__ = _Facade


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext jupyter_mesh`` in any IPython kernel: the %mesh magics and notebook output routing."""
    from .notebook import load_ipython_extension as load

    load(ipython)
    kernel = getattr(ipython, "kernel", None)
    if kernel is not None:  # and the JupyterLab sidebar, for this plain kernel too
        from .ui import install

        install(kernel, name="python", announce=True)


__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "AttachJob",
    "Channel",
    "Context",
    "DeliveryError",
    "Endpoint",
    "Extent",
    "Failure",
    "Future",
    "HostInfo",
    "HostMesh",
    "HostState",
    "JobState",
    "LocalJob",
    "MeshCancelledError",
    "MeshClosedError",
    "MeshDeadlockError",
    "MeshEndpoint",
    "MeshError",
    "MeshEvent",
    "MeshFailure",
    "MeshInterrupted",
    "MeshState",
    "MeshTimeoutError",
    "MeshValueError",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "ProcState",
    "ProcessJob",
    "ProtocolError",
    "RDMABuffer",
    "RankState",
    "ReduceError",
    "RemoteFailure",
    "SerializationError",
    "Shape",
    "Slice",
    "SlurmJob",
    "SupervisionError",
    "TorchXJob",
    "ValueMesh",
    "attach_to_workers",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "endpoint",
    "fetch_shard",
    "get_or_spawn_controller",
    "get_rdma_backend",
    "hosts_from_config",
    "is_ibverbs_available",
    "remote",
    "send",
    "shutdown",
    "shutdown_context",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]
