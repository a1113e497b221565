"""The notebook's views of a mesh in a real `mesh` kernel, through jupyter_client (issue 16): progress of
a running call reaches the sidebar's comm (point 3); the sidebar's Stop mesh is `%mesh down` (point 5);
a finished cell's `%mesh status` is a snapshot of its moment, the live widget only on request (point 6)."""

from __future__ import annotations

import re
import time

import pytest
from _kernel import isolate_jupyter_dirs
from _procs import descendants, wait_dead
from _ui_kernel import Kernel

from jupyter_mesh.ui import TARGET

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

GATE = """
import os, time
from jupyter_mesh import Actor, endpoint, current_rank

class Gate(Actor):
    @endpoint
    def wait(self, path, free):
        rank = current_rank().rank
        deadline = time.monotonic() + 120
        while rank not in free and not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return rank
"""


@pytest.fixture(scope="module")
def kernel():
    isolate_jupyter_dirs()
    k = Kernel("mesh")
    yield k
    assert not k.shutdown_reaped(), "the kernel left processes behind"


def _run(k: Kernel, code: str, timeout: float = 60) -> list[dict]:
    """Run a cell; its IOPub messages (those with its parent header)."""
    start = len(k.iopub)
    msg_id = k.kc.execute(code)
    done = k.wait(
        lambda: any(
            m["parent_header"].get("msg_id") == msg_id
            and m["msg_type"] == "status"
            and m["content"]["execution_state"] == "idle"
            for m in k.iopub[start:]
        ),
        timeout,
    )
    assert done, f"no idle after {timeout} s running {code!r}"
    mine = [m for m in k.iopub[start:] if m["parent_header"].get("msg_id") == msg_id]
    errors = [m["content"] for m in mine if m["msg_type"] == "error"]
    assert not errors, f"cell failed: {code!r}: {errors[0]['ename']}: {errors[0]['evalue']}"
    return mine


def _text(msgs: list[dict]) -> str:
    return "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")


def _displays(msgs: list[dict]) -> list[dict]:
    return [m["content"]["data"] for m in msgs if m["msg_type"] in ("display_data", "execute_result")]


def _channel(k: Kernel) -> str:
    comm_id = k.comm_open(TARGET)
    assert k.wait(
        lambda: any(
            m["msg_type"] == "comm_msg" and m["content"]["data"].get("type") == "snapshot"
            for m in k.iopub
            if m["content"].get("comm_id") == comm_id
        ),
        20,
    ), "no snapshot on the sidebar's channel"
    return comm_id


def _act(k: Kernel, comm_id: str, action: str, mesh_id: str, rank: int | None = None) -> dict:
    req_id = f"{action}-{time.monotonic()}"
    k.comm_send(comm_id, {"type": "action", "id": req_id, "action": action, "mesh_id": mesh_id, "rank": rank})

    def result() -> list[dict]:
        return [
            m["content"]["data"]
            for m in k.iopub
            if m["content"].get("comm_id") == comm_id and m["content"].get("data", {}).get("id") == req_id
        ]

    res = k.wait(result, 60)
    assert res, f"no result for {action}"
    return res[0]


def test_progress_of_a_running_call_reaches_the_sidebar_and_status(kernel, tmp_path):
    k = kernel
    _run(k, "%mesh up --gpus 2 --name prog")
    comm_id = _channel(k)
    _run(k, GATE + "g = prog.spawn('g', Gate)\ng.initialized.get(30)")
    opened = tmp_path / "open"
    _run(k, f"fut = g.wait.call({str(opened)!r}, [0])")  # rank 0 answers, rank 1 waits for the file
    try:
        done = k.wait(lambda: ((k.sidebar_mesh(comm_id, "prog") or {}).get("gather") or {}).get("done") == 1, 30)
        assert done, k.sidebar_mesh(comm_id, "prog")
        m = k.sidebar_mesh(comm_id, "prog")
        assert m is not None and m["gather"]["total"] == 2 and m["gather"]["left"] == [1]
        assert [r["state"] for r in m["ranks"]] == ["idle", "busy"]
        html = "".join(d.get("text/html", "") for d in _displays(_run(k, "%mesh status")))
        assert "1/2 done, left: 1 (" in html, html
        assert "fut.done()=False" in _text(_run(k, "print(f'{fut.done()=}')"))
    finally:
        opened.touch()
    assert "[0, 1]" in _text(_run(k, "print(list(fut.get(30).values()))"))
    _run(k, "%mesh down prog")


