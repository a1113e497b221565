"""Long calls and the sidebar's debugger requests (issue 15), in a real `mesh` kernel through jupyter_client.

- A cell waiting on a call longer than ``slow_call_after`` shows which ranks have not answered and where
  each is (its top frame of user code), updated, then that the call returned; the views' snapshots
  (widget, sidebar) carry the same ranks and places.
- The sidebar's Attach and Stacks: ``jupyter_mesh_debug_request`` on the kernel's control channel drives
  a paused rank's pdb (``p x``, ``continue``) while a cell waits on the call, and folds the stacks.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from _kernel import mesh_kernel

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]

ACTORS = """
import time
from jupyter_mesh import Actor, endpoint, current_rank
from jupyter_mesh.config import configure

def stall_in_loader(t):
    time.sleep(t)  # where rank 2 waits

class Slow(Actor):
    @endpoint
    def step(self, t):
        if current_rank().rank == 2:
            stall_in_loader(t)
        return current_rank().rank

    @endpoint
    def stop_here(self, x):
        breakpoint()
        return x + 1

s = procs.spawn("s", Slow)
s.initialized.get(30)
mesh_id = procs.state().mesh_id
configure(slow_call_after=1)
"""


@pytest.fixture(scope="module")
def kernel():
    yield from mesh_kernel(ACTORS)


def _texts(cell: Any, kind: str) -> list[str]:
    return [m["content"]["data"]["text/plain"] for m in cell.msgs if m["msg_type"] == kind]


def test_a_long_call_shows_the_ranks_left_and_where_they_are(kernel):
    cell = kernel.ok("s.step.call(6).get(60)")
    shown = _texts(cell, "display_data") + _texts(cell, "update_display_data")
    waiting = [t for t in shown if "still waiting" in t]
    assert waiting, shown
    first = waiting[0]
    assert "'procs': 3 of 4 answered" in first, first
    assert "rank 2 [hosts=0,gpus=2] not answered:" in first, first
    assert "in stall_in_loader: time.sleep(t)" in first, first
    assert "In[" in first and "ipykernel_" not in first, first  # the cell, as the notebook names it
    assert len(waiting) >= 2, "the view is updated while the call waits"
    assert "the call returned after" in shown[-1], shown[-1]
    assert "ValueMesh" in (cell.result or "") or "0" in (cell.result or ""), cell.result


def test_a_call_waited_on_again_in_a_new_cell_shows_its_view_there(kernel):
    # the first cell's wait times out (the call goes on); the next cell waits on the same call: its view
    # is a new output of that cell, not updates to the first cell's, which says it stopped waiting
    first = kernel.run("f = s.step.call(9)\nf.get(4)")
    assert "MeshTimeoutError" in str(first.msgs), first.msgs
    assert any("still waiting" in t for t in _texts(first, "display_data")), first.msgs
    second = kernel.ok("f.get(60)")
    mine = _texts(second, "display_data")
    assert any("still waiting" in t for t in mine), second.msgs
    ended = [t for t in _texts(second, "update_display_data") if "stopped waiting" in t]
    assert ended, "the first cell's view says its wait ended"


def test_no_view_for_a_call_that_answers_in_time(kernel):
    cell = kernel.ok("s.step.call(0).get(60)")
    assert not _texts(cell, "display_data"), cell.msgs


def test_the_views_snapshots_carry_where_the_ranks_left_are(kernel):
    # what the widget and the sidebar draw: MeshWire.gather.waits, from the hub's watcher
    cell = kernel.ok(
        "from jupyter_mesh.ui.hub import hub\n"
        "seen = []\n"
        "remove = hub().add_view(lambda changed, gone: seen.extend(changed))\n"
        "s.step.call(5).get(60)\n"
        "remove()\n"
        "waits = [w for m in seen if m['gather'] for w in (m['gather'].get('waits') or [])]\n"
        "print(sorted({(w['rank'], w['label']) for w in waits}), any('stall_in_loader' in w['where'] for w in waits))"
    )
    assert "[(2, 'hosts=0,gpus=2')] True" in cell.stream("stdout"), cell.stream()


def test_the_sidebar_drives_a_paused_rank_while_a_cell_waits(kernel):
    # the cell waits on the call (prompts off: the sidebar serves the pause); the shell is busy, the
    # control channel answers
    kernel.ok("from jupyter_mesh import debug\ndebug.prompt_while_waiting(False)")
    mesh_id = kernel.ok("print(mesh_id)").stream("stdout").strip()
    try:
        msg_id = kernel.kc.execute("print('returned', s.slice(gpus=1).stop_here.call_one(41).get(120))")
        deadline = time.monotonic() + 60
        while True:
            att = kernel.debug_request({"op": "attach", "mesh_id": mesh_id, "rank": 1})
            if att["status"] == "ok":
                break
            assert time.monotonic() < deadline, att
            time.sleep(0.3)
        assert att["actor"] == "s" and att["label"] == "hosts=0,gpus=1" and ":" in att["where"], att
        other = kernel.debug_request({"op": "attach", "mesh_id": mesh_id, "rank": 0})
        assert other["status"] == "error" and "not paused" in other["error"], other

        p = kernel.debug_request({"op": "send", "mesh_id": mesh_id, "rank": 1, "line": "p x * 2"})
        assert p["status"] == "ok" and "82" in p["out"] and not p["ended"], p
        stacks = kernel.debug_request({"op": "stacks", "mesh_id": mesh_id})
        assert stacks["status"] == "ok" and "stacks of 'procs' (4 ranks)" in stacks["out"], stacks
        assert "stop_here" in stacks["out"], stacks["out"]

        c = kernel.debug_request({"op": "send", "mesh_id": mesh_id, "rank": 1, "line": "continue"})
        assert c["status"] == "ok" and c["ended"], c
        out = []
        while True:
            m = kernel.kc.get_iopub_msg(timeout=30)
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream":
                out.append(m["content"]["text"])
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                break
        assert "returned 42" in "".join(out), out
        assert kernel.kc.get_shell_msg(timeout=10)["content"]["status"] == "ok"
    finally:
        kernel.run("debug.continue_all(); debug.prompt_while_waiting(True)")


def test_a_rank_a_cells_prompt_serves_is_not_taken_by_the_sidebar(kernel):
    # two fronts at once: the cell's stdin prompt keeps the rank, the sidebar is told where to answer
    mesh_id = kernel.ok("print(mesh_id)").stream("stdout").strip()
    msg_id = kernel.kc.execute("print('returned', s.slice(gpus=3).stop_here.call_one(1).get(120))", allow_stdin=True)
    try:
        req = kernel.kc.get_stdin_msg(timeout=60)
        assert req["msg_type"] == "input_request" and "(Pdb)" in req["content"]["prompt"], req
        att = kernel.debug_request({"op": "attach", "mesh_id": mesh_id, "rank": 3})
        assert att["status"] == "error" and "is being debugged from the notebook" in att["error"], att
        kernel.kc.input("c")
        reply = kernel.kc.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok", reply["content"]
    finally:
        kernel.run("from jupyter_mesh import debug\ndebug.continue_all()")


def test_unknown_requests_and_meshes_say_what_to_do(kernel):
    bad = kernel.debug_request({"op": "jump", "mesh_id": "x", "rank": 0})
    assert bad["status"] == "error" and "expected attach, send, take or stacks" in bad["error"], bad
    gone = kernel.debug_request({"op": "stacks", "mesh_id": "nope"})
    assert gone["status"] == "error" and "no proc mesh with id 'nope'" in gone["error"], gone


def test_the_text_views_list_the_ranks_left_and_the_cache_follows_the_call():
    # `%mesh status` (text, HTML) and `jupyter-mesh status` (rich) print the same list; no kernel needed
    from rich.console import Console

    from jupyter_mesh._core.state import CallProgress, MeshState, ProcState, RankState
    from jupyter_mesh.config import configured
    from jupyter_mesh.ui import slow_calls
    from jupyter_mesh.ui.table import html_table, text_table
    from jupyter_mesh.ui.terminal import render
    from jupyter_mesh.ui.wire import mesh_wire

    ranks = tuple(
        RankState(
            r, {"gpus": r}, ProcState.PAUSED if r == 3 else ProcState.BUSY, note="paused at t.py:9" if r == 3 else ""
        )
        for r in range(4)
    )
    state = MeshState("m1", "procs", {"gpus": 4}, ranks, progress=CallProgress((0, 1), (3,), 12.0))
    with configured(slow_call_after=5):
        waits = slow_calls.Waits()
        found = waits.look(state)  # the only rank left is paused: no stacks asked
        assert found == [{"rank": 3, "label": "gpus=3", "where": "paused at t.py:9"}], found
        assert waits.cached(state) == found
        done = MeshState("m1", "procs", {"gpus": 4}, ranks, progress=CallProgress((0, 1, 3), (), 13.0))
        assert waits.cached(done) == []  # rank 3 answered meanwhile
    with configured(slow_call_after=0):
        assert waits.cached(state) is None and not waits.slow(state)  # off
    wire = mesh_wire(state, waits=found)
    line = "rank 3 [gpus=3] not answered: paused at t.py:9"
    assert line in text_table([wire])
    assert "data-wait='3'" in html_table([wire]) and "paused at t.py:9" in html_table([wire])
    console = Console(width=200, record=True)
    console.print(render([wire]))
    assert line in console.export_text()
