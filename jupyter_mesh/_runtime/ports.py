"""Ports on the wire: values sent to a port of another process travel as one signed ``PORT`` message to
the process that opened it, which hands them to the entry under that number (``_core.ports``).

A sender's values to one port arrive in the order it sent them (one link, FIFO). A value for a port that
is closed (its receiver was dropped, or a once-port already used) is dropped and counted.

``ReplyPort`` is the port an ``@endpoint(explicit_response_port=True)`` receives: its first value is
the call's reply, sent the way the call asked for (to the caller, or to the agent gathering the ranks).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .._core.ports import Port, PortEntry, PortInbox, PortTable
from .._wire.protocol import OK, RAISED, Kind
from .._wire.serialize import dumps, loads
from .._wire.transport import Message, Transport
from ..errors import SerializationError
from .remote_errors import error_info

__all__ = ["Ports", "ReplyPort"]


class Ports:
    """One process's ports: the table of those it opened, and sending to any port."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self.table = PortTable()

    def open(self, entry: PortEntry, weak: bool = True) -> tuple[str, int]:
        """Register ``entry``; returns the address and number a :class:`Port` to it carries."""
        return self.transport.address, self.table.open(entry, weak)

    def send(self, address: str, port_id: int, ok: bool, obj: Any, rank: int | None) -> None:
        if address == self.transport.address:  # opened here: no wire
            if isinstance(self.table.peek(port_id), PortInbox):
                # a channel's receiver gets a copy, as from any other sender (and Monarch): what does not
                # pickle fails the send here too, and the sender may go on changing what it sent
                payload, bufs = _pickled(ok, obj)
                obj = loads(payload, [bytearray(b) for b in bufs])
            self.table.put(port_id, ok, obj, rank)  # a response port's entry pickles its reply itself
            return
        payload, bufs = _pickled(ok, obj)
        header: dict[str, Any] = {"k": Kind.PORT, "p": port_id, "ok": int(ok)}
        if rank is not None:
            header["rk"] = rank
        self.transport.send(address, Message(header, payload, bufs))

    def on_message(self, msg: Message) -> None:
        """A ``PORT`` message for one of ours (on the receive thread)."""
        h = msg.header
        entry = self.table.get(h.get("p", 0))
        if entry is None:
            return
        try:
            value = loads(msg.payload, msg.buffers)
        except Exception as e:  # noqa: BLE001 - the receiver learns why rather than waiting forever
            entry.put(False, e, h.get("rk"))
            return
        entry.put(bool(h.get("ok")), value, h.get("rk"))


def _pickled(ok: bool, obj: Any) -> tuple[bytes, list[memoryview]]:
    """A port's value (``ok``) or exception, pickled; a value that does not pickle is the sender's
    ``SerializationError`` (a ``TypeError``, as in Monarch), an exception that does not becomes a
    ``RuntimeError`` naming it."""
    if not ok and not isinstance(obj, BaseException):
        obj = RuntimeError(str(obj))
    try:
        return dumps(obj)
    except SerializationError as e:
        if ok:
            raise SerializationError(f"Port.send: the value does not pickle ({e.__cause__ or e})") from None
        return dumps(RuntimeError(f"{type(obj).__name__}: {obj}"))


class ReplyPort(PortEntry):
    """The entry behind an explicit response port: its first value becomes the call's reply."""

    once = True

    def __init__(self, reply: Callable[[dict[str, Any], int, bytes, list[Any]], None], header: dict[str, Any]):
        self._reply, self._header = reply, header
        self.used = False

    def put(self, ok: bool, value: Any, rank: int | None) -> None:
        self.used = True
        h = self._header
        if ok:
            try:
                payload, bufs = dumps(value)
            except SerializationError as e:
                ok, value = False, e
            else:
                self._reply(h, OK, payload, bufs)
                return
        exc = value if isinstance(value, BaseException) else RuntimeError(str(value))
        try:
            self._reply(h, RAISED, dumps(error_info(exc, h.get("ep", "")))[0], [])
        except Exception as e:  # noqa: BLE001 - the caller is gone, or the reply cannot be sent
            print(f"jupyter_mesh: could not reply through a response port: {e!r}", file=sys.stderr)

    @staticmethod
    def open(ports: Ports, reply: Callable[[dict[str, Any], int, bytes, list[Any]], None],
             header: dict[str, Any]) -> tuple[Port[Any], ReplyPort]:  # fmt: skip
        entry = ReplyPort(reply, header)
        address, port_id = ports.open(entry, weak=False)
        return Port(address, port_id), entry
