"""Ports: Monarch's explicit channels. ``Channel.open()`` gives a ``Port`` (where to send) and a
``PortReceiver`` (where values arrive); the port is a small picklable value, so any actor or the
controller can be handed it and ``send`` to it, in order, from any thread.

A port is an address and a number: the receiving end lives in the process that opened it, which keeps
a table of its open ports (``PortTable``). Sending from that same process puts the value straight in;
from any other, the runtime carries it as a signed message like every other (``_runtime.ports``).
The same mechanism gives ``@endpoint(explicit_response_port=True)`` its port: an entry whose values
become the call's reply.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..errors import MeshValueError
from .context import context
from .future import Future

__all__ = ["Channel", "DroppingPort", "Port", "PortEntry", "PortInbox", "PortReceiver", "PortTable"]

R = TypeVar("R")


class PortEntry:
    """What a port number leads to in its process: ``put`` a value (``ok``) or an exception; ``once``
    entries are removed after their first value."""

    once = False

    def put(self, ok: bool, value: Any, rank: int | None) -> None:
        raise NotImplementedError


class PortInbox(PortEntry):
    """The receiving end of a channel: values wait here until ``recv`` takes them, in arrival order."""

    def __init__(self, once: bool = False):
        self.once = once
        self._lock = threading.Lock()
        self._items: collections.deque[tuple[bool, Any, int | None]] = collections.deque()
        self._waiting: collections.deque[tuple[Future[Any], bool]] = collections.deque()
        self._taken = False  # a once-inbox's one recv() was made

    def put(self, ok: bool, value: Any, rank: int | None) -> None:
        with self._lock:
            while self._waiting:
                fut, ranked = self._waiting.popleft()
                if not fut._done():  # a cancelled recv gives its place to the next one
                    break
            else:
                self._items.append((ok, value, rank))
                return
        _settle(fut, ok, value, rank, ranked)

    def take(self, ranked: bool) -> Future[Any]:
        fut: Future[Any] = Future("PortReceiver.recv")
        fut._any_thread = True  # a sender in this process (any thread) puts its value straight in
        with self._lock:
            if self.once and self._taken:  # Monarch's ValueError, at once: no second value can come
                fut._set_exception(
                    MeshValueError(
                        "OncePort is already used: the receiver of Channel.open(once=True) gives one value, "
                        "and recv() was called for it already; open a new channel for another"
                    )
                )
                return fut
            self._taken = True
            if not self._items:
                self._waiting.append((fut, ranked))
                return fut
            ok, value, rank = self._items.popleft()
        _settle(fut, ok, value, rank, ranked)
        return fut


def _settle(fut: Future[Any], ok: bool, value: Any, rank: int | None, ranked: bool) -> None:
    if ok:
        fut._set_result((rank, value) if ranked else value)
    else:
        fut._set_exception(value if isinstance(value, BaseException) else RuntimeError(str(value)))


class PortTable:
    """This process's open ports, by number. Inboxes are held weakly: a receiver nobody holds any more
    closes its port (values sent to it are then dropped, and counted)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._entries: dict[int, PortEntry | weakref.ref[PortEntry]] = {}
        self.dropped = 0

    def open(self, entry: PortEntry, weak: bool) -> int:
        port_id = next(self._ids)
        with self._lock:
            self._entries[port_id] = weakref.ref(entry) if weak else entry
        return port_id

    def close(self, port_id: int) -> None:
        with self._lock:
            self._entries.pop(port_id, None)

    def peek(self, port_id: int) -> PortEntry | None:
        """The entry under ``port_id``, if open, without using up a once-port."""
        with self._lock:
            held = self._entries.get(port_id)
        return held() if isinstance(held, weakref.ref) else held

    def get(self, port_id: int) -> PortEntry | None:
        with self._lock:
            held = self._entries.get(port_id)
            entry = held() if isinstance(held, weakref.ref) else held
            if entry is None:
                self._entries.pop(port_id, None)
                self.dropped += 1
                return None
            if entry.once:
                del self._entries[port_id]
            return entry

    def put(self, port_id: int, ok: bool, value: Any, rank: int | None) -> bool:
        entry = self.get(port_id)
        if entry is None:
            return False
        entry.put(ok, value, rank)
        return True


class Port(Generic[R]):
    """Where to send values of type ``R``: reliable and in order from each sender. Picklable."""

    __slots__ = ("_address", "_id", "_once", "_rank", "_used")

    def __init__(self, address: str, port_id: int, rank: int | None = None, once: bool = False):
        self._address, self._id, self._rank = address, port_id, rank
        self._once, self._used = once, False  # a once-port (``Channel.open(once=True)``) sends one value

    def send(self, obj: R) -> None:
        """Fire and forget: ``obj`` goes to the receiver (or, for an endpoint's port, back to its caller)."""
        self._use()
        _sender()(self._address, self._id, True, obj, self._rank)

    def exception(self, exc: BaseException) -> None:
        """The receiver's ``recv()`` (or the endpoint's caller) raises ``exc``."""
        self._use()
        _sender()(self._address, self._id, False, exc, self._rank)

    def _use(self) -> None:
        if self._once:
            if self._used:  # Monarch's RuntimeError; the receiver would drop it anyway
                raise RuntimeError(
                    f"OncePortRef already used: port {self._id} of Channel.open(once=True) takes one value, and "
                    "one was sent through this Port; open a new channel for another"
                )
            self._used = True

    def _ranked(self, rank: int) -> Port[R]:
        return Port(self._address, self._id, rank, self._once)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Port, (self._address, self._id, self._rank, self._once))

    def __repr__(self) -> str:
        return f"<Port {self._id} at {self._address}>"


class DroppingPort(Port[R]):
    """The port of a call nobody waits for (``broadcast``): what is sent to it goes nowhere."""

    def __init__(self) -> None:
        super().__init__("", 0)

    def send(self, obj: R) -> None:
        pass

    def exception(self, exc: BaseException) -> None:
        pass

    def __reduce__(self) -> tuple[Any, ...]:
        return (DroppingPort, ())


class PortReceiver(Generic[R]):
    """The receiving end of a channel, in the process that opened it (it does not pickle)."""

    def __init__(self, inbox: PortInbox, ranked: bool = False):
        self._inbox, self._ranked = inbox, ranked

    def recv(self) -> Future[R]:
        """The next value, in arrival order: ``.get()`` it or ``await`` it."""
        return self._inbox.take(self._ranked)

    def ranked(self) -> PortReceiver[tuple[int, R]]:
        """The same receiver, giving ``(rank, value)``: the rank of the sender when a mesh call's ranks
        send their results here (``send(..., port=...)``)."""
        return PortReceiver(self._inbox, ranked=True)

    def __reduce__(self) -> tuple[Any, ...]:
        raise MeshValueError(
            "a PortReceiver stays in the process that opened the channel; pass its Port to other actors instead"
        )


class Channel(Generic[R]):
    """``port, receiver = Channel.open()`` (or ``Channel[int].open()``): a new channel into this process."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        inbox = PortInbox(once)
        address, port_id = _opener()(inbox)
        return Port(address, port_id, once=once), PortReceiver(inbox)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], PortReceiver[tuple[int, R]]]:
        port, receiver = Channel[R].open(once)
        return port, receiver.ranked()


def _sender() -> Callable[[str, int, bool, Any, int | None], None]:
    return context().client().send_to_port


def _opener() -> Callable[[PortInbox], tuple[str, int]]:
    return context().client().open_port
