"""Attacks on the same-host lane (``_wire/lane.py``) and the ``vm`` data plane (issue #14): what a
peer of this host can send to a lane, how lane and ZeroMQ messages may reorder, tampered handles.

Unit tests: one process, a real transport bound in a private directory, real sockets.
"""

from __future__ import annotations

import array
import os
import pickle
import shutil
import socket
import tempfile
import threading
import time

import pytest
from _lanes import bind_lane, lane_transport, recv_within

from jupyter_mesh import MeshValueError, RDMABuffer
from jupyter_mesh._data import buffer as _buffer
from jupyter_mesh._data.owner import SLOTS
from jupyter_mesh._wire import lane as _lane
from jupyter_mesh._wire.lane_merge import Inbox
from jupyter_mesh._wire.replay import WINDOW
from jupyter_mesh._wire.transport import Message, Transport


@pytest.fixture
def transport():
    with lane_transport() as t:
        yield t


def test_a_queued_zeromq_message_is_not_overtaken_past_the_replay_window(transport):
    """A large call goes through ZeroMQ; the sender then talks to others (its counter is one for all
    destinations) and sends a small call to the same inbox, over the lane. A reader that was busy
    meanwhile finds both waiting: it must take both, not drop the older one as a replay."""
    sock, address, lane = bind_lane(transport)
    _, other, _ = bind_lane(transport)
    inbox = Inbox(sock, lane)
    transport.send(address, Message({"k": "x", "i": 1}, b"b" * (_lane.MAX_BYTES + 1)))  # ZeroMQ
    for _ in range(WINDOW + 10):  # numbered after it: messages to another inbox
        transport.encode(Message({"k": "x"}, b""), other)
    transport.send(address, Message({"k": "x", "i": 2}, b"small"))  # the lane
    assert sock.poll(5000) and lane.pending()  # both wait for the reader
    got = []
    for _ in range(2):
        frames = recv_within(inbox)
        assert frames is not None
        msg = transport.decode(frames, address)
        if msg is not None:
            got.append(msg.header["i"])
    assert sorted(got) == [1, 2], f"dropped: {transport.stats}"
    assert transport.stats.dropped_replayed == 0


def test_a_queued_lane_message_is_not_overtaken_past_the_replay_window(transport):
    """The other way round: the small call first (the lane), then thousands of messages elsewhere,
    then a large call to the same inbox (ZeroMQ). Both wait; both are taken, the older first."""
    sock, address, lane = bind_lane(transport)
    _, other, _ = bind_lane(transport)
    inbox = Inbox(sock, lane)
    transport.send(address, Message({"k": "x", "i": 1}, b"small"))  # the lane
    for _ in range(WINDOW + 10):
        transport.encode(Message({"k": "x"}, b""), other)
    transport.send(address, Message({"k": "x", "i": 2}, b"b" * (_lane.MAX_BYTES + 1)))  # ZeroMQ
    assert sock.poll(5000) and lane.pending()
    got = []
    for _ in range(2):
        assert inbox.pending()
        msg = transport.decode(recv_within(inbox) or [], address)
        assert msg is not None, f"dropped: {transport.stats}"
        got.append(msg.header["i"])
    assert got == [1, 2] and not inbox.pending()


def test_two_ways_merge_in_send_order(transport):
    """Small and large messages of one sender, interleaved: each taken once, none lost as a replay."""
    sock, address, lane = bind_lane(transport)
    inbox = Inbox(sock, lane)
    sizes = [10, _lane.MAX_BYTES + 1, 10, 10, 70_000, 10, 2 * _lane.MAX_BYTES, 10]
    for i, n in enumerate(sizes):
        transport.send(address, Message({"k": "x", "i": i}, b"p" * n))
    assert sock.poll(5000) and lane.pending()
    got = []
    for _ in sizes:
        msg = transport.decode(recv_within(inbox) or [], address)
        assert msg is not None
        got.append(msg.header["i"])
    # ZeroMQ's I/O thread may hand a large one over after later small ones were taken: each still once
    assert sorted(got) == list(range(len(sizes)))
    assert inbox.recv_nowait() is None and transport.stats.dropped == 0


def test_a_message_held_back_is_there_for_the_next_reader(transport):
    """Merging reads one message ahead; that one waits on the lane, so whichever thread reads the
    inbox next (a reply box goes from its caller's thread to the receive thread) still gets it."""
    sock, address, lane = bind_lane(transport)
    transport.send(address, Message({"k": "x", "i": 1}, b"small"))  # the lane
    transport.send(address, Message({"k": "x", "i": 2}, b"b" * (_lane.MAX_BYTES + 1)))  # ZeroMQ
    assert sock.poll(5000) and lane.pending()
    first = Inbox(sock, lane)
    assert transport.decode(first.recv_nowait() or [], address).header["i"] == 1  # type: ignore[union-attr]
    assert lane.holds() and not sock.poll(0) and not lane.pending()  # only the hold has it now
    second = Inbox(sock, lane)
    assert second.pending()
    assert transport.decode(second.recv(), address).header["i"] == 2  # type: ignore[union-attr]
    assert not second.pending() and not lane.holds()


