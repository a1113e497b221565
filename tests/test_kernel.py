"""Kernel tests: a real `mesh` kernel through jupyter_client; real agents and procs behind it."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
from _kernel import Kernel, isolate_jupyter_dirs, mesh_kernel
from _procs import alive, wait_dead, wait_for

pytestmark = [
    pytest.mark.kernel,
    # jupyter_client leaves its private event loops and sockets to the garbage collector
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]

ROOT = Path(__file__).resolve().parent.parent

ACTORS = """
import time, os
from jupyter_mesh import Actor, endpoint, current_rank

class Worker(Actor):
    @endpoint
    def fail_on(self, ranks):
        r = current_rank().rank
        if r in ranks:
            raise ValueError(f"rank {r} refuses")
        return r

    @endpoint
    def spin(self, seconds):  # compute-bound: the runtime interrupts it in the actor's thread
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        return "done"

    @endpoint
    async def nap(self, seconds):
        import asyncio
        await asyncio.sleep(seconds)
        return "slept"

    @endpoint
    def ping(self):
        return os.getpid()

    @endpoint
    def say_later(self, delay, text):
        time.sleep(delay)
        print(text, flush=True)

w = procs.spawn("w", Worker)
w.initialized.get(30)
"""


@pytest.fixture(scope="module")
def kernel():
    yield from mesh_kernel(ACTORS)


def test_kernelspec_is_installed_and_matches_the_shipped_one():
    from jupyter_client.kernelspec import KernelSpecManager

    from jupyter_mesh.notebook.install import KERNEL_SPEC

    spec = KernelSpecManager().get_kernel_spec("mesh")
    assert spec.display_name == "Python 3 (mesh)"
    assert spec.argv[1:] == ["-m", "jupyter_mesh.notebook.kernel", "-f", "{connection_file}"]
    assert json.loads((ROOT / "kernel" / "kernel.json").read_text()) == KERNEL_SPEC


def test_status_shows_the_mesh(kernel):
    out = kernel.ok("%mesh status").stream()
    assert re.search(r"procs \*\s+hosts=1, gpus=4\s+4 idle", out), out


def test_stacks_show_where_each_rank_is(kernel):
    out = kernel.ok("%mesh stacks").stream()
    assert "stacks of 'procs' (4 ranks):" in out and "ranks 0-3:" in out and "idle" in out, out
    out = kernel.ok("%mesh stacks --rank gpus=2 --all-threads").stream()
    assert "rank 2 (hosts=0,gpus=2):" in out and "thread " in out, out


def test_cell_runs_on_every_proc_keeps_namespaces_and_returns_a_value_mesh(kernel):
    kernel.ok("%%mesh\nx = current_rank()['gpus'] * 10")
    cell = kernel.ok("%%mesh\nx + 1")
    assert cell.result.startswith("ValueMesh({hosts: 1, gpus: 4}") and "gpus=3: 31" in cell.result
    part = kernel.ok("%%mesh --on gpus=1:3\nx")
    assert "{hosts: 1, gpus: 2}" in part.result and "gpus=0: 10" in part.result and "gpus=1: 20" in part.result
    # a cell runs as its proc: current_rank() is the proc's point, as its output's prefix, also under --on
    part = kernel.ok("%%mesh --on gpus=1:3\nprint('at', current_rank()['gpus'])\ncurrent_rank()['gpus']")
    assert "gpus=0: 1" in part.result and "gpus=1: 2" in part.result, part.result
    assert "[gpus=2] at 2\n" in part.stream("stdout"), part.stream("stdout")


def test_top_level_await_and_get_mix_in_cells(kernel):
    """Cells await futures (the receive thread delivers) and .get() them (the cell's thread reads its
    own replies), in any mix, many times over."""
    code = (
        "one = w.slice(gpus=2)\n"
        "pids = [await one.ping.call_one() for _ in range(30)]\n"
        "pids += [one.ping.call_one().get(10) for _ in range(30)]\n"
        "f = one.ping.call_one()\n"
        "g = await w.ping.call()\n"
        "pids.append(f.get(10))\n"
        "len(set(pids)), len(pids), len(list(g.values()))"
    )
    for _ in range(3):
        assert kernel.ok(code).result == "(1, 61, 4)"


def test_identical_lines_fold_and_rank_lines_stay_apart(kernel):
    out = kernel.ok("%%mesh\nprint('epoch 1 loss 0.42')\nprint('rank', current_rank()['gpus'])").stream("stdout")
    assert "[gpus 0-3] epoch 1 loss 0.42\n" in out
    assert out.count("epoch 1 loss 0.42") == 1
    for g in range(4):
        assert f"[gpus={g}] rank {g}\n" in out


def test_no_stream_groups_by_rank(kernel):
    out = kernel.ok("%%mesh --no-stream\nprint('a')\nprint('b', current_rank()['gpus'] % 2)").stream("stdout")
    assert "--- [gpus 0,2] ---\na\nb 0\n" in out and "--- [gpus 1,3] ---\na\nb 1\n" in out


def test_failing_ranks_show_folded_tracebacks_and_others_still_return(kernel):
    cell = kernel.ok("%%mesh\nif current_rank()['gpus'] in (1, 3):\n    raise KeyError('missing')\n'fine'")
    err = cell.stream("stderr")
    assert "2 of 4 ranks raised" in err and "[gpus 1,3]" in err
    assert err.count("KeyError: 'missing'") == 1  # identical tracebacks shown once
    assert "raise KeyError('missing')" in err  # with the cell's source line
    assert "gpus=0: 'fine'" in cell.result and "gpus=2: 'fine'" in cell.result


def test_a_keyboard_interrupt_the_cell_raises_is_a_ranks_error_like_any_other(kernel):
    """Only the runtime's cancel (■, --timeout) is an interrupt of the cell; the cell's own raise is that
    rank's error, shown per rank, the others' values returned (was: an ActorError for the whole call)."""
    cell = kernel.ok("%%mesh\nif current_rank()['gpus'] == 1:\n    raise KeyboardInterrupt('mine')\n'fine'")
    err = cell.stream("stderr")
    assert "1 of 4 ranks raised" in err and "-------- [gpus=1] --------" in err, err
    assert "raise KeyboardInterrupt('mine')" in err and "KeyboardInterrupt: mine" in err and "remote_exec" not in err
    assert "gpus=0: 'fine'" in cell.result and "gpus=3: 'fine'" in cell.result


def test_a_last_value_that_does_not_pickle_says_the_cell_ran(kernel):
    """Not "RemoteExec.run ... does not pickle" as if nothing ran: the code ran on every rank, its last
    value (named) could not come back, and what to do; `;` at the end sends nothing back."""
    cell = kernel.ok("%%mesh\nimport threading\nran_here = current_rank()['gpus']\n(threading.Lock(), 1)")
    err = cell.stream("stderr")
    assert "the cell ran on 4 of 4 ranks, but its last value could not be sent back\n-------- [gpus 0-3]" in err, err
    assert "its last value, a tuple, does not pickle (cannot pickle '_thread.lock' object)" in err
    assert "End the cell with `;` to send nothing back" in err and "RemoteExec" not in err, err
    assert "gpus=3: 3" in kernel.ok("%%mesh\nran_here").result  # it did run
    quiet = kernel.ok("%%mesh\n(threading.Lock(), 1);  # nothing back")
    assert quiet.result is None and not quiet.stream("stderr"), quiet.stream()
    # a value pickled on the proc arrives as itself, its large buffers out of band as before
    big = kernel.ok("%%mesh\nimport numpy\nnumpy.full(100_000, float(ran_here))\n")
    assert "gpus=3: array([3., 3., 3., ..., 3., 3., 3.]" in big.result, big.result


def test_push_and_pull_move_variables(kernel):
    kernel.ok("lr = 0.25\n%mesh push lr")
    kernel.ok("%%mesh\ny = lr * (current_rank()['gpus'] + 1)")
    cell = kernel.ok("%mesh pull y")
    assert "gpus=0: 0.25" in cell.result and "gpus=3: 1.0" in cell.result


def test_actor_error_renders_remote_frames_first_with_rank_and_actor(kernel):
    cell = kernel.run("w.fail_on.call([2]).get(10)")
    assert cell.status == "error" and cell.error["ename"] == "ActorError"
    tb = "\n".join(cell.error["traceback"])
    plain = re.sub(r"\x1b\[[0-9;]*m", "", tb)
    remote = plain.index("remote traceback: w.fail_on on [hosts=0,gpus=2]")
    assert remote < plain.index("local traceback")
    assert 'raise ValueError(f"rank {r} refuses")' in plain  # source from the notebook cell
    assert "magics.py" not in plain and "client.py" not in plain  # no internals


CHAINED = """
class Chained(Actor):
    @endpoint
    def fail(self):
        try:
            {}["missing key"]
        except KeyError as e:
            raise RuntimeError("while loading the batch") from e

