"""The inbox wait (``_wire/lane_merge.Inbox``): a reader of an inbox with a lane waits on ZeroMQ's socket
and on the lane. A reader that trusted a ZeroMQ descriptor someone else had cleared would wait for ever
with a message in ZeroMQ's queue; these hammers read inboxes every way there is, by turns, and require
every message, with bounded waits.

The first drives one inbox directly (senders on both ways, readers changing how and on which thread
they read, the receive thread's poller taking it over and giving it back); the second runs real procs:
controller threads (more than there are reply boxes, short-lived, so boxes go back to the pool and to
other threads) and threads inside actors, every adverb, payloads around the lane's bound, numpy and
tensors out of band, timeouts that expire and are waited again, cancels, and gets from other threads.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import zmq
from _lanes import bind_lane, lane_transport
from inbox_wait_actors import Echo, drive

from jupyter_mesh._wire import lane as _lane
from jupyter_mesh._wire.lane_merge import Inbox, WatchedLanes
from jupyter_mesh._wire.transport import Message


def test_an_inbox_read_every_way_by_turns_loses_nothing():
    rng = random.Random(7)
    with lane_transport() as t:
        sock, address, lane = bind_lane(t)
        sent: dict[int, int] = {}
        got: set[tuple[int, int]] = set()
        stop = threading.Event()

        def sender(k: int) -> None:
            r = random.Random(k)
            i = 0
            while not stop.is_set():  # around the lane's bound (either way), or small
                n = _lane.MAX_BYTES + r.randrange(-900, 300) if r.random() < 0.7 else r.randrange(1, 100)
                t.send(address, Message({"k": "x", "w": k, "i": i}, b"p" * n))
                i += 1
                sent[k] = i
                if r.random() < 0.3:
                    time.sleep(r.choice([0, 0.0001, 0.001, 0.005]))

        def note(frames: list | None) -> None:
            if frames is None:
                return
            m = t.decode(frames, address)
            assert m is not None, "a message was dropped (a replay: read out of its sender's order?)"
            key = (m.header["w"], m.header["i"])
            assert key not in got, f"{key} was read twice"
            got.add(key)

        def read(inbox: Inbox, n: int) -> None:  # as a reply box's owner and an actor thread read
            for _ in range(n):
                how = rng.randrange(4)
                if how == 0 and inbox.wait(rng.choice([0, 1, 3]), rng.choice([0.0, 0.0001, 0.001])):
                    note(inbox.recv_nowait())
                elif how == 1 and inbox.pending():
                    note(inbox.recv_nowait())
                elif how == 2:
                    note(inbox.recv_nowait())
                elif how == 3:
                    inbox.wait(rng.choice([0, 1]))  # a wait whose answer is not used (a Ctrl-C after it)

        def receive_thread(n: int) -> None:  # as Transport.watch/serve/unwatch read an adopted box
            watched, poller = WatchedLanes(), zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(lane.fd, zmq.POLLIN)
            watched.add(sock, lane)
            for s in watched.holding():
                watched.drain(s, {}, note)
            for _ in range(n):
                for key, _ in poller.poll(rng.choice([0, 1, 3])):
                    watched.drain(key, {}, note)
            poller.unregister(sock)
            poller.unregister(lane.fd)
            watched.remove(sock, lane)

        senders = [threading.Thread(target=sender, args=(k,), daemon=True) for k in range(3)]
        for s in senders:
            s.start()
        inbox = Inbox(sock, lane)
        end = time.monotonic() + 4
        try:
            while time.monotonic() < end:
                turn = rng.randrange(5)
                if turn < 2:
                    read(inbox, rng.randrange(1, 200))
                elif turn == 2:
                    receive_thread(rng.randrange(1, 50))
                elif turn == 3:  # another thread with an Inbox of its own (a box's next owner)
                    th = threading.Thread(target=read, args=(Inbox(sock, lane), rng.randrange(1, 200)))
                    th.start()
                    th.join(30)
                    assert not th.is_alive()
                else:  # let both ways fill up
                    time.sleep(rng.choice([0.001, 0.01]))
        finally:
            stop.set()
            for s in senders:
                s.join(10)
        total = sum(sent.values())
        deadline = time.monotonic() + 10  # what is left arrives to a reader that only waits
        while len(got) < total and time.monotonic() < deadline:
            if inbox.wait(200):
                note(inbox.recv_nowait())
        missing = [(k, i) for k, n in sent.items() for i in range(n) if (k, i) not in got]
        assert not missing, (
            f"{len(missing)} of {total} never read, e.g. {missing[:3]}: "
            f"ZeroMQ holds one: {bool(sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)}, lane: {lane.pending()}"
        )
        assert total > 1000


@pytest.mark.parametrize("size", [10, _lane.MAX_BYTES + 100])  # on the lane, on ZeroMQ
def test_a_spinning_wait_sees_a_message_sent_meanwhile_and_keeps_its_timeout(size):
    """A reply box's owner looks without sleeping first (``replies.SPIN_S``): a message sent during the
    spin is seen, the spin never outlasts the wait's timeout, and a look (timeout 0) does not spin.
    (The bounds are 30 s spins against 10 s: behaviour, not speed.)"""
    with lane_transport() as t:
        sock, address, lane = bind_lane(t)
        inbox = Inbox(sock, lane)
        t0 = time.monotonic()
        assert not inbox.wait(0, 30.0)
        assert not inbox.wait(50, 30.0)
        assert time.monotonic() - t0 < 10.0
        timer = threading.Timer(0.05, lambda: t.send(address, Message({"k": "x"}, b"p" * size)))
        timer.start()
        assert inbox.wait(-1, 30.0)
        assert time.monotonic() - t0 < 10.0
        timer.join()
        frames = inbox.recv_nowait()
        assert frames is not None and t.decode(frames, address) is not None


def _hammer(pm, s0, s1, seconds: float, threads: int) -> dict[str, int]:
    """Controller threads in a chain of short-lived ones (each ends: its box goes back to the pool),
    and two actors each calling an actor of the other proc from three threads of its own."""
    a1, b1, a2, b2 = s0.spawn("a1", Echo), s1.spawn("b1", Echo), s1.spawn("a2", Echo), s0.spawn("b2", Echo)
    both = pm.spawn("e", Echo)
    import numpy as np

    warm: list = [np.zeros(8)]  # numpy and torch imported in every proc before the clock starts
    try:
        import torch

        warm.append(torch.zeros(8))
    except ImportError:
        pass
    for p in warm:
        both.echo.call(p).get(120)
    errors: list[str] = []
    totals: dict[str, int] = {}
    lock = threading.Lock()

    def add(d: dict[str, int]) -> None:
        with lock:
            for k, v in d.items():
                totals[k] = totals.get(k, 0) + v

    def other_thread(fn):
        r: list = []
        t = threading.Thread(target=lambda: r.append(fn()))
        t.start()
        t.join(60)
        assert r, "the other thread got no value"
        return r[0]

    def chain(k: int) -> None:
        end, j = time.monotonic() + seconds, 0
        while time.monotonic() < end and not errors:
            j += 1

            def part(seed: int = k * 1000 + j, j: int = j) -> None:
                try:
                    left = max(0.0, end - time.monotonic())
                    add(drive(both, random.Random(seed), min(1.5, left), _lane.MAX_BYTES, other_thread))
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(f"controller thread {k}.{j}: {type(e).__name__}: {e}")

            t = threading.Thread(target=part)
            t.start()
            t.join(120)
            if t.is_alive():
                errors.append(f"controller thread {k}.{j} still waiting after 120 s")
                return

    def a2a(a, b, seed: int) -> None:
        try:
            add(a.hammer.call_one(b, seed, seconds, 3, _lane.MAX_BYTES).get(seconds + 120))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(f"actor -> actor: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=chain, args=(k,)) for k in range(threads)]
    ts += [threading.Thread(target=a2a, args=(a1, b1, 1)), threading.Thread(target=a2a, args=(a2, b2, 2))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(seconds + 180)
    assert not any(t.is_alive() for t in ts), "a caller is still waiting"
    assert not errors, "\n".join(errors[:5])
    return totals


@pytest.mark.integration
@pytest.mark.parametrize("hosts", [1, 2])
def test_callers_of_every_kind_on_many_threads_lose_no_reply(host, hosts):
    """Gets have timeouts: a lost message fails as a MeshTimeoutError. 18 controller threads: more
    than ``replies.MAX_BOXES`` with short lives would take long; 6 and the pool's turnover suffice."""
    pytest.importorskip("numpy")
    if hosts == 1:
        pm = host.spawn_procs(per_host={"gpus": 2})
        try:
            totals = _hammer(pm, pm.slice(gpus=0), pm.slice(gpus=1), 3.0, 6)
        finally:
            pm.stop(timeout=10)
    else:
        from jupyter_mesh import LocalJob

        job = LocalJob(hosts=2)
        try:
            pm = job.host_mesh().spawn_procs(per_host={"gpus": 1})
            try:
                totals = _hammer(pm, pm.slice(hosts=0), pm.slice(hosts=1), 3.0, 6)
            finally:
                pm.stop(timeout=10)
        finally:
            job.stop()
    assert sum(totals.values()) > 0, totals