def test_the_receive_thread_merges_a_watched_box_too():
    """Reply boxes nobody waits on are read by the receive thread (``Transport.watch``): the lane
    and the socket merge there as well, so neither of two waiting replies is dropped as a replay."""
    d = tempfile.mkdtemp(prefix="jm-lane-")
    key = os.urandom(32)
    recv, send = Transport(key, bind=f"ipc://{d}"), Transport(key, bind=f"ipc://{d}")
    sock, address, lane = recv.bind_inbox_with_lane()
    got: list[int] = []
    done = threading.Event()
    watched: list[bool] = []

    def tick() -> float | None:
        if not watched:
            recv.watch(sock, b"bell", lane)
            watched.append(True)
        return None

    def handler(msg: Message, frames: list) -> None:
        got.append(msg.header["i"])
        if len(got) == 2:
            done.set()

    server = None
    try:
        send.send(address, Message({"k": "x", "i": 1}, b"small"))  # the lane
        for _ in range(WINDOW + 10):
            send.encode(Message({"k": "x"}, b""), send.address)
        send.send(address, Message({"k": "x", "i": 2}, b"b" * (_lane.MAX_BYTES + 1)))  # ZeroMQ
        assert sock.poll(5000) and lane.pending()
        server = threading.Thread(target=recv.serve, args=(handler, tick), daemon=True)
        server.start()
        assert done.wait(10), f"taken: {got}; {recv.stats}"
        assert sorted(got) == [1, 2] and recv.stats.dropped == 0
    finally:
        recv.close()  # stops serve() first
        if server is not None:
            server.join(5)
        sock.close(linger=0)
        send.close()
        shutil.rmtree(d, ignore_errors=True)


def test_descriptors_sent_with_a_datagram_are_not_kept(transport):
    """Anyone of this user may attach descriptors (SCM_RIGHTS) to a datagram, well formed or not: the
    reader never takes them, so the kernel closes them; a flood of them leaks nothing here."""
    sock, address, lane = bind_lane(transport)
    inbox = Inbox(sock, lane)
    path = _lane.lane_path(address)
    frames = transport.encode(Message({"k": "x", "i": 1}, b"p"), address)
    good = _lane._LENS[3].pack(3, *map(len, frames)) + b"".join(frames)
    before = len(os.listdir("/proc/self/fd"))
    r, w = os.pipe()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, w] * 100).tobytes())]
        raw.sendmsg([good], rights, 0, path)
        raw.sendmsg([b"\x01\x00"], rights, 0, path)
        msg = transport.decode(recv_within(inbox) or [], address)
        assert msg is not None and msg.header["i"] == 1
        assert inbox.recv_nowait() is None and lane.dropped == 1
    finally:
        raw.close()
        os.close(r)
        os.close(w)
    assert len(os.listdir("/proc/self/fd")) <= before


@pytest.mark.parametrize("slot", [-1, SLOTS, 1 << 40, "0"])
def test_a_handle_with_its_slot_altered_is_refused_when_unpickled(slot):
    """The slot indexes the owner's liveness table as mapped in the reader: out of range, the reader
    read (and compared, and copied with) memory outside it; a huge one crashed it."""
    buf = RDMABuffer(bytearray(4096))
    try:
        _, (state,) = buf.__reduce__()
        altered = (*state[:8], slot, state[9])
        with pytest.raises(MeshValueError, match="altered on the way"):
            _buffer._rebuild(altered)
        for nbytes in (-1, 4096.0):
            with pytest.raises(MeshValueError):
                _buffer._rebuild((*state[:2], nbytes, *state[3:]))
        assert pickle.loads(pickle.dumps(buf)).size() == 4096  # the genuine handle still is one
    finally:
        buf.drop()


def test_a_flood_from_a_program_without_the_key_blocks_nobody(transport):
    """Another program of this user fills the lane with junk and forged frames, as fast as it can:
    our sender never blocks (a full lane: ZeroMQ), and the reader still gets every real message."""
    sock, address, lane = bind_lane(transport)
    inbox = Inbox(sock, lane)
    path = _lane.lane_path(address)
    frames = transport.encode(Message({"k": "x"}, b"p"), address)
    forged = _lane._LENS[3].pack(3, 32, len(frames[1]), 1) + b"\0" * 32 + frames[1] + b"q"
    stop = threading.Event()

    def flood() -> None:
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        try:
            while not stop.is_set():
                for junk in (b"\x07", forged, b"\x01\x00" + b"\xff" * 5000):
                    try:
                        raw.sendto(junk, path)
                    except BlockingIOError:
                        time.sleep(0.0005)
        finally:
            raw.close()

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    got: set[int] = set()
    try:
        for i in range(300):
            transport.send(address, Message({"k": "x", "i": i}, b"p" * (i * 997 % 70_000)))
            frames_in = inbox.recv_nowait()
            while frames_in is not None:
                msg = transport.decode(frames_in, address)
                if msg is not None:
                    got.add(msg.header["i"])
                frames_in = inbox.recv_nowait()
        deadline = time.monotonic() + 10
        while len(got) < 300 and time.monotonic() < deadline:
            frames_in = inbox.recv_nowait()
            if frames_in is None:
                time.sleep(0.001)
                continue
            msg = transport.decode(frames_in, address)
            if msg is not None:
                got.add(msg.header["i"])
    finally:
        stop.set()
        flooder.join(5)
    assert got == set(range(300))
    assert transport.stats.dropped_bad_signature > 0 and lane.dropped > 0


def test_a_thread_that_sent_over_a_lane_leaves_no_socket_behind(transport):
    """Each sending thread has its own datagram socket; it must end with the thread, or a program
    that starts threads (one per task, say) runs out of descriptors."""
    sock, address, lane = bind_lane(transport)
    inbox = Inbox(sock, lane)
    transport.send(address, Message({"k": "x"}, b"p"))  # this thread's own socket, kept
    assert recv_within(inbox) is not None
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(100):
        th = threading.Thread(target=transport.send, args=(address, Message({"k": "x"}, b"p")))
        th.start()
        th.join(10)
        assert recv_within(inbox) is not None  # it went over the lane
    assert len(os.listdir("/proc/self/fd")) <= before