chained = procs.spawn("chained", Chained)
chained.fail.call().get(10)
"""


def test_a_remote_exception_chain_renders_with_its_causes(kernel):
    cell = kernel.run(CHAINED)
    assert cell.status == "error" and cell.error["ename"] == "ActorError"
    plain = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(cell.error["traceback"]))
    cause, effect = plain.index("KeyError: 'missing key'"), plain.index("RuntimeError: while loading the batch")
    assert cause < plain.index("The above exception was the direct cause") < effect
    assert (
        '{}["missing key"]' in plain and 'raise RuntimeError("while loading the batch") from e' in plain
    )  # cell source


def test_an_error_under_broadcast_is_shown_and_the_actor_lives_on(kernel):
    """Unlike a script (where, as in Monarch, it ends the actor), the kernel keeps its actors: the error
    of a broadcast shows in the cell that made it, with a note, and the actor answers the next call."""
    cell = kernel.ok("w.fail_on.broadcast([1])\nimport time; time.sleep(1)")
    err = cell.stream("stderr")
    assert "rank 1 refuses" in err and "under broadcast() (the actor lives on)" in err, err
    assert "gpus=1: 1" in kernel.ok("w.fail_on.call([]).get(10)").result


def _run_and_watch(kernel, code: str, until, timeout: float = 20.0) -> tuple[str, list[dict]]:
    """Run ``code`` and return its msg_id with every IOPub message seen, whichever cell it is for,
    until the cell is idle and ``until(messages)`` holds (at most ``timeout`` seconds)."""
    msg_id = kernel.kc.execute(code)
    seen: list[dict] = []
    idle = False
    deadline = time.monotonic() + timeout
    while not (idle and until(seen)) and (left := deadline - time.monotonic()) > 0:
        try:
            m = kernel.kc.get_iopub_msg(timeout=left)
        except Exception:  # noqa: BLE001 - queue.Empty: the deadline passed
            break
        seen.append(m)
        idle = idle or (
            m["msg_type"] == "status"
            and m["content"]["execution_state"] == "idle"
            and m["parent_header"].get("msg_id") == msg_id
        )
    kernel.kc.get_shell_msg(timeout=10)  # the execute_reply
    return msg_id, seen


def _lines(msgs: list[dict], text: str) -> list[dict]:
    return [m for m in msgs if m["msg_type"] == "stream" and text in m["content"]["text"]]


def test_output_goes_to_the_cell_whose_call_caused_it_even_after_it_finished(kernel):
    first = kernel.ok("w.slice(gpus=0).say_later.broadcast(0.0, 'early line')\nimport time; time.sleep(0.5)")
    assert "[gpus=0] early line" in first.stream("stdout")
    # cell A starts a call that prints after A returned, while cell B runs: the line is A's
    a = kernel.ok("late = w.slice(gpus=1).say_later.call(1.0, 'late line')")
    b_id, msgs = _run_and_watch(kernel, "time.sleep(2.0)", lambda seen: _lines(seen, "late line"))
    late = _lines(msgs, "late line")
    assert late, "the late line never came"
    assert all(m["parent_header"]["msg_id"] == a.msg_id for m in late), [m["parent_header"] for m in late]
    assert "[gpus=1] late line" in late[0]["content"]["text"]
    assert not [m for m in msgs if m["parent_header"].get("msg_id") == b_id and m["msg_type"] == "stream"]
    assert "late line" in kernel.ok("%mesh logs --rank 1 --tail 5").stream()


def test_prints_come_before_the_result_they_led_to(kernel):
    """The stream and the reply travel apart (pipe -> agent -> kernel; proc -> agent -> kernel): the
    cell waits for its ranks' output before it shows the ValueMesh."""
    for i in range(5):
        cell = kernel.ok(f"w.say_later.call(0.0, 'printed {i}').get(10)")
        kinds = [
            "print" if m["msg_type"] == "stream" and f"printed {i}" in m["content"]["text"] else m["msg_type"]
            for m in cell.msgs
            if m["msg_type"] in ("stream", "execute_result")
        ]
        assert "print" in kinds and "execute_result" in kinds, kinds
        assert kinds.index("execute_result") > max(j for j, k in enumerate(kinds) if k == "print"), kinds
        assert f"[gpus 0-3] printed {i}" in cell.stream("stdout") or cell.stream("stdout").count(f"printed {i}") == 4


