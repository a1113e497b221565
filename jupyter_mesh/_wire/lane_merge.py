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

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

from .lane import Lane

__all__ = ["Inbox", "WatchedLanes", "recv_zmq_frames", "take"]


class Inbox:
    """An inbox's ZeroMQ socket and its lane (if any), read by one thread as one source of messages.

    Waiting is level-triggered (``zmq_poll`` on the socket and the lane's descriptor): it looks at
    ZeroMQ's own state each time. A wait on ZeroMQ's edge-triggered descriptor with a "found empty"
    flag (one ``poll`` and one ``recvmsg`` per lane message) measured ~60 us faster per ``call_one`` on
    a loaded VM but slower on a quiet one (README, "call_one, issue #14, second pass"), and every
    other use of the socket would have to keep that flag true: not worth it."""

    def __init__(self, sock: Any, lane: Lane | None):
        import zmq

        self._zmq = zmq
        self.sock, self.lane = sock, lane
        self.poll_list: list[Any] = [(sock, zmq.POLLIN)]
        if lane is not None:
            self.poll_list.append((lane.fd, zmq.POLLIN))

    def recv(self) -> list[Any]:
        """The next message's frames, from the socket or the lane, waiting for one. Raises
        ``zmq.ZMQError`` once the socket is closed."""
        if self.lane is None:
            return recv_zmq_frames(self.sock, 0)
        while True:
            frames = self.recv_nowait()
            if frames is not None:
                return frames
            if self.lane.closed:
                raise self._zmq.ZMQError(self._zmq.ENOTSOCK, "the inbox was closed")
            self._zmq.zmq_poll(self.poll_list, -1)

    def wait(self, timeout_ms: int, spin_s: float = 0.0) -> bool:
        """Wait up to ``timeout_ms`` (-1: for ever) until a message may be waiting; reads nothing, so
        an interrupt here loses nothing. True: :meth:`recv_nowait` is worth a try (a message read
        with another but not returned yet, ``take``, is there without a poll). ``spin_s``: look
        without sleeping for that long first (a reply due in microseconds: see ``replies.SPIN_S``)."""
        if self.lane is not None and self.lane.holds():
            return True
        poll, items = self._zmq.zmq_poll, self.poll_list
        if spin_s > 0.0 and timeout_ms != 0:
            start = time.perf_counter()
            end = start + (spin_s if timeout_ms < 0 else min(spin_s, timeout_ms / 1000))
            while True:
                if poll(items, 0):
                    return True
                now = time.perf_counter()
                if now >= end:
                    break
            if timeout_ms > 0:
                timeout_ms = max(0, timeout_ms - int((now - start) * 1000))
        return bool(poll(items, timeout_ms))

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
        return take(self.sock, self.lane)

    def pending(self) -> bool:
        """Is a message waiting, on the socket or on the lane? (never blocks)"""
        if self.lane is not None and self.lane.holds():
            return True
        if self.sock.getsockopt(self._zmq.EVENTS) & self._zmq.POLLIN:
            return True
        return self.lane is not None and self.lane.pending()


class WatchedLanes:
    """The inboxes with a lane that a transport's receive thread watches (``Transport.watch``), by
    socket and by lane descriptor (its poller reports either), each read with :func:`take`."""

    def __init__(self) -> None:
        import zmq

        self._error = zmq.ZMQError
        self._lane_of: dict[Any, Lane] = {}  # socket -> its lane
        self._socks: dict[int, Any] = {}  # lane's fd -> socket

    def add(self, sock: Any, lane: Lane) -> None:
        self._lane_of[sock] = lane
        self._socks[lane.fd] = sock

    def remove(self, sock: Any, lane: Lane | None) -> bool:
        """Forget ``sock``; True if ``lane``'s descriptor was watched (the caller unregisters it)."""
        self._lane_of.pop(sock, None)
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


def take(sock: Any, lane: Lane) -> list[Any] | None:
    """The next message of an inbox with a lane (its socket ``sock``), if one is waiting, else None.

    With messages waiting both ways, one sender's older one goes first: its counter is one for all its
    destinations, so a lane message taken first could be thousands of counters ahead of a ZeroMQ one
    it sent before (or the other way), and the replay window (``replay.WINDOW``) would drop the older
    one as a replay: a call lost, its caller waiting for ever. So the two ways merge by counter; the
    one read but not yet returned waits on the lane, for whichever thread reads the inbox next."""
    z = lane.held_zmq
    if z is None and sock.getsockopt(_EVENTS) & _POLLIN:
        try:
            z = recv_zmq_frames(sock, _NOBLOCK)
        except Exception as e:  # zmq.Again: the message went to another poll (not ours to lose)
            if getattr(e, "errno", None) != _EAGAIN:
                raise
    d = lane.held_dgram
    if d is None:
        d = lane.recv_frames()
    if z is None or d is None:
        lane.held_zmq = lane.held_dgram = None
        return z if z is not None else d
    if _older(d, z):
        lane.held_zmq, lane.held_dgram = z, None
        return d
    lane.held_zmq, lane.held_dgram = None, d
    return z


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
