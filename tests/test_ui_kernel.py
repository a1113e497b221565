"""The sidebar comm and the widget's state, in a real kernel, without a browser: what a front end
receives (comm messages through jupyter_client), and what its actions do to real procs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from _ui_kernel import Kernel

from jupyter_mesh.ui import TARGET

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel()
    yield k
    assert not k.shutdown_reaped(), "the kernel left processes behind"


def _data(k: Kernel, comm_id: str, kind: str) -> list[dict]:
    return [
        m["content"]["data"]
        for m in k.comm_msgs(comm_id)
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("type") == kind
    ]


def _widget_meshes(k: Kernel, comm_id: str) -> list[dict]:
    latest: list[dict] = []
    for m in k.comm_msgs(comm_id):
        state = m["content"].get("data", {}).get("state", {})
        if "meshes" in state:
            latest = state["meshes"]
    return latest


def _act(k: Kernel, comm_id: str, action: str, mesh_id: str, rank: int | None, timeout: float = 60) -> dict:
    req_id = f"{action}-{time.monotonic()}"
    k.comm_send(comm_id, {"type": "action", "id": req_id, "action": action, "mesh_id": mesh_id, "rank": rank})
    res = k.wait(lambda: [d for d in _data(k, comm_id, "result") if d["id"] == req_id], timeout)
    assert res, f"no result for {action}"
    return res[0]


def test_sidebar_and_widget_over_comms(kernel):
    k = kernel
    # before the extension: the target is missing, the kernel closes the comm ("not a mesh kernel")
    early = k.comm_open(TARGET)
    assert k.wait(lambda: any(m["msg_type"] == "comm_close" for m in k.comm_msgs(early)), 10)

    k.execute("%load_ext jupyter_mesh.ui")
    announced = k.wait(
        lambda: [m for m in k.iopub if m["msg_type"] == "comm_open" and m["content"]["target_name"] == TARGET], 10
    )
    assert announced, "load_ext must open a channel towards front ends already connected"
    ann_id = announced[0]["content"]["comm_id"]
    chan = k.comm_open(TARGET)
    snap = k.wait(lambda: _data(k, chan, "snapshot"), 10)
    assert snap and snap[0] == {"type": "snapshot", "kernel": "python", "meshes": []}
    assert k.wait(lambda: _data(k, ann_id, "snapshot"), 10)

    k.execute(
        "from jupyter_mesh import ui, this_host\n"
        "w = ui.widget()\n"
        "pm = this_host().spawn_procs(per_host={'gpus': 4}, name='m')"
    )
    mesh = k.wait(lambda: (m := k.sidebar_mesh(chan, "m")) and m["counts"]["idle"] == 4 and m, 10)
    assert mesh, k.sidebar_mesh(chan, "m")
    assert mesh["dims"] == ["gpus"] and mesh["sizes"] == [4] and mesh["spawn"] == {"done": 4, "total": 4}
    assert k.sidebar_mesh(ann_id, "m") is not None  # both channels hear it
    widget_open = [
        m for m in k.iopub if m["msg_type"] == "comm_open" and "meshes" in m["content"]["data"].get("state", {})
    ]
    assert len(widget_open) == 1
    wid = widget_open[0]["content"]["comm_id"]
    assert k.wait(lambda: [m for m in _widget_meshes(k, wid) if m["counts"]["idle"] == 4], 10)
    # updates are batched: a 4-proc spawn is 5 events, but few messages
    assert len([d for d in _data(k, chan, "update") if any(m["name"] == "m" for m in d["meshes"])]) <= 4

    # a proc dies: both views say so, with its cause (the signal: its exit was seen, no heartbeat verdict)
    k.execute("import os, signal; os.kill(pm.pids()[2], signal.SIGKILL)")
    assert k.wait(lambda: (m := k.sidebar_mesh(chan, "m")) and m["ranks"][2]["state"] == "failed", 10)
    assert k.wait(lambda: [m for m in _widget_meshes(k, wid) if m["ranks"][2]["state"] == "failed"], 10)
    failed = k.sidebar_mesh(chan, "m")
    assert failed["ranks"][2]["failure"]["signal"] == 9 and "SIGKILL" in failed["failures"][-1]["detail"]
    assert failed["ranks"][2]["failure"]["kind"] == "signal", failed["ranks"][2]

    # actions go through the public API; respawn brings the rank back
    res = _act(k, chan, "respawn", mesh["mesh_id"], 2)
    assert res["ok"] and res["lines"] == ["2"], res
    assert k.wait(lambda: (m := k.sidebar_mesh(chan, "m")) and m["counts"]["idle"] == 4, 5)
    k.execute("print('hello from rank', pm.state().ranks[0].rank)")
    res = _act(k, chan, "kill", mesh["mesh_id"], 1)
    assert res["ok"], res
    assert k.wait(lambda: (m := k.sidebar_mesh(chan, "m")) and m["ranks"][1]["state"] == "failed", 5)
    assert "killed on request" in k.sidebar_mesh(chan, "m")["ranks"][1]["failure"]["detail"]
    res = _act(k, chan, "kill", "no-such-mesh", 0)
    assert not res["ok"] and "no proc mesh with id" in res["error"]
    res = _act(k, chan, "logs", mesh["mesh_id"], None)
    assert res["ok"] and isinstance(res["lines"], list)

    # jupyter-mesh status asks the kernel over the same comm and renders it with rich
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_mesh.cli", "status", k.km.connection_file],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "python kernel" in out.stdout and "m gpus=4" in out.stdout and "1 failed" in out.stdout

    res = _act(k, chan, "stop", mesh["mesh_id"], None)
    assert res["ok"], res
    assert k.wait(lambda: k.sidebar_mesh(chan, "m") is None, 5)  # the sidebar drops stopped meshes
    assert k.wait(lambda: [m for m in _widget_meshes(k, wid) if m["stopped"]], 5)  # the widget greys it
