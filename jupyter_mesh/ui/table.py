"""The mesh as a static table: what a notebook shows where widgets are not available (nbconvert,
GitHub, a front end without ipywidgets), and the plain-text repr everywhere.

Renders the same :class:`~jupyter_mesh.ui.wire.MeshWire` snapshots as the widget and the sidebar.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterator

from .wire import STATES, MeshWire, RankWire

__all__ = ["COLOURS", "TIMES", "calls_line", "grid_slices", "html_table", "shape_label", "text_table"]

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


def grid_slices(mesh: MeshWire) -> Iterator[tuple[str, list[list[RankWire]]]]:
    """The mesh as 2-d grids: (label of the leading coords, rows of ranks) per slice.

    The last two dims are rows x columns; every combination of the dims before them is one slice
    (``hosts=1`` for a hosts x nodes x gpus mesh). One dim is a single row; zero dims one cell.
    """
    dims, sizes = mesh["dims"], mesh["sizes"]
    cols = sizes[-1] if dims else 1
    rows = sizes[-2] if len(dims) >= 2 else 1
    lead = len(dims) - 2 if len(dims) > 2 else 0
    per_slice = rows * cols
    ranks = sorted(mesh["ranks"], key=lambda r: r["rank"])
    for start in range(0, len(ranks), per_slice):
        chunk = ranks[start : start + per_slice]
        label = ",".join(f"{d}={c}" for d, c in zip(dims[:lead], chunk[0]["coords"][:lead], strict=True))
        yield label, [chunk[i : i + cols] for i in range(0, len(chunk), cols)]


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
        if m["gather"]:
            parts.append(f"<div data-calls='{m['gather']['done']}/{m['gather']['total']}'>{esc(calls_line(m))}</div>")
        for label, rows in grid_slices(m):
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
        for f in m["failures"]:
            parts.append(f"<div style='color:{COLOURS['failed']}'>[{esc(f['label'])}] {esc(f['detail'])}</div>")
        for label, note in _notes(m):
            parts.append(f"<div style='font-size:90%'>[{esc(label)}] {esc(note)}</div>")
    return "\n".join(parts)


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
        if m["gather"]:
            out.append("  " + calls_line(m))
        for label, rows in grid_slices(m):
            if label:
                out.append(f"  {label}")
            out.extend("  " + " ".join(letter[r["state"]] for r in row) for row in rows)
        out.extend(f"  failed [{f['label']}] {f['detail']}" for f in m["failures"])
        out.extend(f"  [{label}] {note}" for label, note in _notes(m))
    return "\n".join(out)
