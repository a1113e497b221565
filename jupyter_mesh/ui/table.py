"""The mesh as a static table: what a notebook shows where widgets are not available (nbconvert,
GitHub, a front end without ipywidgets), and the plain-text repr everywhere.

Renders the same :class:`~jupyter_mesh.ui.wire.MeshWire` snapshots as the widget and the sidebar.
Ranks are grouped by host, each group headed by the host's address and state, when that says
something (:func:`show_hosts`): several hosts, or one that is elsewhere or gone; the common case,
one host on this machine, looks as it did before hosts were known.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterator

from .wire import STATES, HostWire, MeshWire, RankWire

__all__ = [
    "COLOURS",
    "HOST_COLOURS",
    "TIMES",
    "calls_line",
    "fold_failures",
    "grid_slices",
    "host_groups",
    "host_line",
    "html_table",
    "job_line",
    "shape_label",
    "show_hosts",
    "text_table",
]

TIMES = "\u00d7"  # the x between dims: "hosts=2 x gpus=4"

# one palette for the HTML table, the terminal, and the widget and sidebar (whose CSS,
# labextension/style/states.css, is generated from it: python -m jupyter_mesh.ui.codegen)
COLOURS = {
    "starting": "#90a4ae",
    "idle": "#43a047",
    "busy": "#1e88e5",
    "paused": "#fb8c00",
    "failed": "#e53935",
    "stopped": "#616161",
}
# a host's state (HostState): the label of its group of ranks, in every view (codegen: states.css)
HOST_COLOURS = {
    "up": "#43a047",
    "unreachable": "#e53935",
    "exiting": "#fb8c00",
    "lost": "#e53935",
}

Slices = list[tuple[str, list[list[RankWire]]]]


def grid_slices(mesh: MeshWire) -> Iterator[tuple[str, list[list[RankWire]]]]:
    """The mesh as 2-d grids: (label of the leading coords, rows of ranks) per slice.

    The last two dims are rows x columns; every combination of the dims before them is one slice
    (``hosts=1`` for a hosts x nodes x gpus mesh). One dim is a single row; zero dims one cell.
    """
    ranks = sorted(mesh["ranks"], key=lambda r: r["rank"])
    yield from _slices(mesh["dims"], mesh["sizes"], list(range(len(mesh["dims"]))), ranks)


def _slices(
    dims: list[str], sizes: list[int], at: list[int], ranks: list[RankWire]
) -> Iterator[tuple[str, list[list[RankWire]]]]:
    """``ranks`` (sorted) laid out along ``dims`` of ``sizes``, which are coords ``at`` of each rank."""
    cols = sizes[-1] if dims else 1
    rows = sizes[-2] if len(dims) >= 2 else 1
    lead = len(dims) - 2 if len(dims) > 2 else 0
    per_slice = rows * cols
    for start in range(0, len(ranks), per_slice):
        chunk = ranks[start : start + per_slice]
        label = ",".join(f"{d}={chunk[0]['coords'][i]}" for d, i in zip(dims[:lead], at[:lead], strict=True))
        yield label, [chunk[i : i + cols] for i in range(0, len(chunk), cols)]


def show_hosts(mesh: MeshWire) -> bool:
    """Whether views head the ranks by host: they run on several, or on one elsewhere (an address
    worth reading) or gone (its cause). One host on this machine, up: no header, as before."""
    hosts = _used_hosts(mesh)
    return len(hosts) > 1 or any(h["address"] != "local" or h["state"] != "up" for h in hosts)


def _used_hosts(mesh: MeshWire) -> list[HostWire]:
    used = {r.get("host", 0) for r in mesh["ranks"]}
    return [h for h in mesh.get("hosts") or [] if h["index"] in used]


def host_groups(mesh: MeshWire) -> list[tuple[HostWire | None, Slices]]:
    """The ranks as (host, its grids) per host when :func:`show_hosts`, else one (None, grids) group.
    A host's grid spans the dims along which its ranks differ (``gpus`` of ``hosts x gpus``)."""
    if not show_hosts(mesh):
        return [(None, list(grid_slices(mesh)))]
    by_host: dict[int, list[RankWire]] = {}
    for r in sorted(mesh["ranks"], key=lambda r: r["rank"]):
        by_host.setdefault(r.get("host", 0), []).append(r)
    out: list[tuple[HostWire | None, Slices]] = []
    for h in _used_hosts(mesh):
        ranks = by_host[h["index"]]
        at = [i for i in range(len(mesh["dims"])) if len({r["coords"][i] for r in ranks}) > 1]
        sizes = [len({r["coords"][i] for r in ranks}) for i in at]
        if math.prod(sizes) != len(ranks):  # not a block of the mesh (never, today): one row
            out.append((h, [("", [ranks])]))
        else:
            out.append((h, list(_slices([mesh["dims"][i] for i in at], sizes, at, ranks))))
    return out


