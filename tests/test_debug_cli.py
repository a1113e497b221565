"""``jupyter-mesh debug`` (issue 15): a shell of the same user attaches to a running controller's paused
actors through a private unix socket: list, attach, cast (Monarch's ``ranks(...)`` and our slices),
continue. The controller is this test process's, the ranks really pause, the terminal is the real
command run as a subprocess and driven through a pipe."""

from __future__ import annotations

import json
import os
import queue
import stat
import subprocess
import sys
import threading
import time

import pytest
from _procs import wait_for
from pdb_actors import Stopper, wait_paused

from jupyter_mesh import MeshValueError, SupervisionError, debug
from jupyter_mesh._runtime.controller import Controller
from jupyter_mesh._runtime.debug_socket import debug_dir
from jupyter_mesh.ui.debug_terminal import parse_rank, parse_ranks

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Term:
    """``jupyter-mesh debug --pid <this process>`` on a pipe; ``expect`` waits for text in its output."""

    def __init__(self, *command: str):
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        args = [sys.executable, "-m", "jupyter_mesh.cli", "debug", "--pid", str(os.getpid()), *command]
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.out = ""
        self._chunks: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 4096):
            self._chunks.put(chunk.decode(errors="replace"))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, text: str, timeout: float = 30.0) -> str:
        """Everything up to and including ``text`` (the output after it stays for the next expect)."""
        deadline = time.monotonic() + timeout
        while text not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} from jupyter-mesh debug; it printed:\n{self.out}"
            try:
                self.out += self._chunks.get(timeout=min(left, 0.2))
            except queue.Empty:
                pass
        head, _, self.out = self.out.partition(text)
        return head + text

    def do(self, line: str, until: str = "(mesh debug) ", timeout: float = 30.0) -> str:
        """Send ``line``; what it printed, up to the prompt after it."""
        self.send(line)
        return self.expect(until, timeout)

    def finish(self, timeout: float = 30.0) -> tuple[int, str]:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        rc = self.proc.wait(timeout)
        time.sleep(0.1)
        while True:
            try:
                self.out += self._chunks.get_nowait()
            except queue.Empty:
                return rc, self.out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


@pytest.fixture
def term():
    made: list[Term] = []

    def start(*command: str) -> Term:
        t = Term(*command)
        made.append(t)
        return t

    yield start
    for t in made:
        t.kill()
    debug.continue_all()


def one_shot(*command: str, timeout: float = 60.0) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, "-m", "jupyter_mesh.cli", "debug", "--pid", str(os.getpid()), *command]
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_rank_selections_take_monarchs_syntax_and_ours():
    coords = [{"hosts": h, "gpus": g} for h in range(2) for g in range(4)]
    chosen = {
        text: [r for r, c in enumerate(coords) if parse_ranks(text)(r, c)]
        for text in ["ranks(1,4)", "ranks(3)", "ranks(2:5)", "ranks(0:8:3)", "ranks(gpus=1:3)", "all", "1,4",
                     "ranks(hosts=1, gpus=(0,2))", "gpus=0:2", "hosts=0,gpus=3", "gpus=:2", "ranks(gpus=2)"]
    }  # fmt: skip
    assert chosen == {
        "ranks(1,4)": [1, 4],
        "ranks(3)": [3],
        "ranks(2:5)": [2, 3, 4],
        "ranks(0:8:3)": [0, 3, 6],
        "ranks(gpus=1:3)": [1, 2, 5, 6],
        "all": list(range(8)),
        "1,4": [1, 4],
        "ranks(hosts=1, gpus=(0,2))": [4, 6],
        "gpus=0:2": [0, 1, 4, 5],
        "hosts=0,gpus=3": [3],
        "gpus=:2": [0, 1, 4, 5],
        "ranks(gpus=2)": [2, 6],
    }
    assert [r for r, c in enumerate(coords) if parse_rank("hosts=1,gpus=2")(r, c)] == [6]
    for bad in ["ranks(a)", "gpus=x", "ranks(1:4:0)", "=3"]:
        with pytest.raises(ValueError):
            parse_ranks(bad)(0, coords[0])


def test_the_terminal_lists_attaches_steps_and_continues_a_paused_rank(procs, term):
    st = procs.spawn("stop", Stopper)
    fut = st.slice(gpus=1).step.call_one(4)
    wait_paused(1)
    t = term()
    t.expect("1 actor(s) paused")
    t.expect("(mesh debug) ")
    listing = t.do("list")
    assert "stop" in listing and "1 (gpus=1)" in listing and "pdb_actors.py:15" in listing, listing
    shown = t.do("attach stop 1", "(Pdb) ")
    assert "attached to stop on" in shown and "-> y = x * 10" in shown, shown
    assert "4" in t.do("p x", "(Pdb) ").splitlines()
    assert "-> return y + context().actor_instance.rank.rank" in t.do("n", "(Pdb) ")
    assert "40" in t.do("p y", "(Pdb) ").splitlines()
    assert "runs on ---" in t.do("c")
    assert fut.get(30) == 41
    assert "no actor is paused in the debugger" in t.do("list")
    t.send("quit")
    rc, _ = t.finish()
    assert rc == 0


