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


def test_a_costly_flush_spaces_the_next_within_the_views_budget():
    """A 16k-rank snapshot costs the hub ~0.3 s: the views then update less often, not ten times a second."""
    from jupyter_mesh.ui.hub import BUDGET, next_pause

    assert next_pause(0.1, 0.005) == 0.1  # 256 ranks: ten frames a second
    assert next_pause(0.1, 0.3) == 0.3 / BUDGET  # 16k ranks: at most BUDGET of a core


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


# -- hosts ------------------------------------------------------------------------------------------
A, B = "tcp://10.213.0.3:41234", "tcp://10.213.0.4:41234"
LOST_WHY = "host 10.213.0.4 unreachable for 3.1 s (no answer to heartbeats); SLURM job 12 is <b>NODE_FAIL</b>"


def _two_hosts(job: dict | None = None, agents=(A, B)) -> StateTracker:
    t = StateTracker()
    sizes = {"hosts": 2, "gpus": 4}
    t.created("m", "train", sizes, _coords(sizes), list(agents), [r // 4 for r in range(8)], job)
    for r in range(8):
        t.ready("m", r, 100 + r)
    return t


def _lose_host_1(t: StateTracker) -> None:
    t.host_lost(B, "unreachable", LOST_WHY)
    for r in range(4, 8):
        t.failed("m", r, Failure("train", {"hosts": 1, "gpus": r - 4}, "agent", f"the host agent at {B} is lost"))


def test_ranks_grouped_by_host_with_address_state_and_job_in_every_view():
    from jupyter_mesh.ui.table import host_groups, show_hosts

    t = _two_hosts({"kind": "slurm", "id": "12", "keep_alive": True})
    _lose_host_1(t)
    w = mesh_wire(t.snapshot("m"))
    assert w["hosts"][1] == {"index": 1, "address": "10.213.0.4", "state": "unreachable", "why": LOST_WHY}
    assert w["job"] == {"kind": "slurm", "id": "12", "keep_alive": True}
    assert [r["host"] for r in w["ranks"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert show_hosts(w)
    groups = host_groups(w)
    assert [(h and h["address"], [[r["rank"] for r in row] for _, rows in s for row in rows]) for h, s in groups] == [
        ("10.213.0.3", [[0, 1, 2, 3]]),
        ("10.213.0.4", [[4, 5, 6, 7]]),
    ]
    text = text_table([w])
    assert "  SLURM job 12 \u00b7 kept alive past this kernel" in text
    assert "  host 0 \u00b7 10.213.0.3 \u00b7 up \u00b7 4 procs\n    I I I I" in text
    assert f"  host 1 \u00b7 10.213.0.4 \u00b7 unreachable \u00b7 4 procs: {LOST_WHY}\n    F F F F" in text
    # the host's 4 ranks failed with one cause: one line names them all
    labels = "; ".join(f"hosts=1,gpus={g}" for g in range(4))
    assert text.count("failed [") == 1 and f"failed [{labels}] the host agent at {B} is lost" in text
    html = html_table([w])
    assert "data-job='slurm'" in html and "SLURM job 12 \u00b7 kept alive past this kernel" in html
    assert "data-host='0' data-host-state='up'" in html and "<b>10.213.0.4</b>" in html
    assert "data-host='1' data-host-state='unreachable'" in html and "&lt;b&gt;NODE_FAIL&lt;/b&gt;" in html
    assert "<b>NODE_FAIL" not in html and html.count("<td") == 8
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(render([w]))
    out = buf.getvalue()
    assert "SLURM job 12 \u00b7 kept alive past this kernel" in out
    assert "up  host 0 \u00b7 10.213.0.3 \u00b7 4 procs" in out and "unreachable  host 1 \u00b7 10.213.0.4" in out
    assert "NODE_FAIL" in out


def test_a_hosts_grid_spans_its_own_dims():
    from jupyter_mesh.ui.table import host_groups

    t = StateTracker()
    sizes = {"hosts": 2, "nodes": 2, "gpus": 3}
    t.created("m", "big", sizes, _coords(sizes), [A, B], [r // 6 for r in range(12)])
    groups = host_groups(mesh_wire(t.snapshot("m")))
    # each host: nodes x gpus as 2 rows of 3, no slice label (hosts is the group)
    assert [[(label, [[r["rank"] for r in row] for row in rows]) for label, rows in s] for _, s in groups] == [
        [("", [[0, 1, 2], [3, 4, 5]])],
        [("", [[6, 7, 8], [9, 10, 11]])],
    ]


def test_one_local_host_and_old_snapshots_render_as_before():
    from jupyter_mesh.ui.table import show_hosts

    plain = StateTracker()
    sizes = {"hosts": 1, "gpus": 4}
    plain.created("m", "one", sizes, _coords(sizes))
    local = StateTracker()
    local.created("m", "one", sizes, _coords(sizes), ["ipc:///run/jm/agent-0"], [0] * 4, {"kind": "local"})
    before, now = mesh_wire(plain.snapshot("m")), mesh_wire(local.snapshot("m"))
    assert now["hosts"][0]["address"] == "local" and not show_hosts(now)
    assert text_table([now]) == text_table([before]) and html_table([now]) == html_table([before])
    # a snapshot from a kernel that sent no hosts (an older jupyter_mesh): the views read it as before
    old = mesh_wire(_two_hosts().snapshot("m"))
    for key in ("hosts", "job"):
        del old[key]  # type: ignore[misc]
    for r in old["ranks"]:
        del r["host"]  # type: ignore[misc]
    assert not show_hosts(old) and "host 0" not in text_table([old]) and "I I I I" in text_table([old])
    # one host elsewhere (an address worth reading) or one lost (its cause) gets its line
    one = StateTracker()
    one.created("m", "one", sizes, _coords(sizes), [A], [0] * 4, {"kind": "attach"})
    remote = mesh_wire(one.snapshot("m"))
    assert show_hosts(remote)
    assert "  attached agents\n  host 0 \u00b7 10.213.0.3 \u00b7 up \u00b7 4 procs" in text_table([remote])
    local.host_lost("ipc:///run/jm/agent-0", "lost", "its process (pid 7) killed by SIGKILL")
    assert "host 0 \u00b7 local \u00b7 lost \u00b7 4 procs: its process (pid 7) killed by SIGKILL" in text_table(
        [mesh_wire(local.snapshot("m"))]
    )


def test_a_lost_host_reaches_views_in_the_next_update():
    t = _two_hosts()
    hub = Hub(interval=0.05, source=TrackerSource(t))
    batches: list[list] = []
    remove = hub.add_view(lambda changed, gone: batches.append(changed))
    try:
        _lose_host_1(t)
        assert wait_for(lambda: batches and batches[-1][0]["counts"]["failed"] == 4, 3)
        assert batches[-1][0]["hosts"][1]["state"] == "unreachable"
        assert batches[-1][0]["hosts"][1]["why"] == LOST_WHY
    finally:
        remove()


def test_status_rows_name_hosts_and_job():
    from jupyter_mesh._core.state import HostInfo, HostState, MeshState
    from jupyter_mesh.notebook.meshes import _hosts_cell

    def cell(hosts, job=None):
        return _hosts_cell(MeshState("m", "m", {}, (), hosts=tuple(hosts), job=job))

    up = HostInfo(0, "ipc:///run/jm/agent-0")
    assert cell([up], {"kind": "local", "id": None, "keep_alive": False}) == "local"
    two = [HostInfo(0, A), HostInfo(1, B, HostState.UNREACHABLE, "silent")]
    assert (
        cell(two, {"kind": "slurm", "id": "12", "keep_alive": True})
        == "SLURM job 12 (kept alive): 10.213.0.3 up, 10.213.0.4 unreachable"
    )
    assert cell(two[:1], {"kind": "attach", "id": None, "keep_alive": False}) == "attached: 10.213.0.3"
    assert cell([]) == "-"


def test_status_lists_scheduler_jobs_with_hosts_and_keep_alive(tmp_path, monkeypatch):
    import json
    import os

    from jupyter_mesh.ui.remote import scheduler_jobs

    monkeypatch.setenv("JUPYTER_MESH_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "")  # no squeue here: the line says what the record says
    (tmp_path / "jobs").mkdir()
    rec = {"scheduler": "slurm", "job_id": "12", "nodes": 2, "hosts": ["10.213.0.3", "10.213.0.4"]}
    (tmp_path / "jobs" / "a.json").write_text(json.dumps({**rec, "controller_pid": os.getpid()}))
    (tmp_path / "jobs" / "b.json").write_text(
        json.dumps({**rec, "job_id": "13", "controller_pid": 2**22 + 7, "keep_alive": True})  # a pid no one has
    )
    assert scheduler_jobs() == [
        f"slurm job 12: 2 host(s) (10.213.0.3, 10.213.0.4); controller pid {os.getpid()}",
        f"slurm job 13: 2 host(s) (10.213.0.3, 10.213.0.4); controller pid {2**22 + 7} is gone: "
        "kept alive past its kernel, it runs on",
    ]