def test_flood_is_limited_in_the_cell_and_kept_for_logs(kernel):
    t0 = time.monotonic()
    cell = kernel.ok("%%mesh\nfor i in range(100_000):\n    print('line', i, current_rank()['gpus'])", timeout=120)
    took = time.monotonic() - t0
    out = cell.stream()
    assert out.count("\n") < 2100, "the cell got more than its line budget"
    assert "output truncated after 2000 lines" in out and "more worker lines not shown here" in out
    for rank in range(4):  # every line is kept, whichever rank finished first
        assert f"line 99999 {rank}" in kernel.ok(f"%mesh logs --rank {rank} --tail 1").stream()
        assert f"line 0 {rank}\n" in kernel.ok(f"%mesh logs --rank {rank} --all").stream()
    print(f"flood of 4x10^5 lines: cell finished in {took:.1f} s")


@pytest.mark.parametrize("endpoint", ["spin", "nap"])
def test_interrupt_returns_promptly_and_cancels_the_remote_call(kernel, endpoint):
    pids = kernel.ok("w.ping.call().get(10)").result
    t = threading.Timer(1.0, kernel.km.interrupt_kernel)
    t.start()
    cell = kernel.run(f"w.{endpoint}.call(30).get()", timeout=20)
    t.join()
    # one short message, no traceback through our internals: what stopped, where, how fast. "all
    # stopped" means every rank confirmed its cancel: the cell returned on those confirmations, not
    # at the end of its wait for them (that message says which ranks "still run")
    assert cell.status == "error" and cell.error["ename"] == "MeshInterrupted"
    assert len(cell.error["traceback"]) == 1 and "all stopped in" in cell.error["traceback"][0]
    # the remote work was cancelled (else the actors stay busy for 30 s): they answer at once,
    # from the same procs
    assert kernel.ok("w.ping.call().get(5)").result == pids


