"""get() inside a done callback: the receive thread runs callbacks, and the reply a pending future waits
for can only be read by that thread, so such a get() raises MeshDeadlockError at once instead of
hanging until its timeout. On done futures it returns their value; callbacks on other threads (an
actor's) still wait as usual. In the controller and in an actor's proc alike."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from _procs import wait_for
from callback_actors import KINDS, Chainer, Gate, chain

from jupyter_mesh._runtime.client import current_client

pytestmark = pytest.mark.integration

OPEN = "open"


def _expected(kind: str) -> object:
    """What a future of ``kind`` on a ``Gate`` (or a spawn) gives."""
    return {"call_one": OPEN, "call": [OPEN] * 4, "choose": OPEN, "spawn": None}[kind]


def _check(report: dict, kind: str, thread: str) -> None:
    assert report["ran"], f"the callback did not finish within 60 s: {report}"
    assert report["thread"] == thread, report  # it ran where the replies are read
    # refused at once: the error says so, not a timeout, and the call it would have waited on was still
    # pending then (it finishes below, once let go)
    for how in ("get", "result", "exception"):
        assert report[how] == "MeshDeadlockError", (how, report)
    msg = report["get_message"]
    assert "receive thread" in msg and thread in msg and "add_done_callback" in msg, msg
    assert report["still_pending"] is True
    assert report["poll"] == "MeshTimeoutError"  # get(timeout=0) only looks, as anywhere
    want = _expected(kind)
    assert report["done_before"] == want
    assert report["done_in_callback"] == want  # a done future's get() in the callback gives its value
    assert report["self_in_callback"] == want
    assert report["trigger"] == want
    assert report["pending_after"] == want  # the refused wait did not disturb the call


def _mesh_still_works(procs, gate, tmp: str) -> None:
    path = os.path.join(tmp, "after")
    open(path, "w").close()
    assert gate.slice(gpus=2).wait.call_one(path).get(timeout=30) == OPEN
    assert sorted(gate.wait.call(path).get(timeout=30).values()) == [OPEN] * 4
    chained = threading.Event()
    f = gate.wait.choose(path)
    f.add_done_callback(lambda g: chained.set() if g.get() == OPEN else None)
    assert chained.wait(30) and f.get(timeout=30) == OPEN


def _nothing_in_flight(*meshes) -> None:
    client = current_client()
    ids = {m._actor_id for m in meshes}
    assert wait_for(lambda: not any(a in ids for a, _ in client.calls.pending.load), 10), client.calls.pending.load


def _in_callback(trig, tmp_path, body) -> dict:
    """Run ``body(report)`` inside a done callback, on the receive thread (that of a call to ``trig``
    answered once its file exists); the report also says where it ran and what it raised."""
    late = tmp_path / f"late-{uuid.uuid4().hex[:8]}"
    trigger = trig.slice(gpus=0).wait.call_one(str(late))
    report: dict = {}
    ran = threading.Event()

    def on_done(f) -> None:
        try:
            report["thread"] = threading.current_thread().name
            body(report)
        except Exception as e:  # noqa: BLE001 - the report says what it was
            report["error"] = repr(e)
        finally:
            ran.set()

    trigger.add_done_callback(on_done)
    late.touch()
    assert ran.wait(90), report
    return report


@pytest.mark.parametrize("kind", KINDS)
def test_get_on_a_pending_future_in_a_callback_on_the_controllers_receive_thread_raises(procs, tmp_path, kind):
    pend, trig = procs.spawn("pend", Gate), procs.spawn("trig", Gate)
    report = chain(kind, procs, pend, trig, str(tmp_path))
    _check(report, kind, "jupyter-mesh-recv")
    _mesh_still_works(procs, trig, str(tmp_path))
    _nothing_in_flight(pend, trig)


@pytest.mark.parametrize("kind", KINDS)
def test_get_on_a_pending_future_in_a_callback_on_an_actors_receive_thread_raises(procs, tmp_path, kind):
    pend, trig = procs.spawn("pend", Gate), procs.spawn("trig", Gate)
    chainer = procs.spawn("chainer", Chainer)
    report = chainer.slice(gpus=0).chain.call_one(kind, procs, pend, trig, str(tmp_path)).get(timeout=120)
    _check(report, kind, "recv")
    _mesh_still_works(procs, trig, str(tmp_path))
    # the actor that ran it is fine too
    again = chainer.slice(gpus=0).chain.call_one("call_one", procs, pend, trig, str(tmp_path)).get(timeout=120)
    _check(again, "call_one", "recv")
    _nothing_in_flight(pend, trig, chainer)


def test_a_callback_on_an_actors_own_thread_may_still_wait_on_a_pending_future(procs, tmp_path):
    gate, chainer = procs.spawn("gate", Gate), procs.spawn("chainer", Chainer)
    report = chainer.slice(gpus=3).on_actor_thread.call_one(gate, str(tmp_path)).get(timeout=120)
    assert report["thread"] == report["actor_thread"] and report["thread"] != "recv", report
    assert report["value"] == OPEN


def test_iterating_a_pending_stream_in_a_callback_on_the_receive_thread_raises(procs, tmp_path):
    """A stream's next result inside such a callback waits on the same replies: refused at once too,
    while results already in are still handed out; the stream goes on afterwards, from our thread."""
    pend, trig = procs.spawn("pend", Gate), procs.spawn("trig", Gate)
    gated = tmp_path / "gated"
    stream = pend.wait.stream(str(gated))  # all 4 ranks wait for the gate

    def body(report: dict) -> None:
        next(stream)
        report["next"] = "returned"

    report = _in_callback(trig, tmp_path, body)
    assert report["thread"] == "jupyter-mesh-recv", report
    assert "MeshDeadlockError" in report["error"] and "stream" in report["error"], report
    gated.touch()
    assert [f.get(timeout=30) for f in stream] == [OPEN] * 4  # nothing of it was lost
    _nothing_in_flight(pend, trig)


def test_a_call_made_inside_the_callback_is_waited_for_as_anywhere(procs, tmp_path):
    """The receive thread reads the replies of calls it makes itself (in a reply box of its own): a
    get() on those inside a callback returns their values, every adverb, as it did before the refusal."""
    gate, trig = procs.spawn("gate", Gate), procs.spawn("trig", Gate)
    opened = tmp_path / "opened"
    opened.touch()
    path = str(opened)

    def body(report: dict) -> None:
        report["call_one"] = gate.slice(gpus=1).wait.call_one(path).get(timeout=30)
        report["call"] = sorted(gate.wait.call(path).get(timeout=30).values())
        report["choose"] = gate.wait.choose(path).get(timeout=30)

    report = _in_callback(trig, tmp_path, body)
    assert report == {"thread": "jupyter-mesh-recv", "call_one": OPEN, "call": [OPEN] * 4, "choose": OPEN}
    _nothing_in_flight(gate, trig)


def test_a_call_made_inside_the_callback_is_waited_for_while_many_threads_hold_reply_boxes(procs, tmp_path):
    """More calling threads than ``replies.MAX_BOXES``, each holding its box (alive, idle), left the
    receive thread none: a call made in a callback went to the inbox only that thread reads, and its
    get() raised MeshDeadlockError (a pool of 16+ workers was enough). One box is kept for it."""
    from jupyter_mesh._runtime.replies import MAX_BOXES

    gate, trig = procs.spawn("gate", Gate), procs.spawn("trig", Gate)
    opened = tmp_path / "opened"
    opened.touch()
    path = str(opened)
    release, answered = threading.Event(), threading.Semaphore(0)

    def worker() -> None:
        try:
            gate.slice(gpus=0).wait.call_one(path).get(timeout=30)  # takes a box, and keeps it while alive
        finally:
            answered.release()
            release.wait(60)

    workers = [threading.Thread(target=worker) for _ in range(MAX_BOXES + 2)]
    for t in workers:
        t.start()
    try:
        assert all(answered.acquire(timeout=60) for _ in workers)

        def body(report: dict) -> None:
            report["call_one"] = gate.slice(gpus=1).wait.call_one(path).get(timeout=30)

        report = _in_callback(trig, tmp_path, body)
    finally:
        release.set()
        for t in workers:
            t.join(30)
    assert report == {"thread": "jupyter-mesh-recv", "call_one": OPEN}
    _nothing_in_flight(gate, trig)


def test_a_port_fed_by_another_thread_of_this_process_may_be_waited_on_in_a_callback(procs, tmp_path):
    """A port's receiver gets a value sent in this same process straight from the sending thread, not
    from the receive thread: its recv().get() in a done callback can end, and did before the refusal
    (it raised MeshDeadlockError)."""
    from jupyter_mesh import Channel

    trig = procs.spawn("trig", Gate)
    send, recv = Channel.open()

    def send_once_waited_for() -> None:  # (sent earlier, the value would be there before the get())
        wait_for(lambda: recv._inbox._waiting, 30)
        send.send("sent")

    def body(report: dict) -> None:
        threading.Thread(target=send_once_waited_for).start()
        report["value"] = recv.recv().get(timeout=30)

    report = _in_callback(trig, tmp_path, body)
    assert report == {"thread": "jupyter-mesh-recv", "value": "sent"}


def test_awaiting_a_pending_future_in_an_event_loop_run_by_a_callback_raises(procs, tmp_path):
    """``asyncio.run`` inside a done callback runs its loop on the receive thread: an ``await`` there of a
    pending future (one made before, or a call the callback made) waited for a reply that thread reads
    only once the callback returns: a hang for ever (here: the 30 s ``wait_for``). Refused at once, as
    get() is; the calls are not disturbed."""
    import asyncio

    gate, trig = procs.spawn("gate", Gate), procs.spawn("trig", Gate)
    gated = tmp_path / "gated"
    pending = gate.slice(gpus=0).wait.call_one(str(gated))
    made: list = []

    async def waits(fut) -> object:
        return await fut

    def body(report: dict) -> None:
        for name, fut in (("before", pending), ("inside", gate.slice(gpus=1).wait.call_one(str(gated)))):
            made.append(fut)
            try:
                report[name] = asyncio.run(asyncio.wait_for(waits(fut), 30))
            except Exception as e:  # noqa: BLE001 - the report says what it was
                report[name] = type(e).__name__
                report[name + "_message"] = str(e)

    report = _in_callback(trig, tmp_path, body)
    assert report["thread"] == "jupyter-mesh-recv", report
    for name in ("before", "inside"):
        assert report[name] == "MeshDeadlockError", report
        assert report[name + "_message"].startswith("await on a pending future"), report
    gated.touch()
    assert [f.get(timeout=30) for f in made] == [OPEN, OPEN]  # refused waits, calls intact
    _nothing_in_flight(gate, trig)
