"""How one signed message's frames go onto a ZeroMQ socket: copied, shared, or lent and tracked.

The caller's buffers are the caller's memory: value semantics say the caller may change them once a
send returns, so a buffer ZeroMQ still holds must be copied or waited for. Which one is decided here,
per frame; ``Transport`` picks the socket, holds its lock, and waits on the tracker returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

__all__ = ["ZERO_COPY_MIN", "send_frames"]

ZERO_COPY_MIN = 1 << 20
"""The caller's buffers smaller than this are copied as they are sent (tens of microseconds), so the
send need not wait for ZeroMQ to let go of them: a peer that reads nothing (SIGSTOPped) held the
caller until it was declared dead. Larger ones go without a copy and are waited for; between procs
of one host they travel through shared memory instead (``_shm``), with nothing to wait for."""

_SNDMORE = int(zmq.SNDMORE)


def send_frames(sock: zmq.Socket[Any], frames: Sequence[Any]) -> zmq.MessageTracker | None:
    """Send ``frames`` (signature, header, payload, then buffers) as one message; a tracker when the
    caller's memory was lent to ZeroMQ (wait on it before the caller may change that memory)."""
    if len(frames) <= 3:  # frame by frame with a plain int flag: send_multipart's enum arithmetic costs ~2 us
        for f in frames[:-1]:
            sock.send(f, _SNDMORE)
        sock.send(frames[-1])
        return None
    if _all_received(frames):  # a relay: ZeroMQ already owns these (refcounted, shareable)
        sock.send_multipart(frames, copy=False)
        return None
    return _send_tracked(sock, frames)  # the caller's memory: large buffers are waited for


def _all_received(frames: Sequence[Any]) -> bool:
    """Are all buffer frames ``zmq.Frame``s received off a socket? Those can be re-sent as they are, to
    any number of peers, with no copy and nothing to wait for: ZeroMQ counts their references."""
    return all(isinstance(f, zmq.Frame) for f in frames[3:])


def _send_tracked(sock: zmq.Socket[Any], frames: Sequence[Any]) -> zmq.MessageTracker | None:
    """Send a message that holds the caller's memory: immutable and received frames without a copy
    and nothing to wait for (ZeroMQ holds a reference), other buffers below ``ZERO_COPY_MIN`` copied,
    larger ones without a copy, each tracked: the tracker is done once ZeroMQ let go of all of them
    (pyzmq's multipart tracker follows only the last frame)."""
    trackers = []
    last = len(frames) - 1
    for i, f in enumerate(frames):
        flags = 0 if i == last else _SNDMORE
        if isinstance(f, (bytes, zmq.Frame)):
            sock.send(f, flags, copy=False)
        elif memoryview(f).nbytes < ZERO_COPY_MIN:
            sock.send(f, flags, copy=True)
        else:
            frame = zmq.Frame(f, track=True)
            sock.send(frame, flags, copy=False)
            trackers.append(frame.tracker)
    return zmq.MessageTracker(*trackers) if trackers else None
