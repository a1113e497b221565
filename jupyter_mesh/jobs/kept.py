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
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._api.mesh import ActorMesh
from .._api.proc_mesh import ProcMesh
from .._core.future import time_left
from .._core.refs import ProcMeshRef
from .._core.shape import Shape
from .._runtime.hosts import AgentHandle
from .._runtime.records import MeshRecord
from .._wire.addresses import parse_tcp
from .._wire.protocol import Kind
from ..errors import Failure, MeshError, MeshTimeoutError
from ._dialback import SLURM_JOB_ID

if TYPE_CHECKING:
    from .._core.future import Future
    from .._runtime.controller import Controller
    from .._runtime.hosts import Job

__all__ = [
    "Restored",
    "detach_agents",
    "kept_records",
    "reattach_agents",
    "record_problem",
    "restore_meshes",
    "saved_meshes",
    "when_created",
]

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
        names = [a._name for _, a in self.actors]  # (not ``a.name``: an endpoint may be named so)
        return {(a._name if names.count(a._name) == 1 else f"{p}/{a._name}"): a for p, a in self.actors}


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
            str(m["id"]),
            name,
            shape,
            proc_addrs,
            rank_host,
            agents,
            [str(k) for k in m["host_keys"]],
            m.get("host_dims", 1),
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
                    f"actor mesh '{mesh._name}': its spawn arguments were too large to keep, so a "
                    f"respawned rank will not re-create it"
                )
    return found


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def kept_records(jobs_dir: str, scheduler: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(token, record) of every ``scheduler`` job kept alive whose key file is still there, oldest
    first; and what is wrong with those that cannot be used (``TOKEN.json: why``), never trusted."""
    out, problems = [], []
    for name in sorted(os.listdir(jobs_dir)):
        token, ext = os.path.splitext(name)
        if ext != ".json" or not os.path.exists(os.path.join(jobs_dir, token + ".key")):
            continue
        try:
            with open(os.path.join(jobs_dir, name), "rb") as f:
                rec = json.loads(f.read(RECORD_MAX + 1))
        except OSError as e:
            problems.append(f"{name}: cannot be read ({e.strerror})")
            continue
        except ValueError:
            problems.append(f"{name}: is not JSON (or larger than {RECORD_MAX >> 20} MiB)")
            continue
        if not (isinstance(rec, dict) and rec.get("keep_alive") is True and rec.get("scheduler") == scheduler):
            continue  # another scheduler's, or a job not kept alive
        why = record_problem(rec)
        if why:
            problems.append(f"{name}: {why}")
        else:
            out.append((token, rec))
    return sorted(out, key=lambda tr: when_created(tr[1].get("created"))), problems


def when_created(created: Any) -> float:
    """A record's ``created`` as a time (0 when it is none)."""
    return float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else 0.0


RECORD_MAX = 256 << 20
"""A record larger than this is not read (the spawn arguments it keeps are each at most SPAWN_KEPT_MAX)."""

_MAX_HOSTS = 65536


def record_problem(rec: dict[str, Any]) -> str | None:
    """What makes a kept job's record unusable, or None: it is the user's file, but read back as
    data it must hold what a reattach sends and builds from, and nothing else (types, sizes)."""
    job_id, nodes, agents = rec.get("job_id"), rec.get("nodes"), rec.get("agents")
    if isinstance(job_id, bool) or not isinstance(job_id, (str, int)) or not SLURM_JOB_ID.fullmatch(str(job_id)):
        return f"job_id {str(job_id)[:40]!r} is not a SLURM job id"
    if type(nodes) is not int or not 1 <= nodes <= _MAX_HOSTS:
        return f"nodes {str(nodes)[:40]!r} is not a number of hosts"
    if not (isinstance(agents, list) and len(agents) == nodes and all(_tcp(a) for a in agents)):
        return f"agents is not a list of {nodes} agent addresses (tcp://IP:PORT)"
    if len(set(agents)) != len(agents):
        return "agents names one address twice"
    meshes = rec.get("meshes", [])
    if not isinstance(meshes, list) or len(meshes) > 10000:
        return "meshes is not a list of meshes"
    for i, m in enumerate(meshes):
        why = _mesh_problem(m, set(agents))
        if why:
            return f"meshes[{i}]: {why}"
    return None


def _tcp(addr: Any) -> bool:
    if not (isinstance(addr, str) and len(addr) < 200):
        return False
    try:
        parse_tcp(addr)
    except ValueError:
        return False
    return True


def _texts(x: Any, most: int = 100000) -> bool:
    return isinstance(x, list) and len(x) <= most and all(isinstance(v, str) and len(v) <= 1000 for v in x)


def _mesh_problem(m: Any, agents: set[str]) -> str | None:
    if not isinstance(m, dict):
        return "not a mesh"
    if not (isinstance(m.get("id"), str) and isinstance(m.get("name"), str)):
        return "its id and name are not texts"
    hosts = m.get("agents")
    if not (_texts(hosts) and hosts and set(hosts) <= agents):
        return "its agents are not agents of the job"
    if not (_texts(m.get("host_keys")) and len(m["host_keys"]) == len(hosts)):
        return "its host_keys are not one text per agent"
    if type(m.get("host_dims", 1)) is not int:
        return "host_dims is not a number"
    env = m.get("env") or {}
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return "env is not texts by name"
    if not _texts(m.get("preload") or []):
        return "preload is not a list of module names"
    actors = m.get("actors") or []
    if not isinstance(actors, list):
        return "actors is not a list"
    for a in actors:
        if not (isinstance(a, dict) and all(isinstance(a.get(k), str) for k in ("id", "name", "class"))):
            return "an actor mesh's id, name or class is not a text"
        if not _texts(a.get("endpoints")):
            return f"actor mesh {a['name'][:40]!r}: endpoints is not a list of names"
        try:
            if a.get("view") is not None:
                Shape.from_wire(a["view"])
            spawn = a.get("spawn")
            if spawn is not None:
                payload, bufs = spawn
                base64.b64decode(payload, validate=True)
                for b in bufs:
                    base64.b64decode(b, validate=True)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            return f"actor mesh {a['name'][:40]!r}: its view or spawn arguments are malformed"
    return None


def reattach_agents(
    ctl: Controller, token: str, addrs: list[str], force: bool, timeout: float, what: str, ending: str
) -> tuple[list[AgentHandle], dict[str, Any]]:
    """Ask each kept agent at ``addrs`` to report to ``ctl`` (the session's keys); their handles and
    what each hosts. On any failure those that answered are detached again, for a next try.
    ``ending``: how the user ends the job when an agent is gone (named in that error)."""
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
        deadline = time.monotonic() + timeout  # the agents start together: one bound for all
        for i, (addr, _, w) in enumerate(waiters):
            try:
                h = w.get(time_left(deadline))
            except MeshTimeoutError:
                raise MeshTimeoutError(
                    "reattach",
                    timeout,
                    f"the agent of host {i} of {what} ({addr}) did not answer: its node may be unreachable "
                    f"(try again once it is back), or the agent gone ({ending})",
                ) from None
            except MeshError as e:
                raise MeshError(f"cannot reattach {what}: {e}") from None
            agents.append(AgentHandle(i, h["addr"], h["pid"], h["hk"]))
            hosted[h["addr"]] = h.get("hosted") if isinstance(h.get("hosted"), dict) else {}
    except BaseException:
        _give_up(ctl, waiters)
        raise
    return agents, hosted


def _give_up(ctl: Controller, waiters: list[tuple[str, str, Future[dict[str, Any]]]]) -> None:
    """A reattach failed: every agent that took this controller (some may answer after the one that
    failed it) waits for the next one again, and none that did not answer yet gets it later."""
    for _, nonce, _ in waiters:
        ctl.stop_expecting(nonce)  # from now on a hello is late: it is told to wait (``AgentLinks``)
    for i, (addr, _, w) in enumerate(waiters):
        if not w.done():  # a reattach still queued for a host cut off must not reach it once it is back
            ctl.transport.forget(addr, linger_ms=0)

        def took(f: Future[dict[str, Any]], i: int = i) -> None:
            if f.exception(0) is None:
                h = f.result(0)
                detach_agents(ctl, [AgentHandle(i, h["addr"], h["pid"], h["hk"])])

        w.add_done_callback(took)  # now, or when a hello that raced with the give-up lands


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