def test_the_sidebars_stop_is_mesh_down(kernel):
    """After Stop mesh in the sidebar, the magics agree: status has no such mesh, its variable is gone,
    `%mesh up` brings it up again, and its agent and template (and procs) are gone."""
    k = kernel
    pid = k.km.provisioner.process.pid
    before = descendants(pid)
    _run(k, "%mesh up --gpus 2 --name side")
    workers = descendants(pid) - before  # its agent, template and procs
    assert len(workers) >= 4, workers
    comm_id = _channel(k)
    mesh = k.sidebar_mesh(comm_id, "side")
    assert mesh is not None
    res = _act(k, comm_id, "stop", mesh["mesh_id"])
    assert res["ok"], res
    assert not wait_dead(workers, 10), "the agent, template or procs outlived Stop mesh"
    assert "no mesh is up" in _text(_run(k, "%mesh status"))
    assert "False" in _text(_run(k, "print('side' in globals())"))
    assert "mesh 'side' is up" in _text(_run(k, "%mesh up --gpus 2 --name side"))
    assert re.search(r"side \*\s+hosts=1, gpus=2\s+2 idle", _text(_run(k, "%mesh status")))
    _run(k, "%mesh down side")


def test_a_status_cell_is_a_snapshot_and_the_widget_says_it_is_live(kernel):
    k = kernel
    _run(k, "%mesh up --gpus 2 --name snap")
    first = _displays(_run(k, "%mesh status"))
    assert len(first) == 1 and WIDGET_MIME not in first[0], first
    assert "2 idle" in first[0]["text/html"] and "snapshot at" in first[0]["text/html"]
    # nothing of it stays live: no widget was made for it, so nothing will update it later
    assert not [m for m in k.iopub if m["msg_type"] == "comm_open" and "jupyter.widget" in m["content"]["target_name"]]
    _run(k, "%mesh kill gpus=1")
    assert k.wait(lambda: "1 (" in _text(_run(k, "%mesh status")), 10)
    later = _displays(_run(k, "%mesh status"))
    assert "1 failed" in later[0]["text/html"] and "1 idle" in later[0]["text/html"]
    # a ProcMesh as a cell's value: a snapshot too
    value = _displays(_run(k, "snap"))
    assert WIDGET_MIME not in value[0] and "1 failed" in value[0]["text/html"], value
    # the live view is asked for
    live = _displays(_run(k, "from jupyter_mesh import ui\nui.widget(snap)"))
    assert WIDGET_MIME in live[0], live
    _run(k, "%mesh down snap")


def test_hosts_reach_the_sidebar_and_a_lost_one_says_why(kernel):
    """Two local agents are two hosts: the sidebar's channel carries each (address, state) with its ranks;
    one killed turns "lost" with its cause, in the next update and in a snapshot (a ProcMesh's value)."""
    k = kernel
    _run(
        k,
        "from jupyter_mesh import LocalJob\nhjob = LocalJob(hosts=2)\n"
        "hh = hjob.host_mesh().spawn_procs(per_host={'gpus': 1}, name='hh')",
    )
    try:
        comm_id = _channel(k)
        m = k.sidebar_mesh(comm_id, "hh")
        assert m is not None
        assert [(h["index"], h["address"], h["state"]) for h in m["hosts"]] == [(0, "local", "up"), (1, "local", "up")]
        assert [r["host"] for r in m["ranks"]] == [0, 1]
        assert m["job"] == {"kind": "local", "id": None, "keep_alive": False}
        _run(k, "import os, signal\nos.kill(hjob.pids()[1], signal.SIGKILL)")

        def host_1() -> dict:
            return ((k.sidebar_mesh(comm_id, "hh") or {}).get("hosts") or [{}, {}])[1]

        assert k.wait(lambda: host_1().get("state") == "lost", 20), k.sidebar_mesh(comm_id, "hh")
        assert "killed by SIGKILL" in host_1()["why"], host_1()
        html = "".join(d.get("text/html", "") for d in _displays(_run(k, "hh")))  # a snapshot, as %mesh status shows
        assert "data-host='1' data-host-state='lost'" in html and "killed by SIGKILL" in html, html
    finally:
        _run(k, "hh.stop(); hjob.stop()")
