"""What the views of a mesh are sent: JSON-able snapshots and the sidebar's comm messages.

One snapshot format feeds the widget (a synced trait), the JupyterLab sidebar (comm messages) and
``jupyter-mesh status`` (which asks a kernel over the same comm), so the three views cannot drift.
The TypeScript twins of these types live in ``labextension/src/wire.ts``; keep them in step (its
``ProcState`` is generated: ``python -m jupyter_mesh.ui.codegen``).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal, TypedDict, Union

from .._core.state import HostState, MeshState, ProcState
from ..errors import Failure
from ..notebook.output import SYNC_PREFIX

__all__ = [
    "HOST_STATES",
    "STATES",
    "ActionName",
    "ActionRequest",
    "ActionResult",
    "CallsWire",
    "FailureWire",
    "FrontMessage",
    "HostWire",
    "JobWire",
    "KernelMessage",
    "MeshWire",
    "Progress",
    "RankWire",
    "RefreshRequest",
    "SnapshotMessage",
    "UpdateMessage",
    "WaitWire",
    "cell_names",
    "failure_wire",
    "job_wire",
    "mesh_wire",
    "user_lines",
]

STATES: tuple[str, ...] = tuple(s.value for s in ProcState)
HOST_STATES: tuple[str, ...] = tuple(s.value for s in HostState)


class FailureWire(TypedDict):
    kind: str  # exit, signal, heartbeat, init, start, stopped
    detail: str
    traceback: str
    exit_code: int | None
    signal: int | None


class RankWire(TypedDict):
    rank: int
    coords: list[int]  # in the order of MeshWire.dims
    state: str  # one of STATES
    inflight: int
    pid: int | None
    failure: FailureWire | None
    note: str  # why it is slow to answer: "initializing 'trainer' (42 s)", "busy in native code"; or ""
    busy_since: float | None  # since when it is busy (epoch seconds: views show a time that stays true)
    host: int  # index into MeshWire.hosts (absent in snapshots from before hosts were sent)


class RecentFailure(TypedDict):
    rank: int
    label: str  # "hosts=0,gpus=2"
    kind: str
    detail: str
    time: float


class Progress(TypedDict):
    done: int
    total: int


class WaitWire(TypedDict):
    """A rank a long call still waits on, and where it is (``ui/slow_calls.py``)."""

    rank: int
    label: str  # "gpus=2"
    where: str  # "train.py:42 in step: time.sleep(100)", "paused at In[3]:5", or why it is unknown


class CallsWire(TypedDict):
    """The calls out on a mesh: ranks done / ranks busy since none was, and which are left."""

    done: int
    total: int
    left: list[int]  # the first LEFT_MAX of them
    since: float  # when the first of them got busy (epoch seconds)
    # past ``slow_call_after``: where the ranks left are (ui/slow_calls.py); absent or None before
    waits: list[WaitWire] | None


LEFT_MAX = 64


class HostWire(TypedDict):
    index: int
    address: str  # the agent's IP, or "local" (this machine, private sockets)
    state: str  # one of HOST_STATES
    why: str  # why it is not up ("" while up)


class JobWire(TypedDict):
    """What placed the hosts (``Job.describe()``)."""

    kind: str  # local, slurm, attach, ...
    id: str | None  # the scheduler's id (SLURM job id)
    keep_alive: bool  # the job outlives this kernel


class MeshWire(TypedDict):
    mesh_id: str
    name: str
    dims: list[str]
    sizes: list[int]
    ranks: list[RankWire]
    stopped: bool
    counts: dict[str, int]  # every state, in ProcState order: the views draw their chips in this order
    inflight: int  # calls in flight from this controller, summed over ranks
    spawn: Progress  # procs up / procs (done == total once every proc reported in)
    gather: CallsWire | None  # ranks done / ranks busy, while calls are out (live); None when idle
    failures: list[RecentFailure]  # newest last, a few only
    # where the ranks run; views read both with .get: a snapshot from an older kernel has neither
    hosts: list[HostWire]  # [] when unknown
    job: JobWire | None


_CELL_FILE = re.compile(r"(/[^\s:]*/ipykernel_\d+/\d+\.py)")


def cell_names(text: str) -> str:
    """``/tmp/ipykernel_81/3766964917.py:8`` as the notebook names it, ``In[2]:8``, in a kernel whose
    IPython compiled that cell (IPython's own tracebacks say "Cell In[2]"); other text as it is."""
    if "ipykernel_" not in text or "IPython" not in sys.modules:
        return text
    shell = sys.modules["IPython"].get_ipython()
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if not isinstance(names, dict):
        return text
    return _CELL_FILE.sub(lambda m: f"In[{names[m[1]]}]" if m[1] in names else m[1], text)


def user_lines(lines: list[str]) -> list[str]:
    """A rank's output as its user wrote it: without the sync markers ``%%mesh`` prints after a cell
    (the notebook front reads them; in a failed rank's tail they would hide its last real lines)."""
    return [ln for ln in lines if SYNC_PREFIX not in ln]


def failure_wire(f: Failure | None) -> FailureWire | None:
    if f is None:
        return None
    tail = f.traceback if SYNC_PREFIX not in f.traceback else "".join(user_lines(f.traceback.splitlines(True)))
    return FailureWire(kind=f.kind, detail=f.detail, traceback=tail, exit_code=f.exit_code, signal=f.signal)


def mesh_wire(
    state: MeshState, failures: list[RecentFailure] | None = None, waits: list[WaitWire] | None = None
) -> MeshWire:
    dims = list(state.sizes)
    pr, now = state.progress, time.time()
    counts = state.counts()
    ranks = [
        RankWire(
            rank=r.rank,
            coords=[int(r.coords.get(d, 0)) for d in dims],
            state=r.state.value,
            inflight=r.inflight,
            pid=r.pid,
            failure=failure_wire(r.failure),
            note=cell_names(r.note),
            busy_since=round(now - r.busy_s, 2) if r.state is ProcState.BUSY else None,
            host=r.host,
        )
        for r in state.ranks
    ]
    return MeshWire(
        mesh_id=state.mesh_id,
        name=state.name,
        dims=dims,
        sizes=[int(state.sizes[d]) for d in dims],
        ranks=ranks,
        stopped=state.stopped,
        counts=counts,
        inflight=sum(r.inflight for r in state.ranks),
        spawn=Progress(done=len(ranks) - counts[ProcState.STARTING.value], total=len(ranks)),
        gather=None
        if pr is None
        else CallsWire(
            done=len(pr.done),
            total=len(pr.done) + len(pr.left),
            left=list(pr.left[:LEFT_MAX]),
            since=round(now - pr.elapsed, 2),
            waits=waits,
        ),
        failures=list(failures) if failures is not None else _current_failures(state, dims),
        hosts=[HostWire(index=h.index, address=h.address, state=h.state.value, why=h.why) for h in state.hosts],
        job=job_wire(state.job),
    )


def job_wire(job: Mapping[str, Any] | None) -> JobWire | None:
    if not job:
        return None
    sid = job.get("id")
    return JobWire(
        kind=str(job.get("kind") or "job"), id=None if sid is None else str(sid), keep_alive=bool(job.get("keep_alive"))
    )


def _current_failures(state: MeshState, dims: list[str]) -> list[RecentFailure]:
    """Failures of the ranks failed right now, for callers that kept no history."""
    return [
        RecentFailure(
            rank=r.rank,
            label=",".join(f"{d}={r.coords.get(d, 0)}" for d in dims),
            kind=r.failure.kind,
            detail=r.failure.detail,
            time=0.0,
        )
        for r in state.ranks
        if r.failure is not None
    ]


# -- the sidebar's comm (target "jupyter_mesh.sidebar") ----------------------------------------------

ActionName = Literal["kill", "respawn", "stop", "logs"]


class SnapshotMessage(TypedDict):
    """Kernel -> front end, first message on a channel and the answer to ``refresh``: every mesh."""

    type: Literal["snapshot"]
    kernel: str  # "mesh" for the mesh kernel, else the kernel's implementation name
    meshes: list[MeshWire]


class UpdateMessage(TypedDict):
    """Kernel -> front end, at most a few per second: the meshes that changed, and those now gone."""

    type: Literal["update"]
    meshes: list[MeshWire]
    removed: list[str]


class ActionResult(TypedDict):
    """Kernel -> front end: the outcome of one ``action``, matched by ``id``."""

    type: Literal["result"]
    id: str
    ok: bool
    error: str  # what went wrong and what to do, empty when ok
    lines: list[str]  # for "logs"; ranks respawned (as text) for "respawn"


class ActionRequest(TypedDict):
    """Front end -> kernel: act on a mesh through the public API (``proc_mesh(id).kill(rank)`` ...)."""

    type: Literal["action"]
    id: str
    action: ActionName
    mesh_id: str
    rank: int | None  # kill, logs (None: every rank); respawn (None: every failed rank); stop ignores it


class RefreshRequest(TypedDict):
    type: Literal["refresh"]


KernelMessage = Union[SnapshotMessage, UpdateMessage, ActionResult]
FrontMessage = Union[ActionRequest, RefreshRequest]
