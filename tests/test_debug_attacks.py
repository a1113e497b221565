"""Attacks on the debugging features (issue 15) from the outside: malformed requests to the debug
socket, a front that casts or continues a rank another front holds, a terminal whose controller went
away. Each test failed before its fix."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from typing import Any

import pytest

from jupyter_mesh._runtime.debug_socket import DebugSocket


class _NoPauses:
    def paused(self) -> list[Any]:
        return []


@pytest.fixture
def server():
    directory = tempfile.mkdtemp()
    srv = DebugSocket(_NoPauses(), os.path.join(directory, "1.sock"))  # type: ignore[arg-type]
    yield srv
    srv.close()
    os.rmdir(directory)


def _client(srv: DebugSocket) -> tuple[socket.socket, Any]:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(10)
    c.connect(srv.path)
    return c, c.makefile("rb")


def test_hostile_lines_get_an_answer_and_the_connection_stays_usable(server):
    c, reader = _client(server)
    try:
        for bad in (
            b"[" * 100_000 + b"]" * 100_000,  # deeper than json's parser goes: RecursionError
            b"\xff\xfe\x00binary",
            b'"just a string"',
            b"[1, 2]",
            b'{"op": "continue", "keys": 5}',
            b'{"op": "cast", "keys": [], "line": "p 1"}',
            b'{"op": "nope"}',
            b'{"op": "line", "line": "p 1"}',
        ):
            c.sendall(bad + b"\n")
            answer = json.loads(reader.readline())
            assert isinstance(answer, dict), answer
        c.sendall(b'{"op": "hello"}\n')
        assert json.loads(reader.readline())["pid"] == os.getpid()
    finally:
        reader.close()
        c.close()
