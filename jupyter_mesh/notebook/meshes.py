"""The meshes a notebook brought up with ``%mesh up``: each is a job, its proc mesh and a ``%%mesh`` executor.

Only the public API is used: a job per mesh (``LocalJob``, ``SlurmJob``, ``AttachJob``, or any scheduler
of the ``jupyter_mesh.jobs`` entry points such as ``TorchXJob``: ``%mesh down`` stops its agents too), its ``spawn_procs``, and a :class:`~.remote_exec.RemoteExec` actor on every proc.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._api.mesh import ActorMesh
from .._api.proc_mesh import ProcMesh
from .._core.state import MeshState
from ..errors import MeshValueError
from ..jobs import AttachJob, Job, LocalJob, SlurmJob
from ..jobs.registry import make_job
from .remote_exec import RemoteExec

__all__ = ["JobSpec", "MeshRegistry", "NamedMesh"]

NEAR_TIMEOUT = 60.0
"""Seconds ``%mesh up`` waits for hosts that are there already (this one, attached workers)."""
QUEUED_TIMEOUT = 300.0
"""Seconds ``%mesh up`` waits for a scheduler's job (SLURM, TorchX): it may queue first."""


@dataclass(frozen=True)
class JobSpec:
    """Where a ``%mesh up`` mesh's hosts come from: ``local``, ``slurm``, ``attach`` (agents' addresses),
    or a scheduler of the ``jupyter_mesh.jobs`` entry points (``torchx:local_cwd``) with its options."""

    kind: str = "local"
    agents: list[str] = field(default_factory=list)
    partition: str | None = None
    time: str | None = None
    scheduler_args: dict[str, str] = field(default_factory=dict)
    keep_alive: bool = False

    def job(self, hosts: int, preload: list[str] | None) -> Job:
        """``preload=None`` (no ``--preload``): each host warms up with what it has (``jobs.warm``)."""
        if self.kind == "slurm":
            return SlurmJob(
                nodes=hosts,
                partition=self.partition,
                time=self.time or "01:00:00",
                preload=preload,
                keep_alive=self.keep_alive,
                use_allocation=False if self.keep_alive else None,
            )
        if self.kind == "attach":
            return AttachJob(self.agents, preload=preload)
        if self.kind == "local":
            return LocalJob(hosts=hosts, preload=preload)
        options = {"scheduler_args": dict(self.scheduler_args)} if self.scheduler_args else {}
        return make_job(self.kind, hosts, preload, **options)


@dataclass
class NamedMesh:
    name: str
    job: Job
    procs: ProcMesh
    executor: ActorMesh[RemoteExec] | None  # None: spawned at first use (``exec_mesh``)
    hosts: int
    dim: str
    per_host: int
    preload: list[str] | None = None  # None: the warm default
    where: JobSpec = field(default_factory=JobSpec)

    def exec_mesh(self) -> ActorMesh[RemoteExec]:
        """The ``%%mesh`` executor. A mesh taken back without one (``%mesh reattach`` of a job kept
        from Python, a rank down) gets it here, once its ranks run."""
        if self.executor is None:
            self.executor = self.procs.spawn("mesh_exec", RemoteExec)
        return self.executor


