"""One sender's messages to one actor arrive once each and run in send order, whichever way each
went: the same-host lane (small, no buffers), ZeroMQ (larger, or with out-of-band tensors).

Real procs; every adverb and payload sizes around the lane's bound, mixed in one sequence.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _procs import wait_stopped  # noqa: E402
from lane_order_actors import Log  # noqa: E402

from jupyter_mesh._wire import lane as _lane  # noqa: E402
from jupyter_mesh._wire.replay import WINDOW  # noqa: E402

pytestmark = pytest.mark.integration
KB = 1024


def _payloads() -> list:
    """Around the lane's bound (the header and pickle take some of it), and tensors that go out of band."""
    sizes = [16, _lane.MAX_BYTES - 600, _lane.MAX_BYTES - 200, _lane.MAX_BYTES, _lane.MAX_BYTES + 1, 200 * KB]
    out: list = [b"x" * n for n in sizes]
    out += [torch.zeros(64 * KB // 4), torch.zeros(16), b"y" * 8, torch.zeros(40 * KB // 4), b"z"]
    return out


@pytest.fixture(scope="module")
def pair(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop(timeout=10)


@pytest.fixture(scope="module", params=["one agent", "two agents"])
def two(request, pair):
    """Two single-proc slices: on one host agent, or on two (``LocalJob(hosts=2)``: other agents of
    this machine, where the lane is still open to the procs, but casts go through another agent)."""
    if request.param == "one agent":
        yield pair.slice(gpus=0), pair.slice(gpus=1)
        return
    from jupyter_mesh import LocalJob

    job = LocalJob(hosts=2)
    pm = job.host_mesh().spawn_procs(per_host={"gpus": 1})
    try:
        yield pm.slice(hosts=0), pm.slice(hosts=1)
    finally:
        pm.stop(timeout=10)
        job.stop()


def test_every_adverb_and_size_in_send_order(two):
    log = two[0].spawn("log", Log)
    payloads = _payloads() * 3
    futs, streams = [], []
    for i, p in enumerate(payloads):
        how = i % 5
        if how == 0:
            futs.append(log.note.call_one(i, p))
        elif how == 1:
            futs.append(log.note.call(i, p))
        elif how == 2:
            futs.append(log.note.choose(i, p))
        elif how == 3:
            streams.append(log.note.stream(i, p))
        else:
            log.note.broadcast(i, p)
    for f in futs:
        f.get(60)
    for s in streams:
        for f in s:
            f.get(60)
    assert log.seen.call_one().get(60) == list(range(len(payloads)))


def test_actor_to_actor_in_send_order(two):
    a = two[1].spawn("a", Log)
    b = two[0].spawn("b", Log)
    payloads = _payloads() * 3
    assert a.send_to.call_one(b, payloads).get(120) == list(range(len(payloads)))
    assert b.seen.call_one().get(60) == list(range(len(payloads)))


def _wait_file(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def test_a_busy_actor_takes_an_old_zeromq_call_after_thousands_of_other_messages(pair, tmp_path):
    """The controller numbers all its messages with one counter. Calls to a busy actor fill its lane's
    queue (``max_dgram_qlen``), so the next goes through ZeroMQ and waits there; the actor then takes
    one call off the lane, the controller sends thousands of messages elsewhere and one more call,
    which fits the lane again. The actor must run every call, not drop the one ZeroMQ held as a
    replay (it is more than the replay window older than the last) and wait for it for ever."""
    busy = pair.slice(gpus=0).spawn("busy", Log)
    other = pair.slice(gpus=1).spawn("other", Log)
    with open("/proc/sys/net/unix/max_dgram_qlen") as f:
        qlen = int(f.read())
    g1, g2 = tmp_path / "g1", tmp_path / "g2"
    futs = [busy.hold.call_one(str(g1))]
    _wait_file(tmp_path / "g1.in")  # it runs: what comes next waits in the inbox
    futs.append(busy.hold.call_one(str(g2)))
    futs += [busy.note.call_one(i, b"s") for i in range(qlen + 1)]  # the lane is full: the last one is ZeroMQ's
    g1.touch()
    _wait_file(tmp_path / "g2.in")  # it took the second hold off the lane: there is room for one
    for _ in range(WINDOW // 64 + 1):  # 64 calls a round: the controller's counter moves past the window
        [other.note.call_one(-1, b"") for _ in range(64)][-1].get(60)
    futs.append(busy.note.call_one(qlen + 1, b"s"))  # the lane again
    g2.touch()
    assert [f.get(30) for f in futs] == [True, True, *range(qlen + 2)]
    assert busy.seen.call_one().get(30) == list(range(qlen + 2))


def test_a_stopped_actor_blocks_no_sender_and_every_call_fails_when_it_is_killed(host):
    """SIGSTOP the receiver mid-stream: its lane fills, the rest goes through ZeroMQ (more than the
    kernel's socket buffer holds), and the caller never blocks. The supervisor then kills the stopped proc (missed heartbeats): every call queued
    either way fails with the proc's supervision error; none waits for ever."""
    from jupyter_mesh import SupervisionError

    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        log = pm.spawn("log", Log)
        assert log.note.call_one(-1, b"").get(60) == -1
        (pid,) = pm.pids().values()
        os.kill(pid, signal.SIGSTOP)
        assert wait_stopped(pid)
        futs: list = []

        def send() -> None:
            # in-band payloads only: a tensor between 32 KiB and 1 MiB is sent from the caller's memory
            # and the call waits until ZeroMQ let go of it (value semantics), which a stopped peer delays
            inband = [p for p in _payloads() if isinstance(p, bytes)]
            futs.extend(log.note.call_one(i, p) for i, p in enumerate(inband * 4))

        sender = threading.Thread(target=send)
        sender.start()
        sender.join(60)
        assert not sender.is_alive(), "sending to a stopped actor blocked"
        for f in futs:
            with pytest.raises(SupervisionError, match="stopped"):
                f.get(60)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass
        pm.stop(timeout=10)
