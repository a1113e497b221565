"""A ValueMesh drawn for a notebook: a grid along its last two dims (one grid per combination of the
dims before them), numbers shaded as a heat map, errors in red, long values cut short with the full
text on hover. Inline styles only: notebook sanitisers keep them. Plain ``repr`` stays for terminals.
"""

from __future__ import annotations

import html
import math
from typing import Any

from .._core.value_mesh import ValueMesh
from ..errors import Failure, RemoteFailure
from .table import TIMES

__all__ = ["value_mesh_html"]

MAX_CELLS = 1024  # a bigger mesh shows its first cells and says how many more there are
MAX_TEXT = 40  # characters of a value shown in its cell (the rest on hover)
_CELL = "padding:2px 6px;border:1px solid #ddd;text-align:right;font-family:monospace;font-size:12px"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_error(v: Any) -> bool:
    """An exception, a rank's failure, or what a rank raised as text (``%%mesh``'s CellError)."""
    if isinstance(v, (BaseException, Failure, RemoteFailure)):
        return True
    return isinstance(getattr(v, "exc_type", None), str) and isinstance(getattr(v, "traceback", None), str)


def _text(v: Any) -> tuple[str, str]:
    """What a cell shows, and what its hover adds (a remote traceback, for what a rank raised)."""
    if isinstance(v, str):
        return v, ""
    if isinstance(v, Failure):
        return f"{v.kind}: {v.detail}", v.traceback
    if isinstance(v, BaseException):
        return f"{type(v).__name__}: {v}" if str(v) else type(v).__name__, ""
    if _is_error(v):  # RemoteFailure, %%mesh's CellError
        return f"{v.exc_type}: {v.message}" if v.message else v.exc_type, v.traceback
    return repr(v), ""


def _cell(v: Any, lo: float, hi: float) -> str:
    text, more = _text(v)
    title = html.escape(text[:1000] + (f"\n\n{more.rstrip()[-2000:]}" if more.strip() else ""), quote=True)
    shown = html.escape(text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…")
    style = _CELL
    if _is_error(v):
        style += ";color:#c62828;font-weight:bold"
    elif _is_number(v) and hi > lo:
        share = (float(v) - lo) / (hi - lo)  # light to saturated blue
        style += f";background:hsl(210,80%,{int(95 - 45 * share)}%)"
        if share > 0.7:
            style += ";color:white"
    return f'<td style="{style}" title="{title}">{shown}</td>'


def value_mesh_html(vm: ValueMesh[Any]) -> str:
    dims, sizes = list(vm.sizes), list(vm.sizes.values())
    values = list(vm.values())
    numbers = [float(v) for v in values if _is_number(v)]
    lo, hi = (min(numbers), max(numbers)) if numbers else (0.0, 0.0)
    head = f"<div style='font-size:12px'><b>ValueMesh</b> {html.escape(f' {TIMES} '.join(f'{d}={s}' for d, s in vm.sizes.items()) or '(one value)')}"
    if numbers and hi > lo:
        head += f" &mdash; min {lo:.4g}, max {hi:.4g}"
    head += "</div>"
    if not dims:
        return head + f"<table style='border-collapse:collapse'><tr>{_cell(values[0], lo, hi)}</tr></table>"
    cols = sizes[-1]
    rows = sizes[-2] if len(dims) >= 2 else 1
    lead = dims[:-2] if len(dims) > 2 else []
    parts = [head]
    shown = values[:MAX_CELLS]
    per_grid = rows * cols
    for start in range(0, len(shown), per_grid):
        chunk = shown[start : start + per_grid]
        if lead:
            coords, rest = [], start // per_grid
            for size in reversed(sizes[: len(lead)]):
                coords.append(rest % size)
                rest //= size
            label = ",".join(f"{d}={c}" for d, c in zip(lead, reversed(coords), strict=True))
            parts.append(f"<div style='font-size:11px;color:#666'>{html.escape(label)}</div>")
        col_head = "".join(f"<th style='{_CELL};color:#666'>{html.escape(dims[-1])}={c}</th>" for c in range(cols))
        body = []
        for r in range(0, len(chunk), cols):
            row_label = (
                f"<th style='{_CELL};color:#666'>{html.escape(dims[-2])}={r // cols}</th>" if len(dims) >= 2 else ""
            )
            body.append("<tr>" + row_label + "".join(_cell(v, lo, hi) for v in chunk[r : r + cols]) + "</tr>")
        corner = "<th></th>" if len(dims) >= 2 else ""
        parts.append(f"<table style='border-collapse:collapse'><tr>{corner}{col_head}</tr>{''.join(body)}</table>")
    if len(values) > MAX_CELLS:
        parts.append(f"<div style='font-size:11px;color:#666'>… {len(values) - MAX_CELLS} more values</div>")
    return "".join(parts)
