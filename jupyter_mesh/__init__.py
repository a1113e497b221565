"""jupyter_mesh: drive meshes of processes and actors from one Python program (or Jupyter kernel).

Public API (Monarch-compatible where they overlap)::

    from jupyter_mesh import Actor, endpoint, this_host, current_rank

Importing this package imports neither ZeroMQ, torch, IPython nor ucxx, nor even the API: each name loads
on first use (every agent, fork server and proc starts through this file). The runtime starts on first use.
"""

from __future__ import annotations

import sys as _sys
import types as _types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._core import exit_code as _exit_code  # noqa: F401 - registers the exit code's atexit handler first
from ._core import lazy as _lazy
from ._core import slots as _slots
from ._version import __version__ as __version__

if TYPE_CHECKING:  # what type checkers and editors see; at run time each name loads on first use
    from . import config as config
    from ._api.adverbs import Accumulator, send
    from ._api.host_mesh import HostMesh
    from ._api.mesh import ActorMesh, MeshEndpoint, as_endpoint
    from ._api.proc_mesh import ProcMesh
    from ._api.session import shutdown, shutdown_context
    from ._api.tensor_engine import fetch_shard, remote
    from ._core.actor import Actor, Endpoint, concurrent_endpoint, current_rank, endpoint
    from ._core.future import Future
    from ._core.instance import Context, context, current_actor_name, current_size
    from ._core.ports import Channel, Port, PortReceiver
    from ._core.shape import Extent, Point, Shape, Slice
    from ._core.state import HostInfo, HostState, MeshEvent, MeshState, ProcState, RankState
    from ._core.value_mesh import ValueMesh
    from ._data.buffer import RDMABuffer, get_rdma_backend, is_ibverbs_available, is_rdma_available
    from .config import ChannelTransport, configure, enable_transport
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
    from .jobs.attach import AttachJob, attach_to_workers
    from .jobs.local import LocalJob, default_bootstrap_cmd, this_host
    from .jobs.process import JobState, ProcessJob, hosts_from_config
    from .jobs.singletons import get_or_spawn_controller, this_proc
    from .jobs.slurm import SlurmJob
    from .jobs.torchx import TorchXJob

# Every public name and the module it lives in, loaded on first use (PEP 562): an agent, a fork server
# or a proc starts through this file and needs none of the API's modules (asyncio, the jobs) to begin;
# a script pays only for what it names. tests/test_layers.py checks this table against the block above.
_HOME = {
    **dict.fromkeys(["Accumulator", "send"], "._api.adverbs"),
    "HostMesh": "._api.host_mesh",
    **dict.fromkeys(["ActorMesh", "MeshEndpoint", "as_endpoint"], "._api.mesh"),
    "ProcMesh": "._api.proc_mesh",
    **dict.fromkeys(["shutdown", "shutdown_context"], "._api.session"),
    **dict.fromkeys(["fetch_shard", "remote"], "._api.tensor_engine"),
    **dict.fromkeys(["Actor", "Endpoint", "concurrent_endpoint", "current_rank", "endpoint"], "._core.actor"),
    "Future": "._core.future",
    **dict.fromkeys(["Context", "context", "current_actor_name", "current_size"], "._core.instance"),
    **dict.fromkeys(["Channel", "Port", "PortReceiver"], "._core.ports"),
    **dict.fromkeys(["Extent", "Point", "Shape", "Slice"], "._core.shape"),
    **dict.fromkeys(["HostInfo", "HostState", "MeshEvent", "MeshState", "ProcState", "RankState"], "._core.state"),
    "ValueMesh": "._core.value_mesh",
    **dict.fromkeys(["RDMABuffer", "get_rdma_backend", "is_ibverbs_available", "is_rdma_available"], "._data.buffer"),
    **dict.fromkeys(["ChannelTransport", "configure", "enable_transport"], ".config"),
    **dict.fromkeys(
        [
            "ActorError",
            "DeliveryError",
            "Failure",
            "MeshCancelledError",
            "MeshClosedError",
            "MeshDeadlockError",
            "MeshError",
            "MeshFailure",
            "MeshInterrupted",
            "MeshTimeoutError",
            "MeshValueError",
            "ProtocolError",
            "ReduceError",
            "RemoteFailure",
            "SerializationError",
            "SupervisionError",
        ],
        ".errors",
    ),
    **dict.fromkeys(["AttachJob", "attach_to_workers"], ".jobs.attach"),
    **dict.fromkeys(["LocalJob", "default_bootstrap_cmd", "this_host"], ".jobs.local"),
    **dict.fromkeys(["JobState", "ProcessJob", "hosts_from_config"], ".jobs.process"),
    **dict.fromkeys(["get_or_spawn_controller", "this_proc"], ".jobs.singletons"),
    "SlurmJob": ".jobs.slurm",
    "TorchXJob": ".jobs.torchx",
}

if not TYPE_CHECKING:  # (hidden from type checkers: a module __getattr__ would make every name valid)
    __getattr__ = _lazy.loader(__name__, _HOME, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _controller_client() -> Any:
    """This program's controller's client (the controller starts now): a process that is not a proc."""
    from ._runtime.controller import Controller

    return Controller.get().client


def _render(mesh: Any) -> dict[str, Any]:
    from .ui.mesh_widget import mimebundle  # on first display: importing jupyter_mesh stays light

    return mimebundle(mesh)


def _render_values(vm: Any) -> str:
    from .ui.values import value_mesh_html

    return value_mesh_html(vm)


def _proc_mesh_from_ref(ref: Any) -> Any:
    from ._api.proc_mesh import _proc_mesh_ref

    return _proc_mesh_ref(ref, None)


def _this_proc() -> Any:
    from .jobs.singletons import this_proc

    return this_proc()


_slots.default_client = _controller_client
_slots.proc_mesh_from_ref = _proc_mesh_from_ref
_slots.this_proc = _this_proc
_slots.proc_mesh_view = _render
_slots.value_mesh_view = _render_values


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
    "ChannelTransport",
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
    "as_endpoint",
    "attach_to_workers",
    "concurrent_endpoint",
    "configure",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "fetch_shard",
    "get_or_spawn_controller",
    "get_rdma_backend",
    "hosts_from_config",
    "is_ibverbs_available",
    "is_rdma_available",
    "remote",
    "send",
    "shutdown",
    "shutdown_context",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]
