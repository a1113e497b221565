"""Remote pdb in the notebook (issue 15): a cell waiting on a call whose actor stops in ``breakpoint()``
shows pdb's prompt through the kernel's stdin (``input_request``), with the cell's own source lines;
the user's lines drive pdb and ``c`` gives the cell its result. A real kernel through jupyter_client."""

from __future__ import annotations

import queue
import time
from typing import Any

import pytest
from _kernel import Kernel, isolate_jupyter_dirs, mesh_kernel

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]

ACTORS = """
from jupyter_mesh import Actor, context, endpoint

class Stepper(Actor):
    @endpoint
    def step(self, x):
        breakpoint()
        y = x * 10  # the cell's own line
        return y + context().actor_instance.rank.rank

    @endpoint
    def ping(self):
        return context().actor_instance.rank.rank

    @endpoint
    def fail(self, x):
        ratio = x / 0  # post-mortem here
        return ratio

s = procs.spawn("s", Stepper)
s.initialized.get(30)
"""


@pytest.fixture(scope="module")
def kernel():
    yield from mesh_kernel(ACTORS)


@pytest.fixture(autouse=True)
def nothing_left_paused(request, kernel):
    """A failed test must not leave actors paused: the next cells would prompt for them."""
    yield
    if "shutting_the_kernel_down" not in request.node.name:
        kernel.run("from jupyter_mesh import debug as _debug\n_debug.continue_all()")


def run_answering(
    k: Kernel, code: str, answers: list[str], timeout: float = 60.0, allow_stdin: bool = True
) -> tuple[dict[str, Any], list[str], str]:
    """Run ``code`` with stdin allowed, answering each ``input_request`` with the next of ``answers``;
    (the execute reply, the prompts asked, the cell's stdout)."""
    kc = k.kc
    msg_id = kc.execute(code, allow_stdin=allow_stdin)
    prompts: list[str] = []
    out: list[str] = []
    reply: dict[str, Any] | None = None
    idle = False
    deadline = time.monotonic() + timeout
    while not (reply is not None and idle):
        assert time.monotonic() < deadline, f"cell did not finish; prompts {prompts}, output:\n{''.join(out)}"
        try:
            m = kc.get_stdin_msg(timeout=0.05)
            if m["msg_type"] == "input_request":
                prompts.append(m["content"]["prompt"])
                assert answers, f"more prompts than answers: {prompts}\n{''.join(out)}"
                kc.input(answers.pop(0))
        except queue.Empty:
            pass
        while True:
            try:
                m = kc.get_iopub_msg(timeout=0.01)
            except queue.Empty:
                break
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream":
                out.append(m["content"]["text"])
            elif m["msg_type"] == "execute_result":
                out.append(m["content"]["data"]["text/plain"] + "\n")
            elif m["msg_type"] == "error":
                out.append("\n".join(m["content"]["traceback"]))
            elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                idle = True
        try:
            m = kc.get_shell_msg(timeout=0.01)
            if m["parent_header"].get("msg_id") == msg_id:
                reply = m
        except queue.Empty:
            pass
    return reply, prompts, "".join(out)


def test_a_paused_rank_prompts_in_the_waiting_cell_and_continue_gives_the_result(kernel):
    reply, prompts, out = run_answering(kernel, "s.slice(gpus=1).step.call_one(4).get(60)", ["p x", "n", "p y", "c"])
    assert reply["content"]["status"] == "ok", out
    assert len(prompts) == 4 and all(p == "[procs rank hosts=0,gpus=1] (Pdb) " for p in prompts), prompts
    assert "paused at" in out and "y = x * 10  # the cell's own line" in out, out  # source from the kernel
    assert "\n4\n" in out and "\n40\n" in out, out
    assert out.rstrip().endswith("41"), out


def test_several_paused_ranks_queue_and_the_prompt_says_how_many_more(kernel):
    reply, prompts, out = run_answering(kernel, "sorted(s.step.call(1).get(60).values())", ["c"] * 4)
    assert reply["content"]["status"] == "ok", out
    assert len(prompts) == 4, prompts
    assert any(" more paused)" in p for p in prompts), prompts  # how many depends on when each stopped
    assert "[10, 11, 12, 13]" in out, out


