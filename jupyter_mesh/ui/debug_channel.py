"""The sidebar's debugger requests: a paused rank's pdb (Attach) and a mesh's stacks (Stacks).

They travel on the kernel's **control** channel (``jupyter_mesh_debug_request``), like ``jupyter-mesh
status``: the cell waiting on a paused call keeps the shell channel (and with it every comm) busy
until it ends, but ipykernel serves the control channel on a thread of its own. It is the path
JupyterLab already has to the kernel — the server's authenticated websocket, then the kernel's
HMAC-signed sockets — so a pdb command (which runs code in a rank) takes no new port and no new key.

Each request does one bounded thing and answers (the control channel also carries interrupts): a pdb
command waits at most ``SEND_WAIT`` seconds for pdb's next prompt, else it answers ``running`` and the
panel asks for the rest (``take``). A rank the sidebar attached to is marked *detached*: a cell that
waits on a call later does not prompt for it too.

Requests: ``{"op": "attach"|"send"|"take"|"stacks", "mesh_id", "rank", "line"}``; replies
``{"status": "ok"|"error", "error", "out", "ended", "running", "where", "actor", "label"}``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import MeshError, MeshTimeoutError

if TYPE_CHECKING:
    from .._runtime.debugger import PausedActor

__all__ = ["REPLY", "REQUEST", "handle", "serve"]

REQUEST = "jupyter_mesh_debug_request"
REPLY = "jupyter_mesh_debug_reply"
SEND_WAIT = 5.0  # a pdb command's output is awaited this long; then the panel polls (``take``)
TAKE_WAIT = 2.0
STACKS_WAIT = 3.0  # per rank, all asked at once
_PDB_PROMPT = "(Pdb) "
log = logging.getLogger("jupyter_mesh.ui")


def serve(kernel: Any) -> None:
    """Answer the sidebar's debugger requests on ``kernel``'s control channel."""

    def on_request(stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        content = handle(parent.get("content") or {})
        kernel.session.send(stream, REPLY, content, parent, ident)

    kernel.control_handlers[REQUEST] = on_request


def _find(mesh_id: str, rank: int) -> PausedActor:
    from .. import debug

    for p in debug.paused():  # oldest first: the one a cell would prompt for first
        if p.mesh_id == mesh_id and p.rank == rank:
            return p
    raise LookupError(
        f"rank {rank} of this mesh is not paused in the debugger (any more); `%mesh debug` lists those that are"
    )


def _reply(p: PausedActor | None = None, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"status": "ok", "error": "", "out": "", "ended": False, "running": False}
    if p is not None:
        from .wire import cell_names

        out.update(where=cell_names(p.where), actor=p.actor, label=p.label, mesh=p.mesh, ended=bool(p.ended))
    out.update(kw)
    if isinstance(out["out"], str) and out["out"].endswith(_PDB_PROMPT):
        out["out"] = out["out"][: -len(_PDB_PROMPT)]
    return out


MAX_LINE = 64 * 1024  # a pdb command longer than this is refused (a paste gone wrong, or junk)


def _checked(req: Any) -> tuple[str, str]:
    """The request's op and mesh id, its fields of the types the panel sends, else ``ValueError``."""
    if not isinstance(req, dict):
        raise ValueError(
            f"a debugger request is a JSON object, not {type(req).__name__}; see `jupyter_mesh.ui.debug_channel`"
        )
    want = {"op": str, "mesh_id": str, "rank": int, "line": str, "actor": str}
    for key, kind in want.items():
        v = req.get(key)
        if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
            raise ValueError(f"the debugger request's {key!r} must be {kind.__name__}, not {type(v).__name__}")
    if len(req.get("line") or "") > MAX_LINE:
        raise ValueError(f"the pdb command is {len(req['line'])} characters; at most {MAX_LINE} are sent")
    return req.get("op") or "", req.get("mesh_id") or ""


def handle(req: Any) -> dict[str, Any]:
    """One request; errors become ``status: error`` with what to do, never a raise."""
    try:
        op, mesh_id = _checked(req)
    except ValueError as e:
        return _reply(status="error", error=str(e))
    try:
        if op == "stacks":
            from ..lowlevel import proc_mesh

            return _reply(out=str(proc_mesh(mesh_id).stacks(timeout=STACKS_WAIT)))
        rank = int(req.get("rank", -1))
        if op == "attach":
            p = _find(mesh_id, rank)
            _refuse_if_served(p)
            _attached[(mesh_id, rank)] = p
            p.detached = True  # the sidebar serves it now: a cell waiting later does not prompt for it too
            try:  # pdb's listing, unless a front took it already (then there is nothing to wait for)
                text = p.prompt(timeout=TAKE_WAIT) if p.has_output() else ""
            except MeshTimeoutError:
                text = ""
            return _reply(p, out=text)
        if op in ("send", "take"):
            p = _find_any(mesh_id, rank, str(req.get("actor", "")))
            _refuse_if_served(p)
            try:
                text = p.send(str(req.get("line", "")), timeout=SEND_WAIT) if op == "send" else p.prompt(TAKE_WAIT)
            except MeshTimeoutError:
                return _reply(p, running=True)  # a slow `n`/`c`: its output comes with a later take
            return _reply(p, out=text, ended=bool(p.ended))
        raise LookupError(f"unknown debugger request {op!r}; expected attach, send, take or stacks")
    except (LookupError, MeshError, ValueError, TypeError) as e:
        return _reply(status="error", error=str(e).strip("'\""))
    except Exception as e:  # the sidebar shows it; the kernel carries on
        log.exception("sidebar debugger request failed")
        return _reply(status="error", error=f"{type(e).__name__}: {e}")


_attached: dict[tuple[str, int], PausedActor] = {}


def _refuse_if_served(p: PausedActor) -> None:
    """One front at a time: a cell's stdin prompt, ``%mesh debug attach`` or ``jupyter-mesh debug``
    serving it (``PausedActor.claim``) keeps it."""
    if p.attached:
        who = getattr(p, "attached_by", "") or "a cell's pdb prompt"
        raise LookupError(
            f"{p.actor} on {p.mesh} {p.label} is being debugged from {who}; answer there, "
            "or type 'detach' there and attach again"
        )


def _find_any(mesh_id: str, rank: int, actor: str) -> PausedActor:
    """The paused actor of ``rank`` (the one attached before, also once it ran on: its last output)."""
    try:
        p = _find(mesh_id, rank)
    except LookupError:
        p = _attached.get((mesh_id, rank))  # type: ignore[assignment]
        if p is None or (actor and p.actor != actor):
            raise
        return p
    _attached[(mesh_id, rank)] = p
    return p