@pytest.mark.parametrize(
    ("code", "what", "where"),
    [
        ("w.spin.call(30).get()", "w.spin", "4 ranks (gpus 0-3)"),
        ("await w.nap.call(30)", "w.nap", "4 ranks (gpus 0-3)"),  # ipykernel alone waits the 30 s (#881)
        ("await w.spin.call(30)", "w.spin", "4 ranks (gpus 0-3)"),
        ("import asyncio\nawait asyncio.sleep(0)\nw.spin.call(30).get()", "w.spin", "4 ranks (gpus 0-3)"),
        ("[f.get() for f in w.spin.stream(30)]", "w.spin", "4 ranks (gpus 0-3)"),
        ("w.slice(gpus=2).spin.call_one(30).get()", "w.spin", "1 rank (gpus=2)"),
        ("%%mesh\nimport time\ntime.sleep(30)", "mesh_exec.run", "4 ranks (gpus 0-3)"),
    ],
    ids=["get", "await-async", "await-sync", "get-in-async-cell", "stream", "call_one", "mesh-cell"],
)
def test_interrupt_shows_one_short_message(kernel, code, what, where):
    """Whatever way the cell waits, ■ gives one line: what was cancelled, where, how it went; no
    frames of jupyter_mesh, asyncio or pyzmq (the cell's timeout is below the call's 30 s)."""
    t = threading.Timer(1.0, kernel.km.interrupt_kernel)
    t.start()
    cell = kernel.run(code, timeout=20)
    t.join()
    assert cell.status == "error" and cell.error["ename"] == "MeshInterrupted", cell.error
    assert len(cell.error["traceback"]) == 1, cell.error["traceback"]
    line = cell.error["traceback"][0]
    assert re.fullmatch(
        rf"Interrupted: cancelled {re.escape(what)} on {re.escape(where)}; all stopped in \d+\.\d\d s", line
    )
    assert "Traceback" not in cell.stream() and "File " not in line
    kernel.ok("w.ping.call().get(5)")  # the actors answer again: the work was cancelled
    assert "gpus=3: 3" in kernel.ok("%%mesh --timeout 5\ncurrent_rank()['gpus']").result


