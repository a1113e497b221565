"""The views' model without a kernel or browser: wire snapshots, tables, rich output, the hub's
coalescing of event bursts, call progress and recent failures (a bare StateTracker, no processes)."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time

from _procs import wait_for
from rich.console import Console

from jupyter_mesh import Failure, ProcState
from jupyter_mesh._core.state import MeshState, StateTracker
from jupyter_mesh.ui.hub import Hub
from jupyter_mesh.ui.table import grid_slices, html_table, text_table
from jupyter_mesh.ui.terminal import render
from jupyter_mesh.ui.wire import mesh_wire


class TrackerSource:
    def __init__(self, tracker: StateTracker):
        self.t = tracker

    def subscribe(self, listener):
        return self.t.subscribe(listener)

    def state(self, mesh_id: str) -> MeshState:
        return self.t.snapshot(mesh_id)

    def states(self, include_stopped: bool) -> list[MeshState]:
        return [s for s in map(self.t.snapshot, self.t.mesh_ids()) if include_stopped or not s.stopped]


def _coords(sizes: dict[str, int]) -> list[dict[str, int]]:
    out = [{}]
    for d, n in sizes.items():
        out = [{**c, d: i} for c in out for i in range(n)]
    return out


def test_wire_and_tables_for_a_3d_mesh():
    t = StateTracker()
    sizes = {"hosts": 2, "nodes": 2, "gpus": 3}
    t.created("m", "big", sizes, _coords(sizes))
    for r in range(12):
        t.ready("m", r, 1000 + r)
    t.activity("m", [4], 1)
    t.failed(
        "m",
        7,
        Failure(
            "big",
            {"hosts": 1, "nodes": 0, "gpus": 1},
            "signal",
            "proc 1007 was killed by SIGKILL",
            traceback="Traceback: boom",
            signal=9,
        ),
    )
    w = mesh_wire(t.snapshot("m"))
    assert w["dims"] == ["hosts", "nodes", "gpus"] and w["sizes"] == [2, 2, 3]
    assert w["counts"]["idle"] == 10 and w["counts"]["busy"] == 1 and w["counts"]["failed"] == 1
    assert w["inflight"] == 1 and w["spawn"] == {"done": 12, "total": 12}
    assert w["ranks"][7]["coords"] == [1, 0, 1] and w["ranks"][7]["failure"]["signal"] == 9
    assert w["failures"][0]["label"] == "hosts=1,nodes=0,gpus=1"  # derived from the ranks: no history kept
    slices = list(grid_slices(w))
    assert [label for label, _ in slices] == ["hosts=0", "hosts=1"]
    assert [[r["rank"] for r in row] for row in slices[1][1]] == [[6, 7, 8], [9, 10, 11]]
    text = text_table([w])
    assert "big [hosts=2 \u00d7 nodes=2 \u00d7 gpus=3]" in text and "I F I" in text and "killed by SIGKILL" in text
    html = html_table([w])
    assert html.count("<td") == 12 and "#e53935" in html and "<script" not in html
    buf = io.StringIO()
    Console(file=buf, width=100, color_system=None).print(render([w]))
    out = buf.getvalue()
    assert "big" in out and "1 failed" in out and "10 idle" in out and "hosts=1" in out


def test_zero_and_one_dim_meshes_render():
    t = StateTracker()
    t.created("a", "one", {}, [{}])
    t.created("b", "row", {"gpus": 4}, _coords({"gpus": 4}))
    ws = [mesh_wire(t.snapshot("a")), mesh_wire(t.snapshot("b"))]
    assert [len(rows) for _, rows in grid_slices(ws[0])] == [1]
    assert [[len(r) for r in rows] for _, rows in grid_slices(ws[1])] == [[4]]
    assert ws[1]["spawn"] == {"done": 0, "total": 4}
    assert "1 proc" in text_table(ws) and ". . . ." in text_table(ws)
    assert "no proc mesh" in text_table([])


def _calls(wire):
    g = wire["gather"]
    return g and (g["done"], g["total"], g["left"])


def test_hub_coalesces_bursts_and_tracks_calls_and_failures():
    t = StateTracker()
    hub = Hub(interval=0.1, source=TrackerSource(t))
    batches: list[tuple[list, list]] = []
    got = threading.Event()

    def view(changed, gone):
        batches.append((changed, gone))
        got.set()

    remove = hub.add_view(view)
    try:
        n = 64
        t.created("m", "burst", {"gpus": n}, _coords({"gpus": n}))
        for r in range(n):  # a spawn: 65 events in well under the interval
            t.ready("m", r, r + 1)
        assert wait_for(lambda: batches and batches[-1][0][0]["counts"]["idle"] == n, 3)
        assert hub.flushes <= 3, f"{n + 1} events took {hub.flushes} updates"
        t.activity("m", list(range(8)), 1)  # a call to 8 ranks; 3 reply
        t.activity("m", [0, 1, 2], -1)
        assert wait_for(lambda: _calls(batches[-1][0][0]) == (3, 8, [3, 4, 5, 6, 7]), 3)
        ranks = batches[-1][0][0]["ranks"]
        assert ranks[3]["busy_since"] <= time.time() and ranks[0]["busy_since"] is None
        progress = t.snapshot("m").progress
        assert progress is not None and progress.done == (0, 1, 2) and progress.left == (3, 4, 5, 6, 7)
        assert str(progress).startswith("3/8 done, left: 3, 4, 5, 6, 7 (")
        t.failed("m", 5, Failure("burst", {"gpus": 5}, "exit", "proc exited with code 3", exit_code=3))
        t.activity("m", [3, 4, 6, 7], -1)
        assert wait_for(lambda: batches[-1][0][0]["gather"] is None, 3)  # every busy rank answered (or died)
        last = batches[-1][0][0]
        assert last["failures"][-1]["detail"] == "proc exited with code 3" and last["counts"]["failed"] == 1
        t.respawned("m", 5, 99)
        assert wait_for(lambda: batches[-1][0][0]["counts"]["failed"] == 0, 3)
        assert batches[-1][0][0]["failures"][-1]["rank"] == 5  # the history outlives the respawn
        t.stopped("m")
        assert wait_for(lambda: batches[-1][0][0]["stopped"], 3)
        assert hub.meshes() == [] and hub.meshes("m")[0]["stopped"]
    finally:
        remove()
    assert hub._stop is None and not t._listeners
    flushes = hub.flushes
    t.created("n", "after", {}, [{}])
    assert hub.flushes == flushes  # no view, no work


def test_importing_the_views_stays_light():
    code = (
        "import sys, jupyter_mesh, jupyter_mesh.ui; "
        "print([m for m in ('IPython', 'ipywidgets', 'anywidget', 'ipykernel', 'jupyter_client') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_state_values_match_the_wire():
    # the front end's copies (generated) are checked in tests/test_frontend_sources.py
    from jupyter_mesh.ui.table import COLOURS
    from jupyter_mesh.ui.wire import STATES

    assert list(STATES) == [s.value for s in ProcState] == list(COLOURS)
