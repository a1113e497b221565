"""The same-host lane (``_wire/lane.py``): small messages skip ZeroMQ, everything else still goes through
it, and a datagram is held to the same checks as a ZeroMQ message (signature, framing, replay).

Unit tests: one process, a real transport bound in a private directory, no procs.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import zmq
from _lanes import bind_lane, lane_transport, recv_within

from jupyter_mesh._wire import lane as _lane
from jupyter_mesh._wire.lane_merge import Inbox, recv_zmq_frames
from jupyter_mesh._wire.transport import Message, Transport


@pytest.fixture
def transport():
    with lane_transport() as t:
        yield t


def test_small_messages_take_the_lane_and_large_ones_zeromq(transport):
    sock, address, lane = bind_lane(transport)
    assert lane is not None and address.endswith(_lane.MARK)
    inbox = Inbox(sock, lane)
    transport.send(address, Message({"k": "x", "i": 1}, b"small"))
    assert lane.pending()  # it is on the datagram socket, not on ZeroMQ's
    msg = transport.decode(recv_within(inbox), address)
    assert msg is not None and msg.header["i"] == 1 and msg.payload == b"small"
    big = b"b" * _lane.MAX_BYTES
    transport.send(address, Message({"k": "x", "i": 2}, big))
    assert not lane.pending()
    msg = transport.decode(recv_within(inbox), address)
    assert msg is not None and msg.payload == big
    assert transport.stats.dropped == 0


def test_a_datagram_is_checked_like_any_message(transport):
    sock, address, lane = bind_lane(transport)
    inbox = Inbox(sock, lane)
    assert lane is not None
    frames = transport.encode(Message({"k": "x", "i": 1}, b"p"), address)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = _lane.lane_path(address)
    try:
        # the same signed frames twice: the copy is a replay
        assert transport._lane_out.send(address, frames) and transport._lane_out.send(address, frames)
        assert transport.decode(recv_within(inbox), address) is not None
        assert transport.decode(recv_within(inbox), address) is None
        assert transport.stats.dropped_replayed == 1
        # well framed, wrong signature: dropped before anything is unpickled
        forged = [b"\0" * 32, frames[1], frames[2]]
        assert transport._lane_out.send(address, forged)
        assert transport.decode(recv_within(inbox), address) is None
        assert transport.stats.dropped_bad_signature == 1
        # not our framing at all (lengths that do not add up, a bare byte, too long): never returned
        raw.sendto(b"\x03\x00" + b"\xff" * 12, path)
        raw.sendto(b"x", path)
        raw.sendto(b"\x01\x00" + (70_000).to_bytes(4, "little") + b"z" * 70_000, path)
        time.sleep(0.05)
        assert inbox.recv_nowait() is None and inbox.recv_nowait() is None and inbox.recv_nowait() is None
        assert lane.dropped == 3 and not lane.pending()
    finally:
        raw.close()


def test_a_full_or_gone_lane_falls_back_to_zeromq(transport):
    sock, address, lane = bind_lane(transport)
    inbox = Inbox(sock, lane)
    assert lane is not None
    for i in range(50):  # nobody reads: the kernel queues a few datagrams, ZeroMQ the rest
        transport.send(address, Message({"k": "x", "i": i}, b"p"))
    got = sorted(transport.decode(recv_within(inbox), address).header["i"] for _ in range(50))  # type: ignore[union-attr]
    assert got == list(range(50))
    lane.close()  # the reader's lane is gone (its socket file too): sends still arrive, over ZeroMQ
    assert not os.path.exists(_lane.lane_path(address) or "")
    transport.send(address, Message({"k": "x", "i": 99}, b"p"))
    assert sock.poll(5000)
    msg = transport.decode(recv_zmq_frames(sock, 0), address)
    assert msg is not None and msg.header["i"] == 99


def _recv_in_thread(inbox: Inbox, timeout: float = 10.0) -> list | None:
    """``inbox.recv()`` (which blocks) on another thread, given up after ``timeout``."""
    got: list = []
    t = threading.Thread(target=lambda: got.append(inbox.recv()), daemon=True)
    t.start()
    t.join(timeout)
    return got[0] if got else None


def test_a_reader_that_found_zeromq_empty_still_wakes_for_it(transport):
    """Once ZeroMQ was found empty the reader waits on the socket and the lane: a large message sent
    then must still wake it, and be seen by ``pending``; the lane keeps working beside it."""
    sock, address, lane = bind_lane(transport)
    inbox = Inbox(sock, lane)
    transport.send(address, Message({"k": "x", "i": 1}, b"small"))
    assert transport.decode(inbox.recv(), address).header["i"] == 1  # type: ignore[union-attr]
    assert not inbox.pending()
    big = b"b" * (_lane.MAX_BYTES + 1)
    threading.Timer(0.2, lambda: transport.send(address, Message({"k": "x", "i": 2}, big))).start()
    msg = transport.decode(_recv_in_thread(inbox) or [], address)  # blocked in poll when it was sent
    assert msg is not None and msg.header["i"] == 2 and msg.payload == big
    transport.send(address, Message({"k": "x", "i": 3}, big))
    deadline = time.monotonic() + 5
    while not inbox.pending() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not lane.pending()  # it is on ZeroMQ's socket, and pending() saw it there
    transport.send(address, Message({"k": "x", "i": 4}, b"small"))
    got = [transport.decode(_recv_in_thread(inbox) or [], address) for _ in range(2)]
    assert [m.header["i"] for m in got if m is not None] == [3, 4]
    assert not inbox.pending() and transport.stats.dropped == 0


def test_a_reader_asks_zeromq_again_after_someone_else_polled_it(transport):
    """A ``zmq.Poller`` (the receive thread reading a reply box it adopted) clears ZeroMQ's descriptor
    when it looks: after ``Transport.watch``/``unwatch`` the next reader still finds the message."""
    sock, address, lane = bind_lane(transport)
    inbox = Inbox(sock, lane)
    assert inbox.recv_nowait() is None
    transport.send(address, Message({"k": "x", "i": 1}, b"b" * (_lane.MAX_BYTES + 1)))
    assert sock.poll(5000)  # an outside look: the descriptor no longer says anything is there
    transport._poller = zmq.Poller()  # as serve() would have it, for watch/unwatch
    transport.watch(sock, b"bell", lane)
    transport.unwatch(sock, lane)
    msg = transport.decode(_recv_in_thread(inbox) or [], address)
    assert msg is not None and msg.header["i"] == 1


def test_tcp_binds_have_no_lane():
    t = Transport(os.urandom(32), bind="tcp://127.0.0.1")
    try:
        sock, address, lane = t.bind_inbox_with_lane()
        assert lane is None and not address.endswith(_lane.MARK)
        sock.close(linger=0)
    finally:
        t.close()
