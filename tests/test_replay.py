"""Replayed and spliced messages, sent by someone who holds the session's keys and can reach the
sockets (standing in for a sniffer: from outside, the private directory or CURVE keeps them off the
channel). Every signed header names its sender's epoch, a counter and its destination; nothing
captured runs twice, in the same proc, in a respawned one or in another mesh, and nothing forks or is
marked failed again."""

from __future__ import annotations

import os
import signal
import time

import pytest
import zmq
from _procs import descendants, wait_dead
from actors import Counter

from jupyter_mesh._runtime.controller import Controller
from jupyter_mesh._wire.transport import Transport

pytestmark = pytest.mark.integration


class Tap:
    """Records what the controller sends (address, frames), and what it receives."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.sent: list[tuple[str, list[bytes]]] = []
        self.received: list[list[bytes]] = []
        t = Controller.get().transport
        send, decode = t._send_frames, t.decode

        def tapped_send(address, frames):
            self.sent.append(
                (address, [bytes(memoryview(f.buffer if isinstance(f, zmq.Frame) else f)) for f in frames])
            )
            return send(address, frames)

        def tapped_decode(frames, inbox=None):
            self.received.append([bytes(memoryview(f.buffer if isinstance(f, zmq.Frame) else f)) for f in frames])
            return decode(frames, inbox)

        monkeypatch.setattr(t, "_send_frames", tapped_send)
        monkeypatch.setattr(t, "decode", tapped_decode)

    def of_kind(self, kind: str, to: str | None = None) -> list[tuple[str, list[bytes]]]:
        import msgpack

        return [(a, f) for a, f in self.sent if msgpack.unpackb(f[1]).get("k") == kind and (to is None or a == to)]


def _replay(address: str, frames: list[bytes], times: int = 3) -> None:
    """As the attacker: a raw socket of our own, the captured bytes, again and again."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.linger = 2000
    s.connect(address)
    for _ in range(times):
        s.send_multipart(frames)
    time.sleep(0.3)
    s.close()
    ctx.term()


def _stats(addr: str) -> dict:
    return Controller.get().client.request(addr, {"k": "stats"}, what="stats").get(10)


def test_a_captured_call_runs_once(procs, monkeypatch):
    tap = Tap(monkeypatch)
    c = procs.spawn("c", Counter, 0)
    one = c.slice(gpus=0)
    assert one.incr.call_one(1).get(10) == 1  # direct to rank 0's actor inbox
    assert list(c.incr.call(1).get(10).values()) == [2, 1, 1, 1]  # a cast, relayed by the agent
    direct = tap.of_kind("c", None)[0]
    cast = tap.of_kind("c", procs._ref.agent_addrs[0])[0]
    _replay(*direct)
    _replay(*cast)
    assert list(c.incr.call(0).get(10).values()) == [2, 1, 1, 1]  # nothing ran again
    assert _stats(procs._ref.proc_addrs[0])["dropped_replayed"] >= 3  # the direct call's copies, at its actor
    assert _stats(procs._ref.agent_addrs[0])["dropped_replayed"] >= 3  # the cast's copies stop at the agent


def test_a_captured_message_with_other_buffer_bytes_is_not_delivered(procs, monkeypatch):
    """Buffer frames are not under the HMAC (as in Jupyter's protocol): a captured message with new
    tensor bytes keeps its (epoch, counter), so it is a replay and dropped; a new message needs the key."""
    np = pytest.importorskip("numpy")
    from payload_actors import Sink, digest

    tap = Tap(monkeypatch)
    sink = procs.spawn("sink", Sink).slice(gpus=0)
    a, b = np.zeros(1 << 14, dtype=np.float32), np.ones(1 << 14, dtype=np.float32)
    sink.store.call_one(a).get(60)  # the proc imports torch for it: slow on a loaded box
    sent = [(addr, f) for addr, f in tap.of_kind("c") if len(f) > 3]
    assert sent, "the array should travel as its own buffer frame"
    sink.store.call_one(b).get(10)
    addr, frames = sent[0]
    spliced = [*frames[:3], bytes(np.full(1 << 14, 7, dtype=np.float32).data)]
    _replay(addr, spliced)
    assert sink.last_digest.call_one().get(10) == digest(b)


