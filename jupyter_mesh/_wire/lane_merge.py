"""Reading an inbox that has a lane: its ZeroMQ socket and its datagram lane merged into one source.

A sender puts a small message on the lane (``lane``) and a larger one, or one the lane did not take at
once, on ZeroMQ; so two messages of one sender can arrive in either order. Readers of such inboxes do
not depend on arrival order, but the receiver's replay window (``replay.WINDOW``) does: a message
taken long after a newer one of its sender is dropped as a replay, and its call is lost. This module is
where the two ways are read together and merged by each sender's counter (:func:`take`), for the two
kinds of reader: one thread that owns the inbox (:class:`Inbox`: actor inboxes, reply boxes), and the
receive thread that watches borrowed reply boxes among its other sockets (:class:`WatchedLanes`).
"""

from __future__ import annotations

import select
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

from .lane import Lane

__all__ = ["Inbox", "WatchedLanes", "recv_zmq_frames", "take"]


class Inbox:
    """An inbox's ZeroMQ socket and its lane (if any), read by one thread as one source of messages.

    With a lane, the reader waits in one ``poll`` on the lane and on the socket's ZeroMQ descriptor,
    and asks ZeroMQ (``ZMQ_EVENTS``: a system call and ~3 us of pyzmq a look) only when that
    descriptor says something changed or the socket may still hold messages (:attr:`Lane.zmq_quiet`);
    a lane message then costs one ``poll`` and one ``recvmsg``. One ``Inbox`` per reading thread."""

    def __init__(self, sock: Any, lane: Lane | None):
        import zmq

        self._zmq = zmq
        self.sock, self.lane = sock, lane
        self.poll_list: list[Any] = [(sock, zmq.POLLIN)]
        self._poll: Any = None
        self._lane_fd = -1
        self._ready: list[tuple[int, int]] | None = None  # what the last ``wait`` saw, for the next read
        if lane is not None:
            self._poll = select.poll()
            self._poll.register(int(sock.getsockopt(zmq.FD)), select.POLLIN)
            self._poll.register(lane.fd, select.POLLIN)
            self._lane_fd = lane.fd

    def recv(self) -> list[Any]:
        """The next message's frames, from the socket or the lane, waiting for one. Raises
        ``zmq.ZMQError`` once the socket is closed."""
        lane = self.lane
        if lane is None:
            return recv_zmq_frames(self.sock, 0)
        while True:
            frames = self._take(self._look(-1))
            if frames is not None:
                return frames
            if lane.closed:
                raise self._zmq.ZMQError(self._zmq.ENOTSOCK, "the inbox was closed")

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` (-1: for ever) until a message may be waiting; reads nothing, so
        an interrupt here loses nothing. True: :meth:`recv_nowait` is worth a try."""
        if self.lane is None:
            return bool(self._zmq.zmq_poll(self.poll_list, timeout_ms))
        self._ready = ready = self._look(timeout_ms)
        return ready is None or bool(ready)

    def _look(self, timeout_ms: int) -> list[tuple[int, int]] | None:
        """The descriptors that are readable, waiting up to ``timeout_ms`` for one; None: something may
        be waiting already (a held message, or ZeroMQ not known to be empty), look at everything."""
        lane = self.lane
        assert lane is not None
        if lane.held_zmq is not None or lane.held_dgram is not None or not lane.zmq_quiet:
            return None
        return self._poll.poll(timeout_ms)  # type: ignore[no-any-return]

    def _take(self, ready: list[tuple[int, int]] | None) -> list[Any] | None:
        lane = self.lane
        assert lane is not None
        if ready is None:
            return take(self.sock, lane)
        if not ready:
            return None
        zmq_ready = dgram_ready = False
        for fd, _ in ready:  # any event (an error too) is worth a look: the read reports it
            if fd == self._lane_fd:
                dgram_ready = True
            else:
                zmq_ready = True
        return take(self.sock, lane, zmq_ready, dgram_ready)

    def recv_nowait(self) -> list[Any] | None:
        """The next message's frames if one is waiting (one sender's older first: :func:`take`), else None."""
        if self.lane is None:
            zmq = self._zmq
            if self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                try:
                    return recv_zmq_frames(self.sock, zmq.NOBLOCK)
                except zmq.Again:
                    pass
            return None
        ready, self._ready = self._ready, None
        return self._take(ready if ready else self._look(0))

    def pending(self) -> bool:
        """Is a message waiting, on the socket or on the lane? (never blocks)"""
        lane = self.lane
        if lane is None:
            return bool(self.sock.getsockopt(self._zmq.EVENTS) & self._zmq.POLLIN)
        ready = self._look(0)
        if ready is None:  # held, or ZeroMQ not known to be empty
            return lane.holds() or lane.pending() or _zmq_has_in(self.sock, lane)
        if any(fd == self._lane_fd for fd, _ in ready):
            return True
        return bool(ready) and _zmq_has_in(self.sock, lane)


class WatchedLanes:
    """The inboxes with a lane that a transport's receive thread watches (``Transport.watch``), by
    socket and by lane descriptor (its poller reports either), each read with :func:`take`."""

    def __init__(self) -> None:
        import zmq

        self._error = zmq.ZMQError
        self._lane_of: dict[Any, Lane] = {}  # socket -> its lane
        self._socks: dict[int, Any] = {}  # lane's fd -> socket

    def add(self, sock: Any, lane: Lane) -> None:
        lane.zmq_quiet = False  # the receive thread's poller looks at the socket now (``Lane.zmq_quiet``)
        self._lane_of[sock] = lane
        self._socks[lane.fd] = sock

    def remove(self, sock: Any, lane: Lane | None) -> bool:
        """Forget ``sock``; True if ``lane``'s descriptor was watched (the caller unregisters it)."""
        self._lane_of.pop(sock, None)
        if lane is not None:  # the poller may have cleared its descriptor: its next reader asks ZeroMQ
            lane.zmq_quiet = False
        return lane is not None and self._socks.pop(lane.fd, None) is not None

    def __contains__(self, key: Any) -> bool:
        """Is ``key`` (what a poll reported ready) one of ours? A bare descriptor is always a lane's."""
        return type(key) is int or key in self._lane_of

    def drain(self, key: Any, tokens: Mapping[Any, bytes], handle: Callable[[list[Any]], None]) -> None:
        """Hand ``handle`` everything waiting on the inbox of ``key`` (its socket or its lane's fd), in
        its senders' order; one-frame messages equal to its socket's doorbell in ``tokens`` are skipped."""
        sock: Any = self._socks.get(key) if type(key) is int else key
        lane = self._lane_of.get(sock)
        if lane is None:
            return
        token = tokens.get(sock)
        while True:
            try:
                frames = take(sock, lane)
            except self._error:
                return
            if frames is None:
                return
            if len(frames) == 1 and frames[0] == token:
                continue
            handle(frames)

    def holding(self) -> list[Any]:
        """The sockets whose lane holds a message read but not returned (by its previous reader, before
        the box was watched): no poll reports those, so the receive thread drains them after its tick."""
        return [sock for sock, lane in self._lane_of.items() if lane.holds()]


def take(sock: Any, lane: Lane, zmq_ready: bool | None = None, dgram_ready: bool = True) -> list[Any] | None:
    """The next message of an inbox with a lane (its socket ``sock``), if one is waiting, else None.

    ``zmq_ready``/``dgram_ready``: what a ``poll`` of the socket's descriptor and the lane just said
    (``Inbox``); by default both are looked at. ZeroMQ is asked unless its descriptor stayed quiet
    since it was last found empty (``Lane.zmq_quiet``).

    With messages waiting both ways, one sender's older one goes first: its counter is one for all its
    destinations, so a lane message taken first could be thousands of counters ahead of a ZeroMQ one
    it sent before (or the other way), and the replay window (``replay.WINDOW``) would drop the older
    one as a replay: a call lost, its caller waiting for ever. So the two ways merge by counter; the
    one read but not yet returned waits on the lane, for whichever thread reads the inbox next."""
    z = lane.held_zmq
    if z is None and (zmq_ready is None or zmq_ready or not lane.zmq_quiet) and _zmq_has_in(sock, lane):
        try:
            z = recv_zmq_frames(sock, _NOBLOCK)
        except Exception as e:  # zmq.Again: the message went to another poll (not ours to lose)
            if getattr(e, "errno", None) != _EAGAIN:
                raise
    d = lane.held_dgram
    if d is None and dgram_ready:
        d = lane.recv_frames()
    if z is None or d is None:
        lane.held_zmq = lane.held_dgram = None
        return z if z is not None else d
    if _older(d, z):
        lane.held_zmq, lane.held_dgram = z, None
        return d
    lane.held_zmq, lane.held_dgram = None, d
    return z


def _zmq_has_in(sock: Any, lane: Lane) -> bool:
    """Ask ZeroMQ whether a message waits (``ZMQ_EVENTS``, which also clears its descriptor), and note
    the answer: until a message is taken or the descriptor turns readable, asking again is not needed."""
    has_in = bool(sock.getsockopt(_EVENTS) & _POLLIN)
    lane.zmq_quiet = not has_in
    return has_in


def _older(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Did one sender number ``a`` before ``b``? (False for two senders, or anything not well formed:
    this only orders messages; ``Transport.decode`` authenticates them.)"""
    try:
        ha, hb = msgpack.unpackb(a[1]), msgpack.unpackb(b[1])
        return bool(ha["se"] == hb["se"] and ha["sn"] < hb["sn"])
    except Exception:  # noqa: BLE001 - unauthenticated bytes: no order to keep
        return False


def recv_zmq_frames(sock: Any, flags: int) -> list[Any]:
    """Small frames (signature, header, payload) as bytes; buffer frames without copying.

    Copying a small frame is cheaper than wrapping it in a ``zmq.Frame`` (~30 us a message here).
    """
    frames: list[Any] = [sock.recv(flags)]
    while sock.getsockopt(_RCVMORE):
        frames.append(sock.recv(copy=len(frames) < 3))
    return frames


# ZeroMQ's constants (zmq is not imported here at module level: see ``Inbox``)
_RCVMORE, _EVENTS, _POLLIN, _NOBLOCK, _EAGAIN = 13, 15, 1, 1, 11