class MeshRegistry:
    """Name -> :class:`NamedMesh`; the most recently brought-up mesh is the default."""

    def __init__(self) -> None:
        self._entries: dict[str, NamedMesh] = {}
        self.default: str | None = None

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[NamedMesh]:
        return list(self._entries.values())

    def get(self, name: str | None) -> NamedMesh:
        """The named mesh, or the default one; ``LookupError`` with what to do when there is none."""
        if name is None:
            if self.default is None:
                raise LookupError("no mesh is up: start one with `%mesh up` (e.g. `%mesh up --procs 4`)")
            name = self.default
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(self._entries) or "none"
            raise LookupError(f"no mesh named '{name}' (meshes up: {known}); start it with `%mesh up --name {name}`")
        return entry

    def up(
        self,
        name: str,
        hosts: int,
        dim: str,
        per_host: int,
        preload: list[str] | None,
        timeout: float | None = None,
        where: JobSpec | None = None,
    ) -> NamedMesh:
        where = where or JobSpec()
        timeout = timeout or (NEAR_TIMEOUT if where.kind in ("local", "attach") else QUEUED_TIMEOUT)
        job = where.job(hosts, preload)
        try:
            hosts_of = getattr(job, "host_mesh", None)  # every job gives one; a plugin's Job must too
            if hosts_of is None:
                raise MeshValueError(f"{job!r} gives no host_mesh(): a job for %mesh up needs one")
            procs = hosts_of().spawn_procs(per_host={dim: per_host}, name=name, timeout=timeout)
            executor = procs.spawn("mesh_exec", RemoteExec)
            assert executor.initialized is not None
            executor.initialized.get(timeout)
        except BaseException:
            job.stop()
            raise
        entry = self._entries[name] = NamedMesh(name, job, procs, executor, hosts, dim, per_host, preload, where)
        self.default = name
        return entry

    def down(self, name: str, timeout: float = 5.0) -> NamedMesh:
        entry = self._entries.pop(name)
        try:
            entry.procs.stop(timeout=timeout)
        finally:
            entry.job.stop()
        if self.default == name:
            self.default = next(reversed(self._entries), None)
        return entry

    def down_all(self, leave_kept: bool = False) -> list[NamedMesh]:
        """Stop every mesh; ``leave_kept`` (the kernel going away): a job kept alive stays, for
        ``%mesh reattach`` from the next kernel."""
        entries = list(self._entries.values())
        for e in entries:
            if leave_kept and e.job.keep_alive and e.job.running():
                del self._entries[e.name]
                continue
            try:
                self.down(e.name)
            except Exception:  # noqa: BLE001 - bring the others down anyway
                pass
        return entries

    def stopped(self) -> list[NamedMesh]:
        """Meshes whose procs were stopped (``procs.stop()``) but not taken down with ``%mesh down``."""
        return [e for e in self._entries.values() if e.procs.stopped]

    def adopt(self, entry: NamedMesh) -> None:
        """A mesh this kernel did not bring up (``%mesh reattach``)."""
        self._entries[entry.name] = entry
        self.default = entry.name

    def status_rows(self) -> list[dict[str, Any]]:
        rows = []
        for e in self._entries.values():
            st = e.procs.state()
            counts = ", ".join(f"{n} {s}" for s, n in st.counts().items() if n)
            failed = [
                f"{r.rank} ({r.failure.kind})" if r.failure else str(r.rank)
                for r in st.ranks
                if r.state.value == "failed"
            ]
            rows.append(
                {
                    "name": e.name + (" *" if e.name == self.default else ""),
                    "dims": ", ".join(f"{k}={v}" for k, v in st.sizes.items()),
                    "procs": counts,
                    "failed ranks": ", ".join(failed) or "-",
                    "hosts": _hosts_cell(st),
                    "pids": " ".join(str(r.pid) for r in st.ranks),
                }
            )
        return rows


def _hosts_cell(st: MeshState) -> str:
    """``local``; or ``SLURM job 12 (kept alive): 10.0.0.2 up, 10.0.0.3 unreachable``."""
    one_up = len(st.hosts) == 1 and st.hosts[0].state == "up"
    hosts = ", ".join(h.address if one_up else f"{h.address} {h.state}" for h in st.hosts)
    job = st.job or {}
    kind, job_id = str(job.get("kind") or ""), job.get("id")
    label = {"slurm": "SLURM job", "torchx": "TorchX job", "attach": "attached", "local": "", "": ""}.get(
        kind, f"{kind} job"
    )
    label = f"{label} {job_id}" if job_id is not None else label
    if job.get("keep_alive"):
        label = f"{label or kind} (kept alive)"
    return f"{label}: {hosts}" if label and hosts else label or hosts or "-"