def test_interrupt_at_the_prompt_cancels_the_call_and_nothing_stays_paused(kernel):
    import threading

    def interrupt_soon() -> None:
        time.sleep(3)
        kernel.km.interrupt_kernel()

    t = threading.Thread(target=interrupt_soon)
    t.start()
    # no answers: the prompt waits until the interrupt
    kc = kernel.kc
    msg_id = kc.execute("s.slice(gpus=2).step.call_one(1).get(60)", allow_stdin=True)
    m = kc.get_stdin_msg(timeout=30)
    assert m["msg_type"] == "input_request" and "gpus=2" in m["content"]["prompt"]
    t.join()
    deadline = time.monotonic() + 30
    while True:
        m = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if m["parent_header"].get("msg_id") == msg_id:
            break
    assert m["content"]["status"] == "error", m["content"]
    cell = kernel.ok(
        "from jupyter_mesh import debug\nimport time\nt0 = time.time()\nwhile debug.paused() and time.time() - t0 < 10: time.sleep(0.1)\nprint(len(debug.paused()), s.slice(gpus=2).ping.call_one().get(30))"
    )
    assert cell.stream().strip() == "0 2", cell.stream()


def test_without_stdin_the_cell_says_how_to_reach_the_paused_actor(kernel):
    reply, prompts, out = run_answering(kernel, "f = s.slice(gpus=3).step.call_one(2)\nf.get(2)", [], allow_stdin=False)
    # a front without stdin: the rank stays paused, the cell says how to reach it, get() times out
    assert "stays paused" in out and prompts == [], out
    assert reply["content"]["status"] == "error" and "timed out" in reply["content"]["evalue"], out
    kernel.ok("from jupyter_mesh import debug\nassert debug.continue_all() == 1\nprint(f.get(30))")


def test_mesh_debug_lists_casts_attaches_and_continues(kernel):
    sent = kernel.ok("s.slice(gpus=slice(0, 3)).step.broadcast(7)")  # nobody waits: they stay paused
    cell = kernel.ok(
        "from jupyter_mesh import debug\nimport time\nt0 = time.time()\n"
        "while len(debug.paused()) < 3 and time.time() - t0 < 20: time.sleep(0.05)\n"
        "time.sleep(0.5)"  # the notices are printed from another thread: give them time to reach the cell
    )
    # a new pause that no cell waits on says how to reach it (in the cell running when it came: one
    # may come after the cell that was running ended, and is then not seen here)
    notices = (sent.stream("stderr") + cell.stream("stderr")).count("a cell waiting on a call with .get() prompts")
    assert notices >= 1, sent.stream() + cell.stream()
    out = kernel.ok("%mesh debug").stream()
    assert "actor" in out and "paused at" in out and out.count("\ns ") == 3, out
    assert "hosts=0,gpus=2" in out and "for" in out, out
    out = kernel.ok("%mesh debug cast s gpus=0:2 p x + 1").stream()
    assert out.count("\n8\n") == 2 and "gpus=2" not in out, out
    reply, prompts, out = run_answering(kernel, "%mesh debug attach s 2", ["p x * 3", "detach"])
    assert reply["content"]["status"] == "ok" and "21" in out and "stays paused" in out, out
    assert prompts[0] == "[procs rank hosts=0,gpus=2 (2 more paused)] (Pdb) ", prompts
    out = kernel.ok("%mesh debug continue").stream()
    assert "continued s on procs" in out, out
    out = kernel.ok("%mesh debug continue all").stream()
    assert out.count("continued s on procs") == 2, out
    out = kernel.ok("import time; time.sleep(0.5)\n%mesh debug").stream()
    assert "no actor is paused" in out, out
    for line, expect in [
        ("%mesh debug cast s", "usage: %mesh debug cast ACTOR SLICE LINE"),
        ("%mesh debug attach nosuch", "no paused actor matches nosuch"),
        ("%mesh debug continue some", "usage: %mesh debug continue [all]"),
        ("%mesh debug attach s banana", "RANK is a global rank"),
    ]:
        cell = kernel.run(line)
        text = cell.stream("stderr") + str(cell.error or {})
        assert cell.status == "error" and "UsageError" in text and expect in text and "Traceback" not in text, text


def test_post_mortem_prompts_where_the_endpoint_raised_then_the_cell_gets_the_error(kernel):
    out = kernel.ok("%mesh debug post-mortem on").stream()
    assert "post-mortem debugging on on 4 procs" in out, out
    try:
        reply, prompts, out = run_answering(kernel, "s.slice(gpus=0).fail.call_one(6).get(60)", ["p x", "c"])
        assert reply["content"]["status"] == "error" and "ZeroDivisionError" in reply["content"]["evalue"], out
        assert len(prompts) == 2 and "post-mortem: ZeroDivisionError" in out, out
        assert "ratio = x / 0  # post-mortem here" in out and "\n6\n" in out, out
    finally:
        kernel.ok("%mesh debug post-mortem off")


