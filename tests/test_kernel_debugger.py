"""The ``mesh`` kernel's own debugger (issue 15): JupyterLab's visual debugger speaks DAP to ipykernel
through ``debug_request`` on the control channel and debugpy in the kernel. A real kernel through
jupyter_client, driven as JupyterLab drives it: initialize, attach, a breakpoint in a cell, the
``stopped`` event on IOPub, the stack, an evaluation that calls the mesh while the cell is stopped
(the mesh's own threads keep running), continue; interrupts and shutdown still work."""

from __future__ import annotations

import itertools
import json
import os
import queue
import time
from typing import Any

import pytest
from _kernel import Kernel, isolate_jupyter_dirs

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ACTORS = """
from jupyter_mesh import Actor, endpoint, current_rank

class Pinger(Actor):
    @endpoint
    def ping(self):
        return current_rank().rank

s = procs.spawn("s", Pinger)
s.initialized.get(30)
"""

# what JupyterLab sends first
INITIALIZE = {
    "clientID": "test-client",
    "clientName": "testClient",
    "adapterID": "",
    "pathFormat": "path",
    "lineStartAt1": True,
    "columnStartAt1": True,
    "supportsVariableType": True,
    "supportsVariablePaging": True,
    "supportsRunInTerminalRequest": True,
    "locale": "en",
}

_seq = itertools.count(1)


def dap(k: Kernel, command: str, arguments: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """One DAP request through the control channel; its response."""
    msg = k.kc.session.msg(
        "debug_request", {"type": "request", "seq": next(_seq), "command": command, "arguments": arguments or {}}
    )
    k.kc.control_channel.send(msg)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no answer to the debug request {command!r} within {timeout} s"
        reply = k.kc.control_channel.get_msg(timeout=left)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            content: dict[str, Any] = reply["content"]
            return content


def debug_event(k: Kernel, event: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no {event!r} debug_event within {timeout} s"
        try:
            m = k.kc.get_iopub_msg(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        if m["msg_type"] == "debug_event" and m["content"].get("event") == event:
            body: dict[str, Any] = m["content"]
            return body


def shell_reply(k: Kernel, msg_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "the cell did not finish"
        m = k.kc.get_shell_msg(timeout=left)
        if m["parent_header"].get("msg_id") == msg_id:
            content: dict[str, Any] = m["content"]
            return content


@pytest.fixture(scope="module")
def kernel():
    isolate_jupyter_dirs()
    from jupyter_mesh.notebook.install import install_kernel

    install_kernel(user=True)  # this tree's spec (debugger on), ahead of the environment's
    saved = os.environ.get("JUPYTER_PREFER_ENV_PATH")
    os.environ["JUPYTER_PREFER_ENV_PATH"] = "0"  # in a venv jupyter_core would prefer the environment's spec
    try:
        k = Kernel()
    finally:
        if saved is None:
            del os.environ["JUPYTER_PREFER_ENV_PATH"]
        else:
            os.environ["JUPYTER_PREFER_ENV_PATH"] = saved
    # as a notebook opened with the debugger on: the mesh and its threads start under debugpy
    assert dap(k, "initialize", INITIALIZE)["success"]
    assert dap(k, "attach")["success"]
    assert dap(k, "configurationDone")["success"]
    k.ok("%mesh up --gpus 2")
    k.ok(ACTORS)
    yield k
    assert not k.shutdown(), "processes left after the kernel shut down (the debug adapter included)"


def test_the_kernelspec_turns_jupyterlabs_debugger_on(kernel):
    from jupyter_mesh.notebook.install import KERNEL_SPEC

    assert KERNEL_SPEC["metadata"] == {"debugger": True}
    assert kernel.km.kernel_spec is not None and kernel.km.kernel_spec.metadata.get("debugger") is True
    with open(os.path.join(ROOT, "kernel", "kernel.json")) as f:
        assert json.load(f)["metadata"]["debugger"] is True  # the spec pip installs
    msg_id = kernel.kc.kernel_info()
    info = shell_reply(kernel, msg_id, 30)
    assert "debugger" in info["supported_features"], info  # debugpy is there


def test_a_breakpoint_in_a_cell_stops_it_and_the_mesh_answers_meanwhile(kernel):
    k = kernel
    code = "a = 1\nb = s.ping.call().get(30)\nc = a + 2\n"
    source = dap(k, "dumpCell", {"code": code})["body"]["sourcePath"]
    bps = dap(k, "setBreakpoints", {"breakpoints": [{"line": 3}], "source": {"path": source}, "sourceModified": False})
    assert bps["success"] and bps["body"]["breakpoints"][0]["verified"], bps
    assert dap(k, "configurationDone")["success"]
    msg_id = k.kc.execute(code)
    stopped = debug_event(k, "stopped")
    thread = stopped["body"]["threadId"]
    frames = dap(k, "stackTrace", {"threadId": thread})["body"]["stackFrames"]
    assert frames[0]["line"] == 3 and frames[0]["source"]["path"] == source, frames[0]
    # the cell is stopped; the mesh is not: a call made from the stopped frame is answered (with the
    # mesh's threads stopped too, its get(20) would fail with MeshTimeoutError and the evaluation with it)
    ev = dap(k, "evaluate", {"expression": "s.ping.call().get(20)", "frameId": frames[0]["id"], "context": "repl"})
    assert ev["success"] and "0" in ev["body"]["result"] and "1" in ev["body"]["result"], ev
    ev = dap(k, "evaluate", {"expression": "b", "frameId": frames[0]["id"], "context": "repl"})
    assert ev["success"], ev
    assert dap(k, "continue", {"threadId": thread})["success"]
    assert shell_reply(k, msg_id)["status"] == "ok"
    assert k.ok("print(c)").stream().strip() == "3"
    off = dap(k, "setBreakpoints", {"breakpoints": [], "source": {"path": source}, "sourceModified": False})
    assert off["success"], off


def test_interrupt_still_works_with_the_debugger_attached(kernel):
    k = kernel
    msg_id = k.kc.execute("import time\nfor _ in range(600): time.sleep(0.1)")
    time.sleep(2)
    k.km.interrupt_kernel()
    reply = shell_reply(k, msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    cell = k.run("print(sorted(s.ping.call().get(30).values()))")
    assert cell.status == "ok" and cell.stream().strip() == "[0, 1]", (cell.reply["content"], cell.stream())


def test_after_the_debugger_disconnects_the_kernel_and_its_mesh_run_on(kernel):
    k = kernel
    assert dap(k, "disconnect", {"restart": False, "terminateDebuggee": True})["success"]
    assert k.ok("print(sorted(s.ping.call().get(30).values()))").stream().strip() == "[0, 1]"