def host_line(h: HostWire, procs: int) -> str:
    """``host 1 · 10.0.0.3 · unreachable · 4 procs: host 10.0.0.3 unreachable for 3.1 s (...)``"""
    return (
        f"host {h['index']} \u00b7 {h['address']} \u00b7 {h['state']} \u00b7 {procs} proc{'s' if procs != 1 else ''}"
        + (f": {h['why']}" if h["why"] else "")
    )


def job_line(mesh: MeshWire) -> str:
    """``SLURM job 12 · kept alive past this kernel``; "" for local agents (nothing to add)."""
    job = mesh.get("job")
    if not job or (job["kind"] == "local" and not job["keep_alive"]):
        return ""
    if job["kind"] in _JOB_NAMES and not job["id"]:
        text = _JOB_NAMES[job["kind"]]
    else:  # a scheduler's job: "SLURM job 12"
        text = f"{_SCHEDULERS.get(job['kind'], job['kind'])} job" + (f" {job['id']}" if job["id"] else "")
    return text + (" \u00b7 kept alive past this kernel" if job["keep_alive"] else "")


_JOB_NAMES = {"attach": "attached agents", "local": "local agents"}
_SCHEDULERS = {"slurm": "SLURM", "torchx": "TorchX"}


def shape_label(mesh: MeshWire) -> str:
    return f" {TIMES} ".join(f"{d}={s}" for d, s in zip(mesh["dims"], mesh["sizes"], strict=True)) or "1 proc"


def calls_line(mesh: MeshWire) -> str:
    """ "3/8 done, left: 3, 5 (12.0 s)" while calls are out, else ""."""
    g = mesh["gather"]
    if g is None:
        return ""
    left = ", ".join(map(str, g["left"])) + (", ..." if g["total"] - g["done"] > len(g["left"]) else "")
    return f"{g['done']}/{g['total']} done, left: {left or '-'} ({max(0.0, time.time() - g['since']):.1f} s)"


def _counts(mesh: MeshWire) -> str:
    return ", ".join(f"{mesh['counts'][s]} {s}" for s in STATES if mesh["counts"].get(s))


def html_table(meshes: list[MeshWire]) -> str:
    """A self-contained HTML rendering (inline styles only: it must survive sanitisers)."""
    if not meshes:
        return "<p><em>jupyter_mesh: no proc mesh yet.</em></p>"
    parts = []
    for m in meshes:
        esc = html.escape
        stopped = " (stopped)" if m["stopped"] else ""
        parts.append(
            f"<div data-mesh='{esc(m['name'])}'><b>{esc(m['name'])}</b> {esc(shape_label(m))}{stopped} &mdash; "
            f"{esc(_counts(m))}; "
            f"{m['inflight']} call(s) in flight</div>"
        )
        if (job := m.get("job")) and job_line(m):
            parts.append(f"<div data-job='{esc(job['kind'])}'>{esc(job_line(m))}</div>")
        if m["gather"]:
            parts.append(f"<div data-calls='{m['gather']['done']}/{m['gather']['total']}'>{esc(calls_line(m))}</div>")
            for w in m["gather"].get("waits") or []:
                parts.append(
                    f"<div data-wait='{w['rank']}'>&nbsp;&nbsp;rank {w['rank']} [{esc(w['label'])}]: {esc(w['where'])}</div>"
                )
        for host, slices in host_groups(m):
            if host is not None:
                parts.append(_html_host(host, sum(len(row) for _, rows in slices for row in rows)))
            for label, rows in slices:
                if label:
                    parts.append(f"<div style='font-size:90%'>{esc(label)}</div>")
                parts.append("<table style='border-collapse:collapse'>")
                for row in rows:
                    cells = "".join(
                        f"<td data-rank='{r['rank']}' data-state='{r['state']}' title='{esc(_rank_title(m, r))}' "
                        f"style='background:{COLOURS[r['state']]};color:#fff;"
                        f"padding:2px 6px;border:1px solid #fff;font-family:monospace'>{r['rank']}</td>"
                        for r in row
                    )
                    parts.append(f"<tr>{cells}</tr>")
                parts.append("</table>")
        for labels, _, detail in fold_failures(m):
            parts.append(f"<div style='color:{COLOURS['failed']}'>[{esc(labels)}] {esc(detail)}</div>")
        for label, note in _notes(m):
            parts.append(f"<div style='font-size:90%'>[{esc(label)}] {esc(note)}</div>")
    return "\n".join(parts)


