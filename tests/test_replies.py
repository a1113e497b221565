"""Reply boxes: a caller waiting in get() reads its own replies; every other way of waiting still
gets its value (the receive thread takes the box over), and nothing is lost to Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from actors import Counter, Faulty, Sleeper

from jupyter_mesh import MeshCancelledError, SupervisionError
from jupyter_mesh._runtime.client import current_client
from jupyter_mesh._runtime.replies import MAX_BOXES, ReplyBox

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))


def _until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_get_reads_the_reply_on_the_calling_thread(procs, monkeypatch):
    from jupyter_mesh._runtime import replies

    # no sweep meanwhile: on a loaded machine a reply could wait past SWEEP_S (20 ms) before this
    # thread reaches get(), and the receive thread would rightly take the box over
    monkeypatch.setattr(replies, "SWEEP_S", 60.0)
    c = procs.spawn("c", Counter, 0)
    one = c.slice(gpus=1)
    fut = one.incr.call_one(2)
    box = fut._driver
    assert isinstance(box, ReplyBox) and box.owner == threading.get_ident()
    assert fut.get(timeout=5) == 2
    assert not box.adopted  # nobody else had to read it
    gathered = c.incr.call()
    assert gathered._driver is box
    assert sorted(gathered.get(timeout=5).values()) == [1, 1, 1, 3]
    assert not box.adopted


def test_await_callbacks_polling_and_other_threads_all_get_their_value(procs):
    c = procs.spawn("c", Counter, 0)
    one = c.slice(gpus=0)

    async def awaited():
        return await one.incr.call_one(1)

    assert asyncio.run(awaited()) == 1

    seen = threading.Event()
    fut = one.incr.call_one(1)
    fut.add_done_callback(lambda f: seen.set())
    assert seen.wait(5) and fut.get(timeout=1) == 2

    fut = one.incr.call_one(1)
    assert _until(fut.done) and fut.get(timeout=1) == 3

    fut = c.incr.call()  # gathered, waited for on another thread
    out = []
    t = threading.Thread(target=lambda: out.append(fut.get(timeout=5)))
    t.start()
    t.join(10)
    assert sorted(out[0].values()) == [1, 1, 1, 4]

    # after all of that, this thread still reads its own replies (in a fresh box)
    fut = one.value.call_one()
    assert fut.get(timeout=5) == 4 and not fut._driver.adopted


def test_replies_nobody_waits_for_are_still_taken_in(procs):
    """A call fired and left alone: its reply is read anyway, so the rank shows idle again."""
    s = procs.spawn("s", Sleeper)
    s.initialized.get(timeout=10)
    assert _until(lambda: procs.state().ranks[3].state.value == "idle", 5.0), procs.state()
    fut = s.slice(gpus=3).nap.call_one(0.2)
    assert procs.state().ranks[3].state.value == "busy", procs.state()
    assert _until(lambda: procs.state().ranks[3].state.value == "idle", 5.0), (procs.state(), fut._driver.__dict__)
    assert fut._driver.adopted or fut._done()
    assert fut.get(timeout=1) == "finished"


def test_more_threads_than_boxes_all_get_their_answers(procs):
    c = procs.spawn("c", Counter, 0)
    errors: list[BaseException] = []
    results: list[int] = []

    def work(rank: int) -> None:
        try:
            one = c.slice(gpus=rank % 4)
            for _ in range(30):
                results.append(one.value.call_one().get(timeout=10))
                assert len(list(c.value.call().get(timeout=10).values())) == 4
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(MAX_BOXES + 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 30 * len(threads)
    boxes = current_client().boxes
    assert boxes is not None
    assert len(boxes._all) <= MAX_BOXES

    def owner_alive(b: ReplyBox) -> bool:
        return b.owner in {t.ident for t in threading.enumerate()}

    # the threads are gone: their boxes go back to the pool
    assert _until(lambda: all(b.owner == 0 or owner_alive(b) for b in boxes._all), 5.0)


def test_a_failure_wakes_a_caller_reading_its_box(procs):
    f = procs.spawn("f", Faulty)
    one = f.slice(gpus=2)
    pid = one.pid.call_one().get(timeout=5)
    fut = one.sleep.call_one(30)
    threading.Timer(0.3, os.kill, args=(pid, 9)).start()
    # the call lasts 30 s: a reader the failure did not wake would end in MeshTimeoutError
    with pytest.raises(SupervisionError, match="SIGKILL"):
        fut.get(timeout=10)


def test_a_cancel_from_another_thread_wakes_the_reader(procs):
    s = procs.spawn("s", Sleeper)
    fut = s.slice(gpus=1).nap.call_one(30)
    threading.Timer(0.3, fut.cancel).start()
    # the call lasts 30 s: a reader the cancel did not wake would end in MeshTimeoutError
    with pytest.raises(MeshCancelledError):
        fut.get(timeout=10)


_CTRL_C_STORM = r"""
import faulthandler, json, os, signal, subprocess, sys, time
faulthandler.dump_traceback_later(110, exit=True)  # a hang shows where each thread is (the test waits 120 s)
sys.path.insert(0, sys.argv[1])
from actors import Counter
from jupyter_mesh import this_host, MeshTimeoutError
from jupyter_mesh._runtime import cancels
from jupyter_mesh._runtime.client import current_client
# the storm's interrupts must never count as a second Ctrl-C, which kills the ranks still running: that
# happened on CI when a cancel's acknowledgement took over DEBOUNCE (0.3 s) on a loaded machine
cancels.DEBOUNCE = cancels.ACK_WAIT + 1
procs = this_host().spawn_procs(per_host={"gpus": 2})
one = procs.spawn("c", Counter, 0).slice(gpus=0)
one.value.call_one().get(timeout=30)
boxes = current_client().boxes
# SIGINT from another process, as a real Ctrl-C: it lands at any bytecode of the main thread. It
# starts when told and sends every 0.3-3 ms, at random: gaps of every length, so that rounds also
# complete on a loaded machine (a fixed ~1 ms starved every round when calls took longer than that).
# It stops when this script is gone: it holds the test's output pipes, and a dead script (a zombie
# until the test reads to the end) still takes signals, so it would run on and the test would hang
storm = subprocess.Popen([sys.executable, "-c",
    "import os, random, sys, time\nsys.stdin.readline()\nwhile os.getppid() == int(sys.argv[1]):\n"
    "    os.kill(int(sys.argv[1]), 2); time.sleep(random.uniform(0.0003, 0.003))",
    str(os.getpid())], stdin=subprocess.PIPE)
