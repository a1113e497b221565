"""How the caller's buffers go onto a socket (``_wire.frame_send``): copied as they are sent, so a send
returns at once and the caller may change them; a large one into a reused buffer, never one that
ZeroMQ still holds."""

from __future__ import annotations

import gc

import pytest
import zmq

from jupyter_mesh._wire import frame_send

np = pytest.importorskip("numpy")


@pytest.fixture
def pair():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://frames")
    b.connect("inproc://frames")
    yield a, b
    a.close(linger=0)
    b.close(linger=0)
    ctx.term()


@pytest.mark.parametrize("nbytes", [100, frame_send.WARM_MIN - 1, frame_send.WARM_MIN, 8 << 20])
def test_a_sent_buffer_is_the_callers_no_more_and_a_held_copy_is_never_reused(pair, nbytes):
    a, b = pair
    arr = np.full(nbytes, 1, np.uint8)
    frame_send.send_frames(a, [b"sig", b"hdr", b"payload", arr])  # held by ZeroMQ: b reads nothing yet
    arr[:] = 2  # value semantics: the message carries what the array held at the send
    frame_send.send_frames(a, [b"sig", b"hdr", b"payload", arr])  # a second copy, not the first one's buffer
    arr[:] = 3
    first, second = b.recv_multipart(copy=False), b.recv_multipart(copy=False)
    assert [bytes(f.buffer) for f in first[:3]] == [b"sig", b"hdr", b"payload"]
    assert np.frombuffer(first[3].buffer, np.uint8).tolist() == [1] * nbytes
    assert np.frombuffer(second[3].buffer, np.uint8).tolist() == [2] * nbytes


def test_a_large_buffer_is_copied_into_one_let_go_of_before(pair):
    """The second send reuses the first's buffer once the receiver dropped it (pages already touched:
    a memcpy, not a fresh allocation's page faults), and not while it held it."""
    a, b = pair
    arr = np.full(4 << 20, 7, np.uint8)
    frame_send.send_frames(a, [b"s", b"h", b"p", arr])
    held = b.recv_multipart(copy=False)
    first = held[3].buffer
    frame_send.send_frames(a, [b"s", b"h", b"p", arr])  # the first is still held here
    second = b.recv_multipart(copy=False)
    earlier = {_address(first), _address(second[3].buffer)}
    assert len(earlier) == 2
    del held, first, second
    gc.collect()
    frame_send.send_frames(a, [b"s", b"h", b"p", arr])
    third = b.recv_multipart(copy=False)
    assert _address(third[3].buffer) in earlier  # reused, now that the receiver let go
    assert np.frombuffer(third[3].buffer, np.uint8).min() == 7


def test_a_message_for_several_peers_is_copied_once_and_shared(pair):
    a, b = pair
    arr = np.full(2 << 20, 5, np.uint8)
    frames = frame_send.owned([b"s", b"h", b"p", arr, memoryview(b"small")])
    arr[:] = 0
    assert all(isinstance(f, zmq.Frame) for f in frames[3:])
    for _ in range(3):
        frame_send.send_frames(a, frames)
    got = [b.recv_multipart() for _ in range(3)]
    assert {g[3] for g in got} == {bytes([5]) * (2 << 20)} and {g[4] for g in got} == {b"small"}


def test_a_non_contiguous_buffer_is_sent_as_its_values(pair):
    a, b = pair
    base = np.arange(4 << 20, dtype=np.uint8)
    view = base[::2]  # not C-contiguous: copied element by element
    frame_send.send_frames(a, [b"s", b"h", b"p", view])
    got = b.recv_multipart()
    assert got[3] == view.tobytes()


def _address(buf) -> int:
    return np.frombuffer(buf, np.uint8).__array_interface__["data"][0]


def test_a_send_never_waits_for_its_peer_even_past_the_warm_buffers(pair, monkeypatch):
    """A peer that reads nothing (stopped) holds its messages: the warm buffers run out after
    ``max_bytes``, and later sends are copied by ZeroMQ instead. None waits: a send runs under the
    socket's lock (heartbeats, the socket's close) and a cast's under the calls' lock; a wait for
    memory there stalled a whole controller behind one stopped proc."""
    import threading

    a, b = pair
    monkeypatch.setattr(frame_send, "_copies", frame_send._WarmCopies(max_bytes=3 << 20))
    arr = np.arange(2 << 20, dtype=np.uint8)

    def flood() -> None:
        for _ in range(6):  # 12 MiB for a peer that reads nothing yet
            frame_send.send_frames(a, [b"s", b"h", b"p", arr])

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()
    sender.join(30)
    assert not sender.is_alive(), "a send waited for a peer that reads nothing"
    got = [b.recv_multipart() for _ in range(6)]
    assert all(g[3] == arr.tobytes() for g in got)