def test_interrupt_while_awaiting_something_else_shows_the_cell_only(kernel):
    t = threading.Timer(1.0, kernel.km.interrupt_kernel)
    t.start()
    cell = kernel.run("import asyncio\nawait asyncio.sleep(30)", timeout=20)
    t.join()
    assert cell.status == "error" and cell.error["ename"] == "CancelledError"
    plain = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(cell.error["traceback"]))
    assert "await asyncio.sleep(30)" in plain and plain.rstrip().endswith("the cell was cancelled while it awaited")
    assert "tasks.py" not in plain  # asyncio's own frames are left out


def test_interrupt_while_constructors_run_stops_the_wait_only(kernel):
    """■ in ``initialized.get()``: MeshInterrupted (not a bare KeyboardInterrupt through our frames),
    saying the constructors run on; the spawn is not cancelled, so a later get() waits for them."""
    kernel.ok("class Slow(Actor):\n    def __init__(self, seconds):\n        time.sleep(seconds)")
    t = threading.Timer(1.0, kernel.km.interrupt_kernel)
    t.start()
    cell = kernel.run("slow = procs.spawn('slow', Slow, 5)\nslow.initialized.get()", timeout=20)
    t.join()
    assert cell.status == "error" and cell.error["ename"] == "MeshInterrupted", cell.error
    assert cell.error["traceback"] == [
        "Interrupted: stopped waiting for the constructors of 'slow' on 4 ranks (gpus 0-3); 0 finished, "
        "4 ranks (gpus 0-3) still run (a constructor is not cancelled; calls to 'slow' wait behind it). Its "
        "`.initialized.get()` waits for them again; to stop them, kill those procs (procs.kill(rank) / "
        "%mesh kill RANK) and respawn them."
    ]
    kernel.ok("slow.initialized.get(30)")  # not cancelled: the constructors finished


def test_interrupt_during_a_mesh_cell(kernel):
    t = threading.Timer(1.0, kernel.km.interrupt_kernel)
    t.start()
    cell = kernel.run(
        "%%mesh\nimport time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass", timeout=20
    )
    t.join()
    assert cell.error and cell.error["ename"] == "MeshInterrupted"
    # every rank's busy loop confirmed its cancel (not "still run" after the wait for them)
    assert "all stopped in" in cell.error["traceback"][0], cell.error["traceback"]
    assert "gpus=3: 3" in kernel.ok("%%mesh --timeout 5\ncurrent_rank()['gpus']").result


def test_a_mesh_cell_past_its_timeout_is_cancelled_on_every_proc(kernel):
    """At --timeout the cell stopped waiting, but its code ran on: its output and side effects landed
    in the next cells, which waited behind it. It is cancelled as an interrupt cancels it, and says so."""
    t0 = time.monotonic()
    cell = kernel.run("%%mesh --timeout 1\nimport time\ntime.sleep(4)\nprint('ran on')\nlate = True", timeout=20)
    assert cell.status == "error" and cell.error["ename"] == "MeshTimeoutError", cell.error
    assert time.monotonic() - t0 < 10
    time.sleep(4)  # past the cell's sleep: had it run on, `late` would be set by now
    after = kernel.ok("%%mesh --timeout 10\n'late' in globals()")
    assert "True" not in after.result and "ran on" not in after.stream(), (after.result, after.stream())
    what = r"timed out after 1 s: .*; cancelled mesh_exec\.run on 4 ranks \(gpus 0-3\); all stopped in"
    assert re.search(what, cell.error["evalue"]), cell.error


def test_an_interrupt_after_a_timeout_is_a_first_one(kernel, tmp_path):
    """■ while a --timeout's cancel waits for the ranks to stop is the user's first interrupt: it was
    taken for a second one, said "interrupted again" and killed every proc."""
    pids = kernel.ok("procs.pids()").result
    started = tmp_path / "started"
    code = (
        "%%mesh --timeout 1\nimport signal, time\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])  # deaf to the cancel for 4 s\n"
        f"open({str(started)!r} + str(current_rank().rank), 'w').close()\ntime.sleep(4)\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])"
    )
    cells = []
    t = threading.Thread(target=lambda: cells.append(kernel.run(code, timeout=30)))
    t.start()
    assert wait_for(lambda: Path(f"{started}0").exists(), 20)
    time.sleep(1.5)  # past the timeout (1 s), inside its wait for the ranks to stop (2 s)
    kernel.km.interrupt_kernel()
    t.join(40)
    err = cells[0].error
    assert err and err["ename"] == "MeshTimeoutError", err
    assert "killed" not in err["evalue"] and "again" not in err["evalue"], err["evalue"]
    assert "it was cancelled, but gpus 0-3 still run" in err["evalue"], err["evalue"]
    assert "gpus=3: 3" in kernel.ok("%%mesh --timeout 10\ncurrent_rank()['gpus']").result
    assert kernel.ok("procs.pids()").result == pids