n = {"interrupts": 0, "lost": 0, "leaked": 0, "rounds": 0}

def one_round():
    f1 = one.value.call_one(); f2 = one.value.call_one()
    try:
        f2.get(timeout=5)
    except MeshTimeoutError:
        n["lost"] += 1
    # one actor answers in order over one connection: in the same box f1's reply came before f2's
    # (a box the receive thread took over in between is read by it, in its own time)
    if f1._driver is f2._driver and not f1._done():
        n["lost"] += 1
    if any(b.depth for b in list(boxes._all)):  # nobody is in get() now
        n["leaked"] += 1
    n["rounds"] += 1

def going(least, most):
    # at least 3 s of storm, then on until 60 rounds and 60 interrupts (a count, not a time: a loaded
    # machine completes fewer rounds a second); the 60 s bound is a hang guard
    now = time.monotonic()
    return now < least or (now < most and min(n["rounds"], n["interrupts"]) < 60)

def rounds(least, most):
    while going(least, most):
        try:
            one_round()
        except KeyboardInterrupt:
            n["interrupts"] += 1

least, most = time.monotonic() + 3.0, time.monotonic() + 60.0
os.write(storm.stdin.fileno(), b"go\n")
try:
    while True:  # an interrupt on a loop's way back escapes its try: go on where it was
        try:
            rounds(least, most)
            break
        except KeyboardInterrupt:
            n["interrupts"] += 1
finally:  # also when a round raised something else: that error is the test's message
    while storm.returncode is None:
        try:
            storm.kill(); storm.wait()
        except KeyboardInterrupt:
            n["interrupts"] += 1
    while True:  # a signal sent before the kill may still be pending: ignored from here on
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            break
        except KeyboardInterrupt:
            n["interrupts"] += 1