def test_a_call_replayed_to_a_respawned_proc_does_not_run(procs, monkeypatch):
    tap = Tap(monkeypatch)
    c = procs.spawn("c", Counter, 0)
    c.slice(gpus=1).incr.call_one(5).get(10)
    c.incr.call(1).get(10)
    direct = tap.of_kind("c", None)[0]
    cast = tap.of_kind("c", procs._ref.agent_addrs[0])[0]
    pid = procs.pids()[1]
    os.kill(pid, signal.SIGKILL)
    assert not wait_dead([pid], 10)
    deadline = time.monotonic() + 10
    while procs.state().ranks[1].state.value != "failed" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.respawn([1], timeout=30) == [1]
    new_proc = procs._ref.proc_addrs[1]
    new_inbox = Controller.get().client.inboxes.address(new_proc, c._actor_id)
    # the captured direct call, to the new proc's inboxes; the captured cast, to the new proc as if
    # its agent relayed it, and to the agent again
    for addr in (new_inbox, new_proc):
        _replay(addr, direct[1])
        _replay(addr, cast[1])
    _replay(*cast)
    assert c.slice(gpus=1).incr.call_one(0).get(10) == 0  # the new actor ran nothing captured
    st = _stats(new_proc)
    # the direct call was for the old proc's inboxes; the cast is below the floors the new proc got
    assert st["dropped_misaddressed"] >= 6 and st["dropped_replayed"] >= 6, st


def test_a_spawn_captured_for_one_mesh_does_not_run_in_another(host, monkeypatch):
    tap = Tap(monkeypatch)
    a = host.spawn_procs(per_host={"gpus": 1})
    b = host.spawn_procs(per_host={"gpus": 1})
    try:
        b_counter = b.spawn("bc", Counter, 100)
        b_counter.incr.call(0).get(10)
        a.spawn("ac", Counter, 0).incr.call(0).get(10)
        spawn = next(f for addr, f in tap.of_kind("spawn") if a._ref.mesh_id.encode() in f[1])
        before = _stats(b._ref.proc_addrs[0])
        _replay(b._ref.proc_addrs[0], spawn)  # to mesh b's proc, as if the shared agent relayed it
        assert list(b_counter.incr.call(0).get(10).values()) == [100]
        after = _stats(b._ref.proc_addrs[0])
        assert after["dropped_misaddressed"] + after["dropped_replayed"] >= before["dropped_misaddressed"] + 1
    finally:
        a.stop(timeout=5)
        b.stop(timeout=5)


def test_a_replayed_spawn_procs_forks_nothing(host, monkeypatch):
    tap = Tap(monkeypatch)
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        req = tap.of_kind("spawn_procs")[0]
        before = descendants(os.getpid())
        _replay(*req, times=5)
        time.sleep(1.0)
        assert descendants(os.getpid()) == before  # no proc forked
        assert _stats(pm._ref.agent_addrs[0])["dropped_replayed"] >= 5
    finally:
        pm.stop(timeout=5)


def test_a_replayed_proc_exit_marks_nothing_failed(host, monkeypatch):
    seen = []
    from jupyter_mesh import lowlevel

    prev = lowlevel.set_fault_hook(seen.append)
    tap = Tap(monkeypatch)
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        c = pm.spawn("c", Counter, 0)
        pid = pm.pids()[1]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pm.state().ranks[1].state.value != "failed" and time.monotonic() < deadline:
            time.sleep(0.05)
        import msgpack

        exits = [f for f in tap.received if len(f) >= 3 and msgpack.unpackb(f[1]).get("k") == "proc_exit"]
        assert exits
        pm.respawn([1], timeout=30)
        c.incr.call(0).get(10)
        seen.clear()
        ctl = Controller.get()
        before = ctl.transport.stats.dropped_replayed
        _replay(ctl.address, exits[0], times=3)
        time.sleep(0.5)
        assert pm.state().ranks[1].state.value != "failed"
        assert not seen  # the fault hook never heard of it
        assert ctl.transport.stats.dropped_replayed >= before + 3
        assert list(c.incr.call(1).get(10).values()) == [1, 1]
    finally:
        lowlevel.set_fault_hook(prev)
        pm.stop(timeout=5)


def test_windows_take_out_of_order_counters_once():
    """Unit: a receiver's window admits each counter once, in any order within WINDOW, none older."""
    from jupyter_mesh._wire.replay import WINDOW, Window

    w = Window()
    assert [w.admit(n) for n in (3, 1, 2, 3, 1)] == [True, True, True, False, False]
    assert w.admit(WINDOW + 10) and not w.admit(5)  # fell out of the window: too old
    floor = Window.floor(100)  # a new proc's floor: everything up to 100 was before it
    assert not floor.admit(100) and not floor.admit(7) and floor.admit(101)


