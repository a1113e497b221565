"""The private sockets between an agent, its template (fork server), the template's warm child and the
job's seed: one JSON message per SOCK_SEQPACKET packet, file descriptors attached (SCM_RIGHTS).

No threads and nothing heavy here: the template, which imports this, must stay safe to fork.
"""

from __future__ import annotations

import errno
import json
import socket
from typing import Any

__all__ = ["recv", "send_or_ignore"]


def send_or_ignore(sock: socket.socket, obj: dict[str, Any], fds: list[int] = ()) -> bool:  # type: ignore[assignment]
    """Send to a peer that may be gone (the seed, a warm child): whether it went."""
    try:
        socket.send_fds(sock, [json.dumps(obj).encode()], list(fds))
    except OSError:
        return False
    return True


def recv(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and its file descriptors; (None, []) once the other end is gone."""
    reset = False
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 4)
        except OSError as e:
            if e.errno == errno.EINTR:
                continue
            if e.errno == errno.ECONNRESET and not reset:  # a peer that closed with our messages unread:
                reset = True  # Linux says so once, before what it sent last (its last word): read on
                continue
            return None, []
        return (json.loads(data) if data else None), list(fds)
