"""The set-up the lane tests share: a real transport bound in a private directory, inboxes with a lane
on it (closed with the transport), and a read that gives up after a while instead of hanging."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from jupyter_mesh._wire.lane import Lane
from jupyter_mesh._wire.lane_merge import Inbox
from jupyter_mesh._wire.transport import Transport


@contextlib.contextmanager
def lane_transport() -> Iterator[Transport]:
    d = tempfile.mkdtemp(prefix="jm-lane-")
    t = Transport(os.urandom(32), bind=f"ipc://{d}")
    socks: list[Any] = []
    t.test_socks = socks  # type: ignore[attr-defined]
    try:
        yield t
    finally:
        for s in socks:
            s.close(linger=0)
        t.close()
        shutil.rmtree(d, ignore_errors=True)


def bind_lane(t: Transport) -> tuple[Any, str, Lane]:
    """An inbox with a lane on ``t`` (from :func:`lane_transport`): its socket, address and lane."""
    sock, address, lane = t.bind_inbox_with_lane()
    t.test_socks.append(sock)  # type: ignore[attr-defined]
    assert lane is not None
    return sock, address, lane


def recv_within(inbox: Inbox, timeout: float = 5.0) -> list[Any] | None:
    """The next message's frames, or None if none came within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frames = inbox.recv_nowait()
        if frames is not None:
            return frames
        time.sleep(0.002)
    return None