def test_a_message_for_another_destination_is_dropped():
    key = os.urandom(32)
    a, b = Transport(key), Transport(key)
    try:
        from jupyter_mesh._wire.transport import Message

        frames = a.encode(Message({"k": "ping"}), "tcp://127.0.0.1:1")
        assert b.decode(frames) is None and b.stats.dropped_misaddressed == 1
        frames = a.encode(Message({"k": "ping"}), b.address)
        assert b.decode(frames) is not None and b.decode(frames) is None
        assert b.stats.dropped_replayed == 1
    finally:
        a.close()
        b.close()


def test_a_busy_actors_queued_cast_is_not_taken_for_a_replay(procs, monkeypatch):
    """Two actors on one proc: while one is busy, more than WINDOW casts reach the other through the same
    agent. The busy one's queued cast is read late, after all of them; it must still run, once."""
    from actors import Sleeper

    from jupyter_mesh._wire.replay import WINDOW

    tap = Tap(monkeypatch)
    one = procs.slice(gpus=0)
    slow = one.spawn("slow", Sleeper)
    fast = one.spawn("fast", Counter, 0)
    rounds = WINDOW // 64 + 1
    slow.counts.call().get(10)  # both up, and the agent relays to each actor's own inbox
    fast.incr.call(0).get(10)
    busy = slow.nap.call(3.0)
    queued = slow.nap.call(0.0)  # waits, unread, in slow's inbox
    for _ in range(rounds):  # meanwhile the other actor's inbox takes thousands of later counters
        for f in [fast.incr.call(1) for _ in range(64)]:
            f.get(10)
    assert list(busy.get(30).values()) == ["finished"]
    assert list(queued.get(15).values()) == ["finished"]  # was dropped as a replay: a hang
    proc = procs._ref.proc_addrs[0]
    assert _stats(proc)["dropped_replayed"] == 0
    # the late cast, replayed into the proc's inbox and the actor's: it runs no more
    cast = [f for _, f in tap.of_kind("c", procs._ref.agent_addrs[0]) if b"nap" in f[1]][1]
    _replay(proc, cast)
    _replay(Controller.get().client.inboxes.address(proc, slow._actor_id), cast)
    assert list(slow.counts.call().get(10).values()) == [(2, 0)]
    assert list(fast.incr.call(0).get(10).values()) == [rounds * 64]


def test_a_replayed_rdma_write_does_not_write_again(host, monkeypatch):
    """An RDMA write over the control plane (the zmq backend) replayed after a newer write leaves the
    newer data: the owner drops the copy."""
    torch = pytest.importorskip("torch")
    from rdma_actors import Owner

    monkeypatch.setenv("JUPYTER_MESH_RDMA_BACKEND", "zmq")
    pm = host.spawn_procs(per_host={"gpus": 1}, env={"JUPYTER_MESH_RDMA_BACKEND": "zmq"})
    try:
        tap = Tap(monkeypatch)
        owner = pm.spawn("owner", Owner, 1024)
        buf = owner.handle.call_one().get(60)  # the proc imports torch for it
        buf.write_from(torch.full((1024,), 1.0)).get(10)
        puts = [(a, f) for a, f in tap.of_kind("rdma")]
        assert puts, "the write should go over the control plane with the zmq backend"
        buf.write_from(torch.full((1024,), 2.0)).get(10)
        for addr, frames in puts:
            _replay(addr, frames)
        assert owner.head.call_one(2).get(10) == [2.0, 2.0]
        assert _stats(pm._ref.proc_addrs[0])["dropped_replayed"] >= 3
    finally:
        pm.stop(timeout=5)


def test_a_replayed_failure_notice_marks_no_rank_failed_in_procs(host, monkeypatch):
    """The controller tells every proc that a rank failed; replayed after the rank was respawned (to the
    agent, or straight to a proc as if relayed), no proc's client takes the rank for failed again."""
    from payload_actors import Sink

    seen = []
    from jupyter_mesh import lowlevel

    prev = lowlevel.set_fault_hook(seen.append)
    tap = Tap(monkeypatch)
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        sink = pm.spawn("sink", Sink)
        sink.initialized.get(60)  # the proc imports torch for it
        pid = pm.pids()[1]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pm.state().ranks[1].state.value != "failed" and time.monotonic() < deadline:
            time.sleep(0.05)
        notices = tap.of_kind("notice")
        assert notices
        pm.respawn([1], timeout=30)
        for addr, frames in notices:
            _replay(addr, frames)
            for proc in pm._ref.proc_addrs:
                _replay(proc, frames)
        time.sleep(0.3)
        # rank 0's actor calls rank 1 (actor -> actor): it must not believe rank 1 failed
        out = sink.slice(gpus=0).forward.call_one(sink.slice(gpus=1), "small", "call_one").get(20)
        assert out is not None
    finally:
        lowlevel.set_fault_hook(prev)
        pm.stop(timeout=5)
