"""The mesh in a terminal, with rich: a coloured grid per mesh, counts, failures, and a live spawn
progress bar. ``jupyter-mesh status`` and the demo print these; so can any script::

    from jupyter_mesh.ui.terminal import print_status, spawn_progress
    with spawn_progress():
        procs = this_host().spawn_procs(per_host={"gpus": 8})
    print_status()
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .._core.state import MeshEvent, ProcState
from .table import COLOURS, HOST_COLOURS, calls_line, fold_failures, host_groups, job_line, shape_label
from .wire import STATES, MeshWire

__all__ = ["mesh_renderable", "print_status", "render", "spawn_progress"]


def _legend(m: MeshWire) -> Text:
    t = Text()
    for s in STATES:
        n = m["counts"].get(s, 0)
        if n:
            t.append(f" {n} {s} ", style=f"bold white on {COLOURS[s]}")
            t.append(" ")
    t.append(f"{m['inflight']} call(s) in flight", style="dim")
    return t


def mesh_renderable(m: MeshWire) -> RenderableType:
    """One mesh: a header line, its job (a scheduler's), a grid of ranks coloured by state (under a
    line per host: its address and state, when there are several or one elsewhere), then its recent
    failures."""
    shape = shape_label(m)
    parts: list[RenderableType] = [_legend(m)]
    if m["spawn"]["done"] < m["spawn"]["total"] and not m["stopped"]:
        parts.append(Text(f"spawning: {m['spawn']['done']}/{m['spawn']['total']} procs up", style="yellow"))
    if job_line(m):
        parts.append(Text(job_line(m), style="bold"))
    if m["gather"]:
        parts.append(Text(calls_line(m), style="cyan"))
        for w in m["gather"].get("waits") or []:  # a long call: where its ranks left are
            parts.append(Text(f"  rank {w['rank']} [{w['label']}] not answered: {w['where']}", style="cyan"))
    for host, slices in host_groups(m):
        if host is not None:
            n = sum(len(row) for _, rows in slices for row in rows)
            colour = HOST_COLOURS.get(host["state"], COLOURS["stopped"])
            head = Text.assemble(
                (f" {host['state']} ", f"bold white on {colour}"),
                f" host {host['index']} \u00b7 ",
                (host["address"], "bold"),
                f" \u00b7 {n} proc{'s' if n != 1 else ''}",
            )
            if host["why"]:
                head.append(f": {host['why']}", style=colour)
            parts.append(head)
        for label, rows in slices:
            grid = Table.grid(padding=(0, 1))
            if label:
                parts.append(Text(label, style="dim"))
            for row in rows:
                grid.add_row(*(Text(f"{r['rank']:>3}", style=f"bold white on {COLOURS[r['state']]}") for r in row))
            parts.append(grid)
    for labels, kind, detail in fold_failures(m):
        parts.append(Text(f"✗ [{labels}] {kind}: {detail}", style=COLOURS["failed"]))
    title = Text.assemble((m["name"], "bold"), f" {shape}" + (" (stopped)" if m["stopped"] else ""))
    return Panel(Group(*parts), title=title, title_align="left", expand=False)


def render(meshes: list[MeshWire]) -> RenderableType:
    if not meshes:
        return Text("no proc mesh", style="dim")
    return Group(*(mesh_renderable(m) for m in meshes))


def print_status(meshes: list[MeshWire] | None = None, console: Console | None = None) -> None:
    """Print the meshes of this program (or the given snapshots)."""
    if meshes is None:
        from .hub import hub

        meshes = hub().meshes()
    (console or Console()).print(render(meshes))


@contextlib.contextmanager
def spawn_progress(console: Console | None = None) -> Iterator[Progress]:
    """Inside this block, each mesh being spawned gets a bar: procs up / procs, live from events."""
    from ..lowlevel import subscribe

    progress = Progress(
        TextColumn("spawning [b]{task.description}[/b]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console or Console(),
        transient=False,
    )
    tasks: dict[str, TaskID] = {}
    left: dict[str, int] = {}
    lock = threading.Lock()
    all_up = threading.Event()

    def on_event(ev: MeshEvent) -> None:  # the runtime's receive thread: rich's update is quick
        with lock:
            if ev.kind == "created":
                from ..lowlevel import proc_mesh

                total = len(proc_mesh(ev.mesh_id).state().ranks)
                tasks[ev.mesh_id] = progress.add_task(ev.name, total=total)
                left[ev.mesh_id] = total
                all_up.clear()
            elif ev.kind == "state" and ev.previous == ProcState.STARTING and ev.mesh_id in tasks:
                progress.advance(tasks[ev.mesh_id])
                left[ev.mesh_id] -= 1
                if not any(left.values()):
                    all_up.set()

    with progress:
        unsubscribe = subscribe(on_event)
        try:
            yield progress
            if tasks:
                all_up.wait(2.0)  # spawn_procs returns as the last procs report in: show them up
        finally:
            unsubscribe()
