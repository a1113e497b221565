"""A mesh of hosts (``HostMesh``): what a job gives; ``spawn_procs`` starts proc meshes on it, and
``stop`` / ``shutdown`` end what it started (Monarch's lifecycle)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import config
from .._core.future import Future
from .._core.shape import Shape
from ..errors import MeshClosedError, MeshError, MeshValueError
from .mesh import _MeshTrait, _names, _owned_by_caller
from .proc_mesh import ProcMesh
from .proc_setup import ProcSetup, check_proc_bind

if TYPE_CHECKING:
    from .._runtime.controller import Controller

__all__ = ["HostMesh"]

singleton_server: Callable[[Controller], dict[str, str]] | None = None
"""Set by ``jobs.singletons``: serves the program's named singletons at this controller; returns the
environment that tells new procs where to ask."""


class HostMesh(_MeshTrait):
    """Hosts with a jupyter_mesh agent on each; ``spawn_procs`` starts processes on them."""

    def __init__(self, controller: Controller, job: Any, shape: Shape):
        self._controller, self._job, self._hosts = controller, job, shape
        # what this host mesh (and its slices) spawned, for stop(); whether shutdown() ran
        self._spawned: list[ProcMesh] = []
        self._shut_down = [False]

    @property
    def _shape(self) -> Shape:
        return self._hosts

    def _with_shape(self, shape: Shape) -> HostMesh:
        view = HostMesh(self._controller, self._job, shape)
        view._spawned, view._shut_down = self._spawned, self._shut_down
        return view

    def spawn_procs(
        self,
        per_host: Mapping[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        proc_bind: list[dict[str, str]] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        preload: list[str] | tuple[str, ...] = (),
        timeout: float = 60.0,
        bootstrap_command: Any = None,
        warm: bool = True,
    ) -> ProcMesh:
        """Start ``per_host`` procs on every host: the mesh has the host dims plus the per-host dims.

        ``preload`` modules are imported once in the host's template process, so each proc starts
        with them already loaded (``preload=["torch"]`` makes spawns ~30 ms instead of seconds; a local
        host preloads torch by default, see ``jobs.warm``).
        ``bootstrap`` (Monarch's): a function (or ``async def``) run once on every proc before this returns;
        ``proc_bind`` (Monarch's): per proc of a host, its CPUs (``cpus``) or NUMA nodes (``cpunodebind``).
        Settings made with ``jupyter_mesh.config.configure`` travel to the new procs.
        ``bootstrap_command`` (Monarch's, ``default_bootstrap_cmd().with_env({...})``): its environment is the
        new procs'.
        ``warm=False``: if the host's warm imports (torch...: ``jobs.warm``) still run, fork at once without
        them rather than wait (milliseconds instead of seconds, for actors that need none of them; each
        proc that imports torch itself later pays its import). Later spawns still fork warm.
        """
        self._check_up()
        if bootstrap_command is not None:
            env = {**bootstrap_command.proc_env(), **(env or {})}
        per_host = dict(per_host or {"procs": 1})
        check_proc_bind(proc_bind, per_host)
        clash = [d for d in per_host if d in self._shape.labels]
        if clash:
            raise MeshValueError(f"per_host dims {clash} clash with the host mesh dims {list(self._shape.labels)}")
        shape = Shape.from_sizes({**dict(self._shape.extent), **per_host})
        ref = self._controller.spawn_procs(
            self._job,
            host_indices=self._shape.ranks(),
            shape=shape,
            name=name or f"procs{next(_names)}",
            env={
                **config.for_procs(),
                **(singleton_server(self._controller) if singleton_server else {}),
                **(env or {}),
            },
            preload=list(preload),
            timeout=timeout,
            host_dims=len(self._shape.labels),
            warm=warm,
        )
        procs = ProcMesh(self._controller, ref, host_mesh=self)
        self._spawned.append(procs)
        _owned_by_caller("procs", procs)
        if bootstrap is not None or proc_bind:
            setup = procs.spawn("proc_setup", ProcSetup, proc_bind, len(self._shape.labels), bootstrap)
            try:
                setup.run.call().get(timeout)
            except MeshError as e:  # as in Monarch: ``procs.initialized`` raises it
                procs._boot_error = e
        return procs

    def _check_up(self) -> None:
        if self._shut_down[0]:
            raise MeshClosedError("HostMesh has already been shut down; get a new one from its job (or this_host())")

    @property
    def is_fake_in_process(self) -> bool:
        """Monarch's: whether the hosts are simulated in this process. Ours are real processes."""
        return False

    @property
    def initialized(self) -> Future[bool]:
        """Monarch's: a future of True once every host's agent is up."""
        fut: Future[bool] = Future("host mesh start")
        try:
            self._job.agents(60.0)
        except BaseException as e:  # noqa: BLE001 - the future carries it
            fut._set_exception(e)
        else:
            fut._set_result(True)
        return fut

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """Monarch's: procs run by another interpreter. Ours fork from the host agent's own template, so
        only the interpreter the agents run (this program's) can be used."""
        import os
        import sys

        if os.path.realpath(python_executable) != os.path.realpath(sys.executable):
            raise MeshValueError(
                f"procs fork from the host agent, which runs {sys.executable}; to use {python_executable}, "
                "run this program with it"
            )
        return self

    def stop(self, *, timeout: float = 10.0) -> Future[None]:
        """Stop every proc mesh spawned from this host mesh (as ``ProcMesh.stop``; others on the same
        hosts, spawned from another HostMesh of the job, go on), keeping the hosts (agents) for new
        ones. Done when this returns; the Future is Monarch's."""
        for procs in self._spawned:
            if not procs.stopped:
                self._controller.stop_procs(procs._ref, timeout)
        self._spawned.clear()
        return Future.completed(None, "stop of a host mesh")

    def shutdown(self, *, timeout: float = 10.0) -> Future[None]:
        """Stop its proc meshes, then its hosts' agents: the hosts cannot be used any more (a new
        ``this_host()`` starts a fresh agent). Done when this returns; the Future is Monarch's."""
        self._check_up()
        self.stop(timeout=timeout)
        self._job.stop()
        self._shut_down[0] = True
        return Future.completed(None, "shutdown of a host mesh")

    async def __aenter__(self) -> HostMesh:
        self._check_up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._shut_down[0]:
            self.shutdown()

    def __repr__(self) -> str:
        return f"<HostMesh {self._shape}>"
