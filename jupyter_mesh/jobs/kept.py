"""What a kept-alive job remembers of its meshes, and how a new controller takes them back.

A job started with ``keep_alive=True`` saves, in its record (0600, under the user's config dir),
which proc meshes and actor meshes the controller made on it: ids, names, the actors' classes and
endpoints, and their spawn arguments (so a rank that dies later can be respawned with its actors).
``reattach`` reads that back; where the procs are now and whether they live, the agents say
(``_runtime.keep_alive.Keeper.hosted``): they are the truth, the record only names things.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._api.mesh import ActorMesh, ProcMesh
from .._core.refs import ProcMeshRef
from .._core.shape import Shape
from .._runtime.hosts import AgentHandle
from .._runtime.records import MeshRecord
from .._wire.protocol import Kind
from ..errors import Failure, MeshError, MeshTimeoutError

if TYPE_CHECKING:
    from .._runtime.controller import Controller
    from .._runtime.hosts import Job

__all__ = ["Restored", "detach_agents", "kept_records", "reattach_agents", "restore_meshes", "saved_meshes"]

SPAWN_KEPT_MAX = 4 << 20
"""Actors whose spawn arguments are larger than this are remembered without them (not re-created on
respawn): the record is rewritten on every change and must stay small."""


@dataclass
class Restored:
    """What a reattach found: the live meshes by name, and what changed while nobody was attached."""

    procs: dict[str, ProcMesh] = field(default_factory=dict)
    actors: list[tuple[str, ActorMesh[Any]]] = field(default_factory=list)  # (its proc mesh's name, it)
    notes: list[str] = field(default_factory=list)

    def actor_meshes(self) -> dict[str, ActorMesh[Any]]:
        """By name; a name found on several proc meshes as ``procs/name``."""
        names = [a.name for _, a in self.actors]
        return {(a.name if names.count(a.name) == 1 else f"{p}/{a.name}"): a for p, a in self.actors}


def saved_meshes(ctl: Controller, job: Job) -> list[dict[str, Any]]:
    """The controller's live meshes on ``job``, as plain data for the job's record."""
    out = []
    for rec in list(ctl.meshes.values()):
        if rec.job is not job or rec.stopped:
            continue
        ref = rec.ref
        actors = []
        for m, payload, bufs in rec.actors:
            if not isinstance(m, ActorMesh):
                continue
            size = len(payload) + sum(len(b) for b in bufs)
            actors.append(
                {
                    "id": m._actor_id,
                    "name": m._name,
                    "class": m._class_name,
                    "endpoints": sorted(m._endpoint_names),
                    "view": m._view.to_wire() if m._view is not None else None,
                    "spawn": [_b64(payload), [_b64(b) for b in bufs]] if size <= SPAWN_KEPT_MAX else None,
                }
            )
        out.append(
            {
                "id": ref.mesh_id,
                "name": ref.name,
                "agents": list(ref.agent_addrs),
                "host_keys": list(ref.host_keys),
                "host_dims": ref.host_dims,
                "env": dict(rec.env),
                "preload": list(rec.preload),
                "actors": actors,
            }
        )
    return out


def restore_meshes(ctl: Controller, job: Job, saved: list[dict[str, Any]], hosted: dict[str, Any]) -> Restored:
    """Rebuild the controller's records of ``saved`` meshes from what each agent (by address) hosts."""
    found = Restored()
    for m in saved:
        name = str(m["name"])
        agents = [str(a) for a in m["agents"]]
        parts = [(hosted.get(a) or {}).get(m["id"]) for a in agents]
        live_parts = [p for p in parts if isinstance(p, dict)]
        if not live_parts:
            found.notes.append(f"proc mesh '{name}' is gone: no agent of the job hosts it any more")
            continue
        shape = Shape.from_wire(live_parts[0]["shape"])
        n = len(shape)
        per_host = max(1, n // len(agents))
        proc_addrs, rank_host = [""] * n, [min(r // per_host, len(agents) - 1) for r in range(n)]
        pids: dict[int, int] = {}
        lives: dict[int, bool] = {}
        ended: dict[int, str] = {}
        for h, part in enumerate(parts):
            for entry in part.get("ranks", []) if isinstance(part, dict) else []:
                r, addr, pid, alive, how = entry
                if not (isinstance(r, int) and 0 <= r < n and isinstance(addr, str) and isinstance(pid, int)):
                    continue  # nothing off the wire is trusted as it is
                proc_addrs[r], rank_host[r], pids[r] = addr, h, pid
                lives[r], ended[r] = bool(alive), str(how)[:300]
        ref = ProcMeshRef(
            str(m["id"]), name, shape, proc_addrs, rank_host, agents, [str(k) for k in m["host_keys"]], m["host_dims"]
        )
        rec = MeshRecord(ref, {r: p for r, p in pids.items() if p})
        rec.job, rec.env, rec.preload = job, dict(m.get("env") or {}), list(m.get("preload") or [])
        ctl.meshes[ref.mesh_id] = rec
        coords = [dict(shape.point(r)) for r in range(n)]
        ctl.state.created(ref.mesh_id, name, dict(shape.extent), coords, ref.agent_addrs, ref.rank_host, job.describe)
        failures = {}
        for r in range(n):
            if lives.get(r):
                ctl.state.ready(ref.mesh_id, r, pids[r])
                continue
            how = ended.get(r) or "its host did not report it"
            failures[r] = Failure(name, ref.coords(r), "exit", f"{how} (before this controller attached)")
        for r, f in failures.items():
            rec.failures[r] = f
            ctl.state.failed(ref.mesh_id, r, f)
        if failures:
            ctl.client.mark_failed(failures, ref.mesh_id)
            found.notes.append(f"proc mesh '{name}': ranks {sorted(failures)} are not running (respawn them)")
        found.procs[name] = ProcMesh(ctl, ref)
        for a in m.get("actors") or []:
            view = Shape.from_wire(a["view"]) if a.get("view") is not None else None
            mesh: ActorMesh[Any] = ActorMesh(ref, a["id"], a["name"], a["class"], frozenset(a["endpoints"]), view)
            found.actors.append((name, mesh))
            if a.get("spawn"):
                payload, bufs = a["spawn"]
                rec.actors.append((mesh, base64.b64decode(payload), [base64.b64decode(b) for b in bufs]))
            else:
                found.notes.append(
                    f"actor mesh '{mesh.name}': its spawn arguments were too large to keep, so a "
                    f"respawned rank will not re-create it"
                )
    return found


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def kept_records(jobs_dir: str, scheduler: str) -> list[tuple[str, dict[str, Any]]]:
    """(token, record) of every ``scheduler`` job kept alive whose key file is still there, oldest first."""
    out = []
    for name in sorted(os.listdir(jobs_dir)):
        token, ext = os.path.splitext(name)
        if ext != ".json" or not os.path.exists(os.path.join(jobs_dir, token + ".key")):
            continue
        try:
            with open(os.path.join(jobs_dir, name)) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if (
            isinstance(rec, dict)
            and rec.get("keep_alive") is True
            and rec.get("scheduler") == scheduler
            and rec.get("job_id")
            and isinstance(rec.get("agents"), list)
            and rec["agents"]
        ):
            out.append((token, rec))
    return sorted(out, key=lambda tr: tr[1].get("created") or 0)


def reattach_agents(
    ctl: Controller, token: str, addrs: list[str], force: bool, timeout: float, what: str
) -> tuple[list[AgentHandle], dict[str, Any]]:
    """Ask each kept agent at ``addrs`` to report to ``ctl`` (the session's keys); their handles and
    what each hosts. On any failure those that answered are detached again, for a next try."""
    from .._wire.transport import Message  # zmq: imported with a job, not the package

    waiters = []
    for i, addr in enumerate(addrs):
        nonce = f"{token}/re-{secrets.token_hex(4)}/{i}"
        waiters.append((addr, nonce, ctl.expect_agent(nonce)))
        ctl.transport.send(
            addr, Message({"k": Kind.REATTACH, "controller": ctl.address, "nonce": nonce, "force": force})
        )
    agents: list[AgentHandle] = []
    hosted: dict[str, Any] = {}
    try:
        for i, (addr, _, w) in enumerate(waiters):
            try:
                h = w.get(timeout)
            except MeshTimeoutError:
                raise MeshTimeoutError(
                    "reattach",
                    timeout,
                    f"the agent of host {i} of {what} ({addr}) did not answer: its node may be unreachable, "
                    f"or the agent gone",
                ) from None
            except MeshError as e:
                raise MeshError(f"cannot reattach {what}: {e}") from None
            agents.append(AgentHandle(i, h["addr"], h["pid"], h["hk"]))
            hosted[h["addr"]] = h.get("hosted") if isinstance(h.get("hosted"), dict) else {}
    except BaseException:
        detach_agents(ctl, agents)
        for _, nonce, _ in waiters:
            ctl.stop_expecting(nonce)
        raise
    return agents, hosted


def detach_agents(ctl: Controller, agents: list[AgentHandle]) -> None:
    """This controller goes and the job stays: its agents wait, keeping their procs, for the next."""
    from .._wire.transport import Message

    for a in agents:
        try:
            ctl.transport.send(a.addr, Message({"k": Kind.DETACH}))
        except Exception:  # noqa: BLE001 - it detaches on our silence anyway
            pass
    if not ctl.is_closed:
        ctl.forget_agents([a.addr for a in agents])