def test_cast_reaches_the_chosen_ranks_and_continue_all_releases_them(procs, term):
    st = procs.spawn("stop", Stopper)
    futs = [st.slice(gpus=i).step.call_one(i) for i in range(4)]
    wait_paused(4)
    out = one_shot("cast", "stop", "ranks(1,3)", "p", "x", "+", "100")
    assert "gpus=1 ---\n101" in out and "gpus=3 ---\n103" in out and "gpus=0" not in out, out
    out = one_shot("cast stop gpus=0:2 p x * 2")
    assert "gpus=0 ---\n0" in out and "gpus=1 ---\n2" in out and "gpus=3" not in out, out
    out = one_shot("cast nosuch ranks(0) p 1")
    assert "no actor 'nosuch' is paused" in out, out
    out = one_shot("continue")
    assert out.count("continued stop on") == 4, out
    assert [f.get(30) for f in futs] == [0, 11, 22, 33]


def test_the_controllers_own_prompt_and_the_terminal_never_share_a_rank(procs, term):
    st = procs.spawn("stop", Stopper)
    fut = st.slice(gpus=2).step.call_one(3)
    (p,) = wait_paused(1)
    reading, answer = threading.Event(), threading.Event()

    def read(prompt: str) -> str:
        reading.set()
        assert answer.wait(30)
        return "detach"

    here = threading.Thread(target=debug.attach, args=(p, read))
    here.start()
    assert reading.wait(30)
    t = term()
    t.expect("(mesh debug) ")
    said = t.do("attach stop 2")
    assert (
        "error: stop on procs" in said
        and f"is being debugged from the controller's own program (pid {os.getpid()})" in said
    ), said
    assert "being debugged from the controller's own program" in t.do("list")
    assert "error: being debugged from the controller's own program" in t.do("cast stop ranks(2) p x")
    answer.set()
    here.join(30)
    said = t.do("attach stop 2", "(Pdb) ")  # given back: the terminal takes it (no output again: it was shown)
    assert "paused at" in said, said
    with pytest.raises(MeshValueError, match=r"being debugged from jupyter-mesh debug \(pid \d+"):
        debug.attach(p, lambda prompt: "c")
    assert "3" in t.do("p x", "(Pdb) ").splitlines()
    assert "stays paused" in t.do("detach")
    t.send("quit")
    assert t.finish()[0] == 0
    debug.attach(p, lambda prompt: "c")  # the terminal gave it back
    assert fut.get(30) == 32


def test_a_terminal_that_dies_while_attached_gives_the_rank_back(procs, term):
    st = procs.spawn("stop", Stopper)
    fut = st.slice(gpus=0).step.call_one(1)
    (p,) = wait_paused(1)
    t = term("attach", "stop", "0")
    t.expect("(Pdb) ")
    assert p.attached and "jupyter-mesh debug" in p.attached_by
    t.kill()
    deadline = time.monotonic() + 30
    while p.attached and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not p.attached
    p.cont()
    assert fut.get(30) == 10


def test_a_proc_that_dies_while_attached_ends_the_session_with_its_failure(procs, term):
    st = procs.spawn("stop", Stopper)
    fut = st.slice(gpus=3).step.call_one(1)
    wait_paused(1)
    t = term()
    t.expect("(mesh debug) ")
    t.do("attach stop gpus=3", "(Pdb) ")
    said = t.do("!import os; os._exit(3)")  # back at the terminal's prompt, not waiting for pdb
    assert "paused in the debugger" in said, said
    with pytest.raises(SupervisionError):
        fut.get(30)
    t.send("quit")
    assert t.finish()[0] == 0


def test_cancelling_the_call_while_the_terminal_is_attached_tells_it(procs, term):
    st = procs.spawn("stop", Stopper)
    fut = st.slice(gpus=1).step.call_one(1)
    wait_paused(1)
    t = term()
    t.expect("(mesh debug) ")
    t.do("attach stop 1", "(Pdb) ")
    fut.cancel()  # what the notebook's interrupt does to the cell's call
    wait_for(lambda: not debug.paused(), 30)
    said = t.do("p x")
    assert "no longer paused" in said, said
    assert st.slice(gpus=1).ping.call_one().get(30) == 1
    t.send("quit")
    assert t.finish()[0] == 0