f = one.value.call_one()  # polled, not waited for: the receive thread must take it in
t0 = time.monotonic()
while not f.done() and time.monotonic() - t0 < 5:
    time.sleep(0.01)
n["polled"] = f.done()
n["ok"] = one.value.call_one().get(timeout=5)
procs.stop()
print(json.dumps(n))
"""


@pytest.mark.timeout(150)  # the script's own hang guard (100 s, with every thread's stack) comes first
def test_ctrl_c_while_reading_replies_loses_none(host):
    """SIGINT every ~1 ms from another process while two calls are waited for: a reply read off the
    box is always delivered (the actor answers f1 before f2 over one connection, so when f2's get()
    returns, f1 must be done), no read is left registered on the box, and a future polled afterwards
    still completes. (Run in its own process: KeyboardInterrupts fly.)"""
    out = subprocess.run([sys.executable, "-c", _CTRL_C_STORM, HERE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-8000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["interrupts"] > 50 and r["rounds"] > 50, r
    assert r["lost"] == 0 and r["leaked"] == 0 and r["polled"] and r["ok"] == 0, r


def test_the_receive_thread_sleeps_when_nothing_is_in_flight(procs):
    """Sweeping is for replies in flight: with none, the receive thread gets no periodic wake-ups."""
    c = procs.spawn("c", Counter, 0)
    for _ in range(20):
        c.slice(gpus=0).value.call_one().get(timeout=5)
    c.value.call().get(timeout=5)
    boxes = current_client().boxes
    assert boxes is not None
    assert _until(lambda: not boxes._sweeping, 2.0)


def test_get_with_no_time_left_still_finds_a_reply_that_arrived(procs, monkeypatch):
    from jupyter_mesh._runtime import replies

    monkeypatch.setattr(replies, "SWEEP_S", 60.0)  # nobody else reads the box meanwhile
    c = procs.spawn("c", Counter, 5)
    c.initialized.get(timeout=10)
    one = c.slice(gpus=1)
    one.value.call_one().get(timeout=5)
    fut = one.value.call_one()
    time.sleep(0.3)  # the reply is in the box, unread
    assert not fut._done() and not fut._driver.adopted
    assert fut.get(timeout=0) == 5


def test_a_callback_waiting_on_another_call_of_the_same_box_is_answered(procs):
    """A callback added from another thread runs on the box's reading thread; a get() in it reads
    the box too (a hand-over asked meanwhile waits for the outer read to end)."""
    s = procs.spawn("s", Sleeper)
    s.initialized.get(timeout=10)
    a, b = s.slice(gpus=0), s.slice(gpus=1)
    f_long = a.nap.call_one(1.0)  # this thread waits on it
    f1 = b.nap.call_one(0.2)  # its callback runs on this thread
    f2 = b.nap.call_one(0.1)  # same box
    got: list[str] = []
    threading.Timer(0.1, lambda: f1.add_done_callback(lambda _f: got.append(f2.get(timeout=3)))).start()
    assert f_long.get(timeout=8) == "finished"
    assert got == ["finished"]  # the callback ran, and its get() was answered, during the outer read


def test_a_call_routed_to_a_box_that_went_back_to_the_pool_is_still_read(procs, monkeypatch):
    """The receive thread may return a box to the pool just before the caller registers a call on it
    (a stall between choosing the box and registering the call): that call's reply is still read."""
    c = procs.spawn("c", Counter, 0)
    one = c.slice(gpus=0)
    one.value.call_one().get(timeout=10)
    boxes = current_client().boxes
    assert boxes is not None
    choose_box = boxes.for_call
    stall = threading.Event()

    def slow_for_call():
        box = choose_box()
        if stall.is_set():
            time.sleep(0.1)  # the calling thread is descheduled here
        return box

    monkeypatch.setattr(boxes, "for_call", slow_for_call)
    f1 = one.value.call_one()  # nobody waits for it: the sweep takes the box and hands it back
    stall.set()
    f2 = one.incr.call_one(5)
    stall.clear()
    assert f1._driver is f2._driver
    assert f2.get(timeout=5) == 5