def test_mesh_help_lists_every_subcommand(kernel):
    out = kernel.ok("%mesh -h").stream()
    listed = re.search(r"\{([a-z,]+)\}", out)
    assert listed, out
    assert set(listed.group(1).split(",")) == {
        *"up status stacks debug reattach down scale kill respawn logs push pull reload torchrun".split()
    }, out


def test_respawn_of_a_stopped_mesh_says_to_start_a_new_one(kernel):
    kernel.ok("%mesh up --procs 1 --name halted\nhalted.stop().get(30)")
    try:
        # status says so, and how to go on; its grid shows the stopped mesh too, as its table does
        status = kernel.ok("%mesh status")
        assert re.search(r"halted( \*)?\s+hosts=1, procs=1\s+1 stopped", status.stream()), status.stream()
        assert "mesh 'halted' is stopped (procs.stop()): `%mesh up --name halted` starts a new one" in status.stream()
        grid = "".join(m["content"]["data"]["text/plain"] for m in status.msgs if m["msg_type"] == "display_data")
        assert "halted [" in grid and " stopped: 1 stopped" in grid, grid
        cell = kernel.run("%mesh respawn --name halted")
        text = cell.stream("stderr") + json.dumps(cell.error or {})
        assert cell.status == "error" and "UsageError" in text and "Traceback" not in text, text
        assert "mesh 'halted' was stopped (procs.stop()): it has no ranks to respawn" in text, text
        assert "`%mesh up --name halted`" in text
    finally:
        kernel.ok("%mesh down halted")


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ("%mesh", "the following arguments are required"),
        ("%mesh bogus", "invalid choice: 'bogus'"),
        ("%mesh up --procs 0", "expected a number >= 1"),
        ("%mesh up --procs 2 --gpus 2", "not allowed with argument"),
        ("%mesh up --name 'x; import os'", "not a valid mesh name"),
        ("%mesh up --preload '__import__(\"os\")'", "--preload takes module names"),
        ("%mesh kill banana", "RANK is a global rank"),
        ("%mesh stacks --rank banana", "RANK is a global rank"),
        ("%mesh stacks --rank 9", "out of range"),
        ("%mesh logs --rank 99", "--rank 99 is out of range"),
        ("%mesh kill 9", "out of range"),
        ("%mesh down nosuch", "no mesh named 'nosuch'"),
        ("%mesh push undefined_here", "not defined here: undefined_here"),
        ("%mesh logs --tail -3", "expected a number >= 1"),
        ("%mesh up --hosts 'unterminated", "cannot split the arguments"),
        ("%mesh up --slurm --attach tcp://10.0.0.2:6000", "not allowed with argument"),
        ("%mesh up --attach 10.0.0.2", "--attach: expected an address like tcp://10.0.0.2:6000"),
        ("%mesh up --partition debug", "--partition, --time and --keep-alive are for --slurm"),
        ("%mesh up --keep-alive", "--partition, --time and --keep-alive are for --slurm"),
        ("%mesh reattach", "no record of any SLURM job kept alive"),
        ("%mesh reattach 12 --force", "no record of SLURM job 12 kept alive"),
        ("%mesh up --attach tcp://10.0.0.2:6000 --hosts 3", "--attach names 1 agents, --hosts says 3"),
        ("%mesh up --scheduler nosuch", "no scheduler named 'nosuch': installed are attach, local, slurm, torchx"),
        ("%mesh up --scheduler torchx:nosuch --name tx", "TorchX has no scheduler 'nosuch': installed are"),
        ("%mesh up --scheduler 'torchx local'", "--scheduler takes NAME or NAME:SUB"),
        ("%mesh up --scheduler-arg queue=q", "--scheduler-arg is for --scheduler"),
        ("%mesh up --scheduler torchx:local_cwd --scheduler-arg lgo_dir=/tmp --name tx", "no option 'lgo_dir'"),
        ("%mesh up --scheduler torchx:slurm --partition debug", "--scheduler-arg partition=NAME"),
        ("%mesh up --slurm --scheduler torchx:slurm", "not allowed with argument"),
        ("%%mesh --on gpus=zero\n1", "bad --on slice"),
        ("%%mesh --on cpus=0\n1", "--on cpus=0"),
        ("%%mesh --name nosuch\n1", "no mesh named 'nosuch'"),
        ("%%mesh --timeout 0\n1", "argument --timeout: takes seconds, a finite number above 0 (e.g. 30); got '0'"),
        ("%%mesh --timeout -5\n1", "takes seconds, a finite number above 0 (e.g. 30); got '-5'"),
        ("%%mesh --timeout nan\n1", "takes seconds, a finite number above 0 (e.g. 30); got 'nan'"),
        ("%%mesh --timeout inf\n1", "takes seconds, a finite number above 0 (e.g. 30); got 'inf'"),
        ("%mesh torchrun --timeout -1 x.py", "takes seconds, a finite number above 0 (e.g. 30); got '-1'"),
        ("%mesh torchrun --timeout nan x.py", "takes seconds, a finite number above 0 (e.g. 30); got 'nan'"),
        ("%mesh stacks --timeout 0", "takes seconds, a finite number above 0 (e.g. 30); got '0'"),
        ("%mesh torchrun", "the following arguments are required: SCRIPT\nusage"),  # (ARGS is optional)
        ("%mesh logs --save /nonexistent/dir/x", "--save /nonexistent/dir/x: cannot write there (No such file"),
    ],
)
def test_bad_arguments_are_usage_errors(kernel, line, expect):
    cell = kernel.run(line)
    assert cell.status == "error"
    text = cell.stream("stderr") + json.dumps(cell.error or {})
    assert "UsageError" in text and expect in text, text
    assert "Traceback" not in text