_PROBE = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
    print(json.dumps({"connected": s.makefile("rb").readline().decode()}))  # refused at once, asked nothing
except OSError as e:
    print(json.dumps({"error": type(e).__name__}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a probe as another user (setpriv)")
def test_another_user_cannot_reach_the_debug_socket(procs):
    path = Controller.get().debug_socket.path  # type: ignore[union-attr]
    directory = debug_dir()
    st = os.stat(directory)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    probe = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", _PROBE, path]
    out = subprocess.run(probe, capture_output=True, text=True, timeout=60, cwd="/")
    assert json.loads(out.stdout) == {"error": "PermissionError"}, out.stdout + out.stderr
    # and were the directory and socket opened up, the server itself refuses another uid
    os.chmod(directory, 0o711)
    os.chmod(path, 0o666)
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        os.chmod(path, 0o600)
        os.chmod(directory, 0o700)
    assert "connected" in out.stdout, out.stdout + out.stderr
    answer = json.loads(json.loads(out.stdout)["connected"])
    assert "refused" in answer["error"] and "65534" in answer["error"], answer


def test_two_terminals_on_one_rank_the_second_is_told_who_has_it(procs, term):
    st = procs.spawn("stop", Stopper)
    fut = st.slice(gpus=0).step.call_one(2)
    wait_paused(1)
    first = term("attach", "stop", "0")
    first.expect("(Pdb) ")
    out = one_shot("attach", "stop", "0")
    assert f"is being debugged from jupyter-mesh debug (pid {first.proc.pid}" in out, out
    assert "2" in first.do("p x", "(Pdb) ").splitlines()
    first.send("c")
    first.expect("runs on ---")
    assert fut.get(30) == 20
    assert first.finish()[0] == 0


def test_the_socket_of_a_killed_controller_is_swept_and_a_missing_one_said():
    directory = debug_dir(create=True)
    stale = os.path.join(directory, "999999999.sock")
    import socket as _socket

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    s.bind(stale)  # bound, never listening, then closed: what a kill -9 leaves
    s.close()
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, "-m", "jupyter_mesh.cli", "debug", "--pid", "999999999", "list"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode != 0 and not os.path.exists(stale), out.stdout + out.stderr
    assert "999999999" in out.stderr, out.stderr  # no such controller: said, with the ones that run


def test_attaching_again_after_a_detach_prompts_at_once(procs):
    """pdb waits at a prompt whose output a front already showed: a second attach must not wait for
    more output (it used to wait for good)."""
    st = procs.spawn("stop", Stopper)
    fut = st.slice(gpus=2).step.call_one(6)
    (p,) = wait_paused(1)
    debug.attach(p, lambda prompt: "detach")
    answers = iter(["p x", "c"])
    again = threading.Thread(target=debug.attach, args=(p, lambda prompt: next(answers)), daemon=True)
    again.start()
    again.join(30)
    assert not again.is_alive(), "the second attach waits for output that never comes"
    assert fut.get(30) == 62


def test_mesh_debug_cast_and_continue_leave_a_rank_the_terminal_holds_alone(procs, term, capsys):
    """``%mesh debug cast`` / ``continue`` beside a real terminal attached to one real paused rank: the
    held rank is neither typed into nor continued, and the magic says who holds it."""
    import argparse

    from jupyter_mesh.notebook import debug_magic
    from jupyter_mesh.notebook.magic_args import parse_slice, rank_or_coords

    def magic(*argv: str) -> str:
        args = argparse.Namespace(action=argv[0], rest=list(argv[1:]), rank_type=rank_or_coords)
        debug_magic.run(args, parse_slice)
        return capsys.readouterr().out

    st = procs.spawn("stop", Stopper)
    futs = [st.slice(gpus=i).step.call_one(i + 1) for i in range(2)]
    wait_paused(2)
    t = term("attach", "stop", "1")
    t.expect("(Pdb) ")
    out = magic("cast", "stop", "gpus=0:2", "p", "x", "+", "100")
    assert "101" in out and "102" not in out, out  # rank 0 answered; rank 1 was not typed into
    assert f"being debugged from jupyter-mesh debug (pid {t.proc.pid}" in out, out
    out = magic("continue", "all")
    assert "not continued" in out and str(t.proc.pid) in out, out
    assert futs[0].get(30) == 10
    assert "2" in t.do("p x", "(Pdb) ").splitlines()  # the terminal's session is intact
    t.send("c")
    t.expect("runs on ---")
    assert futs[1].get(30) == 21  # x * 10 + rank
    assert t.finish()[0] == 0