def test_breakpoint_in_a_mesh_cell_prompts_with_the_cells_lines(kernel):
    reply, prompts, out = run_answering(kernel, "%%mesh --on gpus=0\nz = 5\nbreakpoint()\nz + 1", ["p z * 2", "c"])
    assert reply["content"]["status"] == "ok", out
    # %%mesh runs a cell statement by statement: pdb stops as breakpoint()'s statement returns
    assert len(prompts) == 2 and "-> breakpoint()" in out and "\n10\n" in out, out
    assert "{hosts=0: 6}" in out, out


def test_a_proc_that_dies_at_the_prompt_ends_it_and_the_cell_gets_the_failure(kernel):
    reply, prompts, out = run_answering(kernel, "s.slice(gpus=3).step.call_one(1).get(60)", ["!import os; os._exit(3)"])
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "SupervisionError", out
    assert "paused in the debugger" in out and len(prompts) == 1, out
    kernel.ok("%mesh respawn")
    kernel.ok("s.slice(gpus=3).ping.call_one().get(30)")


def _terminal(kernel: Kernel, script: str) -> str:
    """``jupyter-mesh debug --pid <the kernel>`` fed ``script`` on its stdin; what it printed."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, "-m", "jupyter_mesh.cli", "debug", "--pid", str(kernel.pid)]
    out = subprocess.run(args, input=script, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_notebook_prompt_and_jupyter_mesh_debug_take_turns_on_a_rank(kernel):
    kc = kernel.kc
    msg_id = kc.execute("s.slice(gpus=1).step.call_one(5).get(90)", allow_stdin=True)
    m = kc.get_stdin_msg(timeout=30)
    assert m["msg_type"] == "input_request" and "gpus=1" in m["content"]["prompt"]
    # the notebook holds the prompt: a terminal on the same rank is told so, and does not hang
    out = _terminal(kernel, "list\nattach s 1\nquit\n")
    said = f"being debugged from the notebook (kernel pid {kernel.pid})"
    assert out.count(said) == 2, out
    kc.input("detach")  # the cell waits on; the terminal may take the rank now
    out = _terminal(kernel, "attach s 1\np x\nc\nquit\n")
    assert "attached to s on procs" in out and "(Pdb) 5\n" in out and "runs on ---" in out, out
    deadline = time.monotonic() + 60
    texts = []
    while True:
        assert time.monotonic() < deadline, "".join(texts)
        try:
            m = kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream":
            texts.append(m["content"]["text"])
        elif m["msg_type"] == "execute_result":
            texts.append(m["content"]["data"]["text/plain"])
        elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            break
    out = "".join(texts)
    assert "51" in out, out  # 5 * 10 + rank 1: the terminal's continue gave the cell its result
    assert "is being debugged from jupyter-mesh debug (pid" in out, out  # the cell said who had the rank


def test_restarting_the_kernel_while_a_rank_is_paused_leaves_no_process():
    from _procs import wait_dead

    isolate_jupyter_dirs()
    k = Kernel()
    try:
        k.ok("%mesh up --gpus 2")
        k.ok(ACTORS)
        k.ok("f = s.slice(gpus=0).step.call_one(1)")
        k.ok(
            "from jupyter_mesh import debug\nimport time\nt0 = time.time()\n"
            "while not debug.paused() and time.time() - t0 < 20: time.sleep(0.05)\nassert debug.paused()"
        )
        before = k.workers()
        assert len(before) >= 3  # the agent and its 2 procs, at least
        k.km.restart_kernel(now=False)
        assert not wait_dead(before, 20), "processes of the kernel before its restart are left"
        k.kc.wait_for_ready(timeout=60)
        assert k.ok("print(1 + 1)").stream().strip() == "2"
    finally:
        k.shutdown()


def test_shutting_the_kernel_down_while_actors_are_paused_leaves_nothing(kernel):
    """Last in this module: the fixture's shutdown finds actors paused and must leave no process."""
    kernel.ok("s.step.broadcast(1)")
    kernel.ok(
        "from jupyter_mesh import debug\nimport time\nt0 = time.time()\n"
        "while len(debug.paused()) < 4 and time.time() - t0 < 20: time.sleep(0.05)\nassert len(debug.paused()) == 4"
    )