def fold_failures(mesh: MeshWire) -> list[tuple[str, str, str]]:
    """The recent failures as (labels, kind, detail), oldest first, one line per cause: the ranks of a
    lost host all fail with its cause, which reads once ("hosts=1,gpus=0; hosts=1,gpus=1")."""
    folded: dict[tuple[str, str], list[str]] = {}
    for f in mesh["failures"]:
        folded.setdefault((f["kind"], f["detail"]), []).append(f["label"])
    return [("; ".join(labels), kind, detail) for (kind, detail), labels in folded.items()]


def _html_host(h: HostWire, procs: int) -> str:
    esc = html.escape
    colour = HOST_COLOURS.get(h["state"], COLOURS["stopped"])
    why = f" &mdash; <span style='color:{colour}'>{esc(h['why'])}</span>" if h["why"] else ""
    return (
        f"<div data-host='{h['index']}' data-host-state='{esc(h['state'])}' style='margin-top:4px'>"
        f"<span style='background:{colour};color:#fff;padding:0 5px;border-radius:6px'>{esc(h['state'])}</span> "
        f"host {h['index']} &middot; <b>{esc(h['address'])}</b> &middot; {procs} proc{'s' if procs != 1 else ''}{why}</div>"
    )


def _notes(mesh: MeshWire) -> list[tuple[str, str]]:
    """(coords label, note) of the ranks with a note (initializing, busy), a few only."""
    noted = [r for r in mesh["ranks"] if r.get("note")]
    out = [(",".join(f"{d}={c}" for d, c in zip(mesh["dims"], r["coords"], strict=True)), r["note"]) for r in noted[:8]]
    if len(noted) > 8:
        out.append(("...", f"and {len(noted) - 8} more ranks with a note"))
    return out


def _rank_title(mesh: MeshWire, r: RankWire) -> str:
    coords = ",".join(f"{d}={c}" for d, c in zip(mesh["dims"], r["coords"], strict=True))
    out = f"rank {r['rank']} [{coords}] {r['state']}"
    if r["inflight"]:
        out += f", {r['inflight']} call(s)"
    if r["failure"]:
        out += f": {r['failure']['detail']}"
    if r.get("note"):
        out += f" ({r['note']})"
    return out


def text_table(meshes: list[MeshWire]) -> str:
    """Plain text: one line per mesh, then its grid of state letters (F = failed ...)."""
    if not meshes:
        return "jupyter_mesh: no proc mesh yet"
    letter = {s: s[0].upper() if s != "stopped" else "-" for s in STATES}
    letter["starting"] = "."
    out = []
    for m in meshes:
        out.append(
            f"{m['name']} [{shape_label(m)}]{' stopped' if m['stopped'] else ''}: {_counts(m)}; "
            f"{m['inflight']} call(s) in flight"
        )
        if job_line(m):
            out.append("  " + job_line(m))
        if m["gather"]:
            out.append("  " + calls_line(m))
            out += [
                f"    rank {w['rank']} [{w['label']}] not answered: {w['where']}"
                for w in m["gather"].get("waits") or []
            ]
        for host, slices in host_groups(m):
            pad = "  "
            if host is not None:
                out.append("  " + host_line(host, sum(len(row) for _, rows in slices for row in rows)))
                pad = "    "
            for label, rows in slices:
                if label:
                    out.append(f"{pad}{label}")
                out.extend(pad + " ".join(letter[r["state"]] for r in row) for row in rows)
        out.extend(f"  failed [{labels}] {detail}" for labels, _, detail in fold_failures(m))
        out.extend(f"  [{label}] {note}" for label, note in _notes(m))
    return "\n".join(out)
