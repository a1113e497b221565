"""``%mesh torchrun`` in a real `mesh` kernel: each rank's output in the cell, the failing rank named
first, Interrupt stopping every rank (and restarting those stuck in native code), usage errors."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from _kernel import Kernel, isolate_jupyter_dirs

pytestmark = [
    pytest.mark.kernel,
    # jupyter_client leaves its private event loops and sockets to the garbage collector
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]

ALLREDUCE = str(Path(__file__).resolve().parent / "spmd_scripts" / "allreduce.py")
FOREVER = "--steps 1000000000 --step-time 0.001 --announce"


@pytest.fixture(scope="module")
def kernel():
    isolate_jupyter_dirs()
    k = Kernel()
    k.ok("%mesh up --gpus 4 --preload torch", timeout=120)
    yield k
    assert not k.shutdown(), "processes left after the kernel shut down"


def _interrupt_once(kernel, code: str, ready: str, count: int, timeout: float = 60.0):
    """Run ``code``; when ``ready`` was printed ``count`` times, interrupt the kernel. Returns the
    cell's error content (or None) and its stream text."""
    msg_id = kernel.kc.execute(code)
    text, interrupted = "", False
    deadline = time.monotonic() + timeout
    error = None
    while (left := deadline - time.monotonic()) > 0:
        m = kernel.kc.get_iopub_msg(timeout=left)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream":
            text += m["content"]["text"]
        elif m["msg_type"] == "error":
            error = m["content"]
        elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            break
        if not interrupted and text.count(ready) >= count:
            kernel.km.interrupt_kernel()
            interrupted = True
    kernel.kc.get_shell_msg(timeout=10)
    assert interrupted, f"never saw {count} x {ready!r}:\n{text}"
    return error, text


def test_mesh_torchrun_runs_the_script_with_each_ranks_output_in_the_cell(kernel):
    out = kernel.ok(f"%mesh torchrun {ALLREDUCE} --steps 3").stream("stdout")
    for rank in range(4):
        assert f"[gpus={rank}] rank {rank}/4: sum 30\n" in out, out
    assert out.rstrip().endswith("torchrun " + ALLREDUCE + ": 4 ranks finished (gpus 0-3)")


def test_mesh_torchrun_interrupt_stops_every_rank_and_the_mesh_runs_again(kernel):
    kernel.ok("%%mesh\nkept = 7")
    error, _ = _interrupt_once(kernel, f"%mesh torchrun {ALLREDUCE} {FOREVER}", "joined", 4)
    assert error and error["ename"] == "MeshInterrupted", error
    assert re.fullmatch(
        r"Interrupted: cancelled spmd\.main on 4 ranks \(gpus 0-3\); all stopped in \d+\.\d\d s", error["evalue"]
    )
    assert "sum 20" in kernel.ok(f"%mesh torchrun {ALLREDUCE} --steps 2").stream()
    assert "gpus=3: 7" in kernel.ok("%%mesh\nkept").result  # the same procs: nothing was restarted


def test_mesh_torchrun_interrupt_restarts_ranks_stuck_in_the_rendezvous(kernel):
    """Rank 0 sleeps before it joins (it hosts the rendezvous): the others wait in native code that no
    interrupt reaches, so their procs are restarted, and the next run finds every rank free."""
    pids = kernel.ok("procs.pids()[0]").result
    error, _ = _interrupt_once(kernel, f"%mesh torchrun {ALLREDUCE} --stall-rank 0", "about to join", 4)
    assert error and error["ename"] == "MeshInterrupted", error
    assert "so their procs were restarted" in error["evalue"]
    assert re.search(r"; gpus [0-9,-]*0[0-9,-]* did not stop", error["evalue"]), error["evalue"]  # rank 0 at least
    assert kernel.ok("procs.pids()[0]").result != pids
    assert "4 ranks finished" in kernel.ok(f"%mesh torchrun {ALLREDUCE}").stream()


def test_mesh_torchrun_past_its_timeout_is_cancelled_as_an_interrupt_is(kernel):
    """--timeout cancels the run on every rank, as ■ does, and says so; ranks stuck in native code (the
    rendezvous, waiting for rank 0) have their procs restarted, so the next run finds every rank free."""
    cell = kernel.run(f"%mesh torchrun --timeout 8 {ALLREDUCE} {FOREVER}", timeout=60)
    assert cell.status == "error" and cell.error["ename"] == "MeshTimeoutError", cell.error
    said = cell.error["evalue"]
    assert re.search(r"; cancelled spmd\.main on 4 ranks \(gpus 0-3\); all stopped in", said), said
    assert "sum 20" in kernel.ok(f"%mesh torchrun {ALLREDUCE} --steps 2").stream()
    cell = kernel.run(f"%mesh torchrun --timeout 8 {ALLREDUCE} --stall-rank 0", timeout=60)
    assert cell.status == "error" and cell.error["ename"] == "MeshTimeoutError", cell.error
    assert "it was cancelled; " in cell.error["evalue"] and "so their procs were restarted" in cell.error["evalue"]
    assert "4 ranks finished" in kernel.ok(f"%mesh torchrun {ALLREDUCE}", timeout=60).stream()


def test_mesh_torchrun_names_the_rank_that_raised(kernel):
    cell = kernel.run(f"%mesh torchrun {ALLREDUCE} --steps 5 --fail-rank 2")
    assert cell.status == "error" and cell.error["ename"] == "ActorError"
    assert cell.error["evalue"].startswith("ValueError: rank 2 fails on purpose at step 0")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(cell.error["traceback"]))
    # the rank that raised comes first, its traceback from the script on; the others' come after
    first = plain.index("remote traceback: spmd.main on [hosts=0,gpus=2]")
    assert first < plain.index("Connection closed by peer")
    assert 'allreduce.py", line' in plain and "runpy" not in plain
    assert "4 ranks finished" in kernel.ok(f"%mesh torchrun {ALLREDUCE}").stream()


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ("%mesh torchrun", "the following arguments are required: SCRIPT"),
        (f"%mesh torchrun --nproc-per-node 2 {ALLREDUCE}", "--nproc-per-node 2, but mesh 'procs'"),
        (f"%mesh torchrun --nnodes 2 {ALLREDUCE}", "--nnodes 2, but mesh 'procs'"),
        (f"%mesh torchrun --master-port 5 {ALLREDUCE}", "both --master-addr and --master-port"),
        (f"%mesh torchrun --name nosuch {ALLREDUCE}", "no mesh named 'nosuch'"),
    ],
)
def test_mesh_torchrun_bad_arguments_are_usage_errors(kernel, line, expect):
    cell = kernel.run(line)
    text = cell.stream("stderr") + json.dumps(cell.error or {})
    assert cell.status == "error" and "UsageError" in text and expect in text, text
    assert "Traceback" not in text


def test_mesh_torchrun_passes_the_scripts_own_options_through(kernel, tmp_path):
    """Options after SCRIPT are the script's, even those %mesh torchrun has too (--timeout, --name)."""
    script = tmp_path / "argv.py"
    script.write_text("import sys\nprint('argv', sys.argv[1:])\n")
    out = kernel.ok(f"%mesh torchrun {script} --timeout 3 --name x -m").stream("stdout")
    assert "[gpus 0-3] argv ['--timeout', '3', '--name', 'x', '-m']" in out, out
