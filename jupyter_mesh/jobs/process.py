"""Monarch's ``ProcessJob``: named host meshes whose hosts are local processes, for trying multi-host
programs on one machine. Here each named mesh is a :class:`LocalJob` (one agent per host)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._api.host_mesh import HostMesh
from ..errors import MeshClosedError, MeshValueError
from ._monarch import JobState
from .local import LocalJob

__all__ = ["JobState", "ProcessJob", "hosts_from_config"]


class ProcessJob:
    """``ProcessJob({"trainers": 2, "loaders": 1}, env={...})``: a host mesh per name, each of that many
    local hosts; ``env`` is added to the environment of their agents and procs."""

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None):
        for name, n in meshes.items():
            if not name.isidentifier() or not isinstance(n, int) or n < 1:
                raise MeshValueError(
                    f"ProcessJob needs {{name: hosts >= 1}} with identifier names, got {name!r}: {n!r}"
                )
        self._meshes, self._env = dict(meshes), dict(env or {})
        self._jobs: dict[str, LocalJob] | None = None
        self._killed = False

    def state(self, cached_path: Any = None) -> JobState:
        """The job's host meshes, starting its hosts on first use (``cached_path`` is accepted and unused:
        nothing outlives this program here)."""
        if self._killed:
            raise MeshClosedError("this ProcessJob was killed; create a new one")
        if self._jobs is None:
            self._jobs = {name: LocalJob(n, env=self._env) for name, n in self._meshes.items()}
        return JobState({name: job.host_mesh() for name, job in self._jobs.items()})

    def kill(self) -> None:
        """Stop every host of the job (and every proc on them)."""
        self._killed = True
        for job in (self._jobs or {}).values():
            job.stop()

    def __repr__(self) -> str:
        return f"<ProcessJob {self._meshes}>"


def hosts_from_config(name: str) -> HostMesh:
    """Monarch's stand-in for hosts named in a project's configuration: as there, two local hosts
    (a ``LocalJob``), so code written against named host meshes runs on one machine."""
    if not isinstance(name, str) or not name:
        raise MeshValueError("hosts_from_config() needs the name of a host mesh")
    return LocalJob(2).host_mesh()