def test_kill_respawn_scale_down(kernel):
    kernel.ok("%mesh up --procs 2 --name extra")
    pids = set(json.loads(kernel.ok("import json; json.dumps(list(extra.pids().values()))").result.strip("'")))
    kernel.ok("%mesh kill procs=1 --name extra")
    assert wait_for(lambda: "1 (signal)" in kernel.ok("%mesh status").stream(), 5.0)
    cell = kernel.run("%%mesh --name extra\n1")
    assert cell.error and cell.error["ename"] == "SupervisionError"
    kernel.ok("%mesh respawn --name extra")
    assert "procs=1: 1" in kernel.ok("%%mesh --name extra\n1").result
    before = json.loads(kernel.ok("json.dumps(list(extra.pids().values()))").result.strip("'"))
    assert "resized in place" in kernel.ok("%mesh scale extra --procs 3").stream()
    assert "procs: 3" in kernel.ok("%%mesh --name extra\n1").result
    now_list = json.loads(kernel.ok("json.dumps(list(extra.pids().values()))").result.strip("'"))
    assert now_list[:2] == before  # the running procs were kept
    now = set(now_list)
    kernel.ok("%mesh down extra")
    assert not wait_dead(pids | now, 5.0)
    assert "extra" not in kernel.ok("%mesh status").stream()


def _lifecycle_kernel() -> tuple[Kernel, set[int]]:
    isolate_jupyter_dirs()
    k = Kernel()
    k.ok("%mesh up --procs 2")
    workers = k.workers()
    assert len(workers) >= 4, f"expected an agent, a template and 2 procs, found {workers}"
    return k, workers


def test_shutdown_leaves_no_process():
    k, workers = _lifecycle_kernel()
    assert not k.shutdown(now=False)
    assert not any(alive(p) for p in workers)


def test_restart_stops_every_proc_and_the_new_kernel_works():
    k, workers = _lifecycle_kernel()
    k.km.restart_kernel(now=False)
    k.kc.wait_for_ready(timeout=60)
    assert not wait_dead(workers, 5.0), "procs of the old kernel survived the restart"
    k.pid = k.km.provisioner.process.pid
    k.ok("%mesh up --procs 2")
    assert "procs: 2" in k.ok("%%mesh\n1").result
    assert not k.shutdown()


def test_hard_kill_leaves_no_orphans():
    k, workers = _lifecycle_kernel()
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=True)  # SIGKILL: do_shutdown never runs, the lifelines must do it
    assert not wait_dead(workers, 10.0), "workers outlived a hard-killed kernel"


GREETER = """
class Greeter(Actor):
    def __init__(self, who{extra}):
        self.who = who
        self.n = 0

    @endpoint
    def hello(self{args}):
        self.n += 1
        return f"{version} {{self.who}} {{self.n}}"
{more}"""


def test_redefined_class_warns_once_and_reload_updates_live_actors(kernel):
    v1 = kernel.ok(GREETER.format(extra="", version="v1", args="", more=""))
    v1_cell = v1.reply["content"]["execution_count"]
    kernel.ok("greeters = procs.spawn('greeters', Greeter, 'ann')\ngreeters.initialized.get(30)")
    assert "gpus=2: 'v1 ann 1'" in kernel.ok("greeters.hello.call().get(10)").result
    kernel.ok("first = greeters.slice(gpus=0)")  # a view made before the reload, unused until after it

    bye = "\n    @endpoint\n    def bye(self):\n        return f'bye {self.who}'\n"
    v2 = kernel.ok(GREETER.format(extra="", version="v2", args=", end='!'", more=bye))
    v2_cell = v2.reply["content"]["execution_count"]
    called = kernel.ok("greeters.hello.call().get(10)")
    assert "gpus=2: 'v1 ann 2'" in called.result  # the live actors still run the old code, and say so:
    assert (
        f"actors of 'greeters' run Greeter from cell [{v1_cell}], not the one defined since in cell [{v2_cell}]; "
        "spawn them again, or `%mesh reload`"
    ) in called.stream("stderr")
    assert "actors of" not in kernel.ok("greeters.hello.call().get(10)").stream("stderr")  # once

    reloaded = kernel.ok("%mesh reload greeters")
    assert "reloaded 'greeters' (Greeter): bye, hello changed" in reloaded.stream(), reloaded.stream()
    again = kernel.ok("greeters.hello.call().get(10)")
    assert "gpus=2: 'v2 ann 4'" in again.result and "actors of" not in again.stream()  # state kept
    assert "gpus=1: 'bye ann'" in kernel.ok("greeters.bye.call().get(10)").result  # a new endpoint, same mesh
    # the view made before the reload checks arguments against the new hello(self, end='!'), not the old
    assert "'v2 ann 5'" in kernel.ok("first.hello.call_one(end='?').get(10)").result
    assert "'bye ann'" in kernel.ok("first.bye.call_one().get(10)").result  # and has the new endpoint

    kernel.ok(GREETER.format(extra=", loud=False", version="v3", args="", more=""))
    refused = kernel.run("%mesh reload")
    text = json.dumps(refused.error or {}) + refused.stream()
    assert refused.status == "error" and "UsageError" in text, text
    assert "cannot reload 'greeters' in place: __init__(self, who) became __init__(self, who, loud=False)" in text
    assert "Spawn them again" in text and "Traceback" not in text
    assert "gpus=2: 'v2 ann 5'" in kernel.ok("greeters.hello.call().get(10)").result  # untouched

    # a reload may not add an endpoint an ActorMesh attribute hides (spawn refuses it too); one named
    # `name` is the endpoint after the reload, as it is after a spawn
    sized = "\n    @endpoint\n    def size(self):\n        return 0\n"
    kernel.ok(GREETER.format(extra="", version="v5", args="", more=sized))
    hidden = kernel.run("%mesh reload greeters")
    text = json.dumps(hidden.error or {}) + hidden.stream()
    assert "cannot reload 'greeters' in place: its endpoint 'size' would be hidden by the ActorMesh" in text, text
    named = "\n    @endpoint\n    def name(self):\n        return 'my name'\n"
    kernel.ok(GREETER.format(extra="", version="v6", args="", more=named))
    kernel.ok("%mesh reload greeters")
    assert "'my name'" in kernel.ok("greeters.slice(gpus=0).name.call_one().get(10)").result
    # the notebook's own actors are not the user's to reload, nor listed as if they were
    internal = kernel.run("%mesh reload mesh_exec")
    text = json.dumps(internal.error or {}) + internal.stream()
    assert "no live actor mesh named mesh_exec (live ones: " in text and "greeters" in text, text
    assert "mesh_reload" not in text.split("live ones:")[1], text
    # a new definition that uses a global that cannot travel: said in terms of the user's class
    kernel.ok("import threading\nLOCK = threading.Lock()")
    kernel.ok(
        GREETER.format(
            extra="",
            version="v4",
            args="",
            more="\n    @endpoint\n    def locked(self):\n        with LOCK:\n            return 1\n",
        )
    )
    unsendable = kernel.run("%mesh reload greeters")
    text = json.dumps(unsendable.error or {}) + unsendable.stream()
    assert "cannot send the new Greeter to 'greeters'" in text and "Reloader.patch" not in text, text
    assert "Traceback" not in text
