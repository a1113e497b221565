"""Signed ZeroMQ messaging: one bound inbox per process, one outgoing socket per peer.

Every message is ``[signature, header, payload, *buffers]``. ``header`` is msgpack (its kinds and keys are
``protocol``'s), ``payload`` a pickle, ``buffers`` the pickle's out-of-band buffers sent without copying.
Small messages to an inbox of this host that has a lane skip ZeroMQ's I/O threads (``lane``; ``lane_merge``
reads both ways of such an inbox in order).
The signature is HMAC-SHA256 with the session key over header and payload, as Jupyter signs its
messages; the header also pins the number and length of every buffer frame. A message whose signature
or framing does not check out is dropped and counted *before* anything in it is decoded or unpickled.

This module knows nothing of actors or meshes.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

from .._core.future import mark_receive_thread
from . import lane as _lane
from . import shm as _shm
from .channels import (
    HANDSHAKE_MS,
    CurveKeys,
    OnlyClientKey,
    check_bind,
    check_frames_fit,
    curve_wanted,
    is_loopback,
    max_frame,
    raise_fd_limit,
)
from .frame_send import send_frames
from .lane_merge import WatchedLanes, recv_zmq_frames
from .protocol import VERSION, Kind
from .replay import ReplayGuard

__all__ = ["Message", "Transport", "TransportStats"]

log = logging.getLogger("jupyter_mesh.transport")

_compare_digest, _unpackb = hmac.compare_digest, msgpack.unpackb
_SIG_LEN = 32
_per_thread = threading.local()


@dataclass
class Message:
    header: dict[str, Any]
    payload: bytes | memoryview = b""
    buffers: list[Any] = field(default_factory=list)


@dataclass
class TransportStats:
    """Counters a test (or ``jupyter-mesh status``) can read: nothing is dropped silently."""

    sent: int = 0
    received: int = 0
    dropped_bad_signature: int = 0
    dropped_malformed: int = 0
    dropped_other_version: int = 0  # signed by our key, written by a jupyter_mesh of another version
    dropped_misaddressed: int = 0  # signed for another destination (or another incarnation of this one)
    dropped_replayed: int = 0  # a copy of a message already received, or older than this receiver
    dropped_deposed: int = 0  # from a controller that lost its kept job to another (``keep_alive``)

    @property
    def dropped(self) -> int:
        return (
            self.dropped_bad_signature
            + self.dropped_malformed
            + self.dropped_other_version
            + self.dropped_misaddressed
            + self.dropped_replayed
            + self.dropped_deposed
        )


class Transport:
    """A process's endpoint on the control plane.

    ``address`` is the inbox peers send to. ``send`` may be called from any thread; receiving happens
    on one thread that calls ``handler(message)`` for each authentic message (see :meth:`serve`).
    """

    def __init__(self, key: bytes, bind: str = "tcp://127.0.0.1", curve: CurveKeys | None = None, inbox_port: int = 0):
        """``curve``: the session's CURVE keys, for a TCP bind (required off loopback unless CURVE is
        opted out of: ``channels.curve_wanted``); outgoing TCP connections use them too. The runtime
        always passes them for TCP; a keyless loopback transport is for tools and tests.
        ``inbox_port``: the main inbox's TCP port (an agent waiting to be attached listens where it
        was told); 0 picks a free one."""
        if len(key) < 16:
            raise ValueError("the session key must be at least 16 bytes")
        check_bind(bind)  # a private directory, loopback, or a network interface the user opted into
        self._keyed: Any = _hmac_state(key)
        self.shm_prefix = _shm.session_prefix(key)  # data plane: same-host segments of this session
        self._ctx = zmq.Context()
        self.bind = bind  # where this process's sockets listen: what processes it starts bind too
        # replay-proof headers: who sent it (this incarnation: new per process, so per respawn), a
        # counter of ours, and where it was meant to go (see ``decode``)
        self.epoch = secrets.token_hex(8)
        self._counter = itertools.count(1)
        self._replays = ReplayGuard()  # which (sender, counter) each of our inboxes took already
        self.curve = curve if curve_wanted(bind) else None
        if curve_wanted(bind) and curve is None and not is_loopback(bind):  # loopback: tools and tests
            raise ValueError(f"a TCP bind off loopback ({bind}) needs the session's CURVE keys")
        self._auth: Any = None
        if self.curve is not None:  # ZAP: our TCP servers admit the session's client key, nobody else
            from zmq.auth.thread import ThreadAuthenticator

            self._auth = ThreadAuthenticator(self._ctx, log=log)
            self._auth.start()
            self._auth.configure_curve_callback("*", credentials_provider=OnlyClientKey(self.curve.client_public))
        self._more: weakref.WeakSet[zmq.Socket[Any]] = weakref.WeakSet()  # closed by close(), if still open
        self._wake_name = f"inproc://jupyter-mesh-wake-{id(self):x}"
        self._inbox, self.address = self.bind_inbox(self._wake_name, inbox_port)
        self._wake_token = secrets.token_bytes(16)
        self._wake_bell: zmq.Socket[Any] | None = None
        self._wake_lock = threading.Lock()
        self._watched: dict[zmq.Socket[Any], bytes] = {}  # more sockets serve() reads: socket -> doorbell
        self._poller: zmq.Poller | None = None
        self._server: threading.Thread | None = None  # the thread in serve(), if one is
        self._outs: dict[str, tuple[zmq.Socket[Any], threading.Lock]] = {}
        self._outs_lock = threading.Lock()
        self._lane_out = _lane.LaneSender()  # same-host inboxes with a lane: small messages skip ZeroMQ
        self._lanes: list[_lane.Lane] = []  # ours, closed by close()
        self._watched_lanes = WatchedLanes()  # watched inboxes with a lane: both ways read together
        self.stats = TransportStats()
        self._closed = False

    def bind_inbox(self, inproc: str | None = None, port: int = 0) -> tuple[zmq.Socket[Any], str]:
        """A receiving socket bound like the main inbox, with its address.

        The main inbox is one; an actor's own inbox (direct calls reach the actor's thread with no
        hand-over) and a caller's reply box are others. ``inproc``: also bind that in-process name,
        so threads of this process can ring it (see :meth:`doorbell`). The socket belongs to the one
        thread that reads it; messages on it are decoded with :meth:`decode` like any other.
        """
        sock, address, _ = self._bind_inbox(inproc, port, False)
        return sock, address

    def bind_inbox_with_lane(self, inproc: str | None = None) -> tuple[zmq.Socket[Any], str, _lane.Lane | None]:
        """:meth:`bind_inbox`, plus a same-host lane (``lane``) when the bind is ``ipc://``: its reader
        must read both, and must not depend on the order in which one sender's messages arrive."""
        return self._bind_inbox(inproc, 0, True)

    def _bind_inbox(
        self, inproc: str | None, port: int, with_lane: bool
    ) -> tuple[zmq.Socket[Any], str, _lane.Lane | None]:
        sock = self._ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        lane = None
        if self.bind.startswith("ipc://"):  # only this user can connect: the directory is 0700
            sock.setsockopt(zmq.MAXMSGSIZE, -1)
            address = f"{self.bind}/{secrets.token_hex(6)}"
            if with_lane and _lane.usable(address + _lane.MARK):
                address += _lane.MARK
                lane = _lane.Lane(address)
            sock.bind(address)
        else:  # a peer must pass CURVE first; and no frame above the bound is ever buffered
            sock.setsockopt(zmq.MAXMSGSIZE, max_frame())
            # a connection that does not finish its handshake is dropped after 5 s (not libzmq's 30):
            # anyone who reaches the port can open them, each holding a descriptor until then
            sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
            raise_fd_limit()
            if self.curve is not None:
                sock.curve_server = True
                sock.curve_publickey = self.curve.server_public
                sock.curve_secretkey = self.curve.server_secret
            if port:
                sock.bind(f"{self.bind}:{port}")
                address = f"{self.bind}:{port}"
            else:
                address = f"{self.bind}:{sock.bind_to_random_port(self.bind)}"
        self._replays.add_inbox(address)
        if inproc is not None:
            sock.bind(inproc)
        self._more.add(sock)
        if lane is not None:
            with self._wake_lock:
                self._lanes.append(lane)
        return sock, address, lane

    def doorbell(self, inproc: str) -> zmq.Socket[Any]:
        """A socket that rings an inbox bound with ``inproc``: send ``b""`` (under your own lock)."""
        s = self._ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(inproc)
        self._more.add(s)
        return s

    # -- signing --------------------------------------------------------------------------------------
    def _sign(self, header: bytes, payload: bytes | memoryview) -> bytes:
        """HMAC over the payload, then the header. Payload first: a sender hashes a large pickle
        before it takes its counter (``encode``), so no message waits long between being numbered and
        being sent, and the receiver's window (``_admit``) sees counters in about the order they left."""
        h = self._keyed.copy()  # the key's HMAC state, set up once (~1 us less per message)
        h.update(payload)
        h.update(header)
        return h.digest()  # type: ignore[no-any-return]

    def encode(self, msg: Message, to: str | list[str], local: bool = False) -> list[Any]:
        """Sign and frame for ``to`` (an address, or the agents a cast goes through). ``local``: the
        peer is on this host, so large buffers go through shared memory and only their segment names
        travel, in the signed header (see ``_shm``)."""
        if local and msg.buffers:
            entries, msg.buffers = _shm.stash(self.shm_prefix, msg.buffers)
            if entries:
                msg.header["sh"] = entries
        signing = self._keyed.copy()
        signing.update(msg.payload)  # the slow part (a large pickle) before the counter is taken
        msg.header["v"] = VERSION
        msg.header["se"], msg.header["sn"], msg.header["dst"] = self.epoch, next(self._counter), to
        msg.header["nb"] = [memoryview(b).nbytes for b in msg.buffers] if msg.buffers else []
        packer = getattr(_per_thread, "packer", None)
        if packer is None:  # a Packer per thread: msgpack.packb builds one per call
            packer = _per_thread.packer = msgpack.Packer(use_bin_type=True)
        header = packer.pack(msg.header)
        signing.update(header)  # as _sign: payload, then header
        if not msg.buffers:
            return [signing.digest(), header, msg.payload]
        return [signing.digest(), header, msg.payload, *msg.buffers]

    def decode(self, frames: Sequence[Any], inbox: str | None = None) -> Message | None:
        """Authenticate and parse; None (and a counter bump) for anything not from a key holder.

        ``inbox``: the address of the socket the frames were read from (see ``_admit``)."""
        try:
            n = len(frames)
            if n < 3:
                self.stats.dropped_malformed += 1
                return None
            sig, header, payload = frames[0], frames[1], frames[2]
            if type(sig) is not bytes or type(header) is not bytes or type(payload) is not bytes:
                sig, header, payload = _bytes(sig), _bytes(header), _bytes(payload)
            signing = self._keyed.copy()  # as ``_sign``, inline: this runs for every message
            signing.update(payload)
            signing.update(header)
            if len(sig) != _SIG_LEN or not _compare_digest(sig, signing.digest()):
                self.stats.dropped_bad_signature += 1
                return None
            h = _unpackb(header, raw=False)
            if n == 3:  # no buffer frames (most messages): the header must say so
                bufs: list[Any] = []
                if type(h) is not dict or h.get("nb") != bufs:
                    self.stats.dropped_malformed += 1
                    return None
            else:
                bufs = [f.buffer if isinstance(f, zmq.Frame) else f for f in frames[3:]]
                if not isinstance(h, dict) or h.get("nb") != [memoryview(b).nbytes for b in bufs]:
                    self.stats.dropped_malformed += 1
                    return None
            if h.get("v") != VERSION and h.get("k") != Kind.AGENT_UP:  # the hello's keys never change:
                self._other_version(h)  # its receiver refuses it by name (``protocol.check_version``)
                return None
            verdict = self._replays.check(h, inbox)  # ``_admit``, inline
            if verdict is not None:
                setattr(self.stats, verdict, getattr(self.stats, verdict) + 1)
                return None
            if "sh" in h:  # authentic: now it is safe to open the segments it names
                bufs = _shm.unstash(self.shm_prefix, h["sh"], bufs)
        except Exception:  # noqa: BLE001 - anything odd from the wire is dropped, never fatal
            self.stats.dropped_malformed += 1
            return None
        self.stats.received += 1
        return Message(h, payload, bufs)

    # -- replays ---------------------------------------------------------------------------------------
    def _admit(self, h: dict[str, Any], inbox: str | None = None) -> bool:
        """Taken once, by the incarnation it was meant for (``replay.ReplayGuard``); counted if not."""
        verdict = self._replays.check(h, inbox)
        if verdict is None:
            return True
        setattr(self.stats, verdict, getattr(self.stats, verdict) + 1)
        return False

    def accept_via(self, relayer: str, floors: dict[str, int] | None = None) -> None:
        """Take casts our agent ``relayer`` forwards as signed, none numbered at or below ``floors``."""
        self._replays.accept_via(relayer, floors)

    def floors(self, via: str) -> dict[str, int]:
        """Per sender, the highest counter taken on the path ``via``: what a new proc must not take."""
        return self._replays.floors(via)

    # -- sending --------------------------------------------------------------------------------------
    def _client_socket(self, address: str) -> zmq.Socket[Any]:
        """A PUSH socket for ``address``: a CURVE client of the session when it is a TCP peer."""
        s = self._ctx.socket(zmq.PUSH)
        if address.startswith("tcp://"):
            if self.curve is not None:
                s.curve_serverkey = self.curve.server_public
                s.curve_publickey = self.curve.client_public
                s.curve_secretkey = self.curve.client_secret
            s.setsockopt(zmq.MAXMSGSIZE, max_frame())
        return s

    def _out(self, address: str) -> tuple[zmq.Socket[Any], threading.Lock]:
        entry = self._outs.get(address)
        if entry is None:
            with self._outs_lock:
                entry = self._outs.get(address)
                if entry is None:
                    if self._closed:
                        raise zmq.ZMQError(zmq.ENOTSOCK, "transport closed")
                    s = self._client_socket(address)
                    s.setsockopt(zmq.SNDHWM, 0)
                    s.setsockopt(zmq.LINGER, 2000)
                    s.setsockopt(zmq.IMMEDIATE, 0)
                    s.connect(address)
                    entry = (s, threading.Lock())
                    self._outs[address] = entry
        return entry

    def send(self, address: str, msg: Message, local: bool = False) -> None:
        """Send ``msg``. Its buffers are copied as they go (``frame_send``): once this returns the
        caller may change them, and a peer that reads nothing holds nobody."""
        frames = self.encode(msg, address, local)
        try:
            self._send_frames(address, frames)
        except BaseException:  # never sent (too large, interrupted): nobody will claim its segments
            if msg.header.get("sh"):
                _shm.release(msg.header["sh"])
            raise

    def send_raw(self, address: str, frames: Sequence[Any]) -> None:
        """Forward frames already signed by someone else (agents relay casts without re-signing), or
        signed once for several peers (``frame_send.owned`` shares one copy of the buffers)."""
        self._send_frames(address, list(frames))

    def _send_frames(self, address: str, frames: list[Any]) -> None:
        if len(frames) == 3 and address.endswith(_lane.MARK) and self._lane_out.send(address, frames):
            self.stats.sent += 1  # same host, small: straight into the reader's socket (``lane``)
            return
        if address.startswith("tcp://"):
            check_frames_fit(frames)
        sock, lock = self._out(address)
        with lock:
            try:
                send_frames(sock, frames)
            except BaseException:
                # interrupted half-way (Ctrl-C between frames): the socket would glue the rest of
                # this message to the next one, so it goes and a fresh one is made on next use
                self._discard(address, sock)
                raise
        self.stats.sent += 1

    def _discard(self, address: str, sock: zmq.Socket[Any]) -> None:
        with self._outs_lock:
            if self._outs.get(address, (None,))[0] is sock:
                del self._outs[address]
        sock.close(linger=0)

    def forget(self, address: str, linger_ms: int = 0) -> None:
        """Close the outgoing socket to a peer that is gone, dropping what is still queued for it (or,
        with ``linger_ms``, letting it leave for that long: a last SHUTDOWN to a peer we stop)."""
        with self._outs_lock:
            entry = self._outs.pop(address, None)
        if entry is not None:
            with entry[1]:
                entry[0].close(linger=linger_ms)

    # -- receiving ------------------------------------------------------------------------------------
    def serve(
        self, handler: Callable[[Message, list[Any]], None], tick: Callable[[], float | None] | None = None
    ) -> None:
        """Receive until :meth:`stop`; runs on the calling thread (the process's receive thread).

        ``handler`` gets the message and its raw frames (for relaying). Exceptions in the handler are
        logged, never fatal: one bad message must not take the process down. ``tick`` (the controller's
        reply boxes) runs on this thread when :meth:`wake` is called and when the delay it returned
        has passed; it may :meth:`watch` more sockets, whose messages go to ``handler`` too.
        """
        self._server = threading.current_thread()
        mark_receive_thread()  # a get() here on a pending future raises: only this thread reads its reply
        try:
            if tick is None:
                self._serve_inbox(handler)
            else:
                self._serve_polling(handler, tick)
        finally:
            mark_receive_thread(False)

    def _serve_inbox(self, handler: Callable[[Message, list[Any]], None]) -> None:
        inbox = self._inbox
        while True:
            try:
                frames = self.recv_frames(inbox)
            except zmq.ZMQError:
                return
            if len(frames) == 1 and frames[0] == b"stop" and self._closed:
                return
            self._handle(frames, handler, self.address)

    def _serve_polling(self, handler: Callable[[Message, list[Any]], None], tick: Callable[[], float | None]) -> None:
        self._poller = poller = zmq.Poller()
        poller.register(self._inbox, zmq.POLLIN)
        delay = tick()
        due = None if delay is None else time.monotonic() + delay
        while True:
            timeout = None if due is None else int(max(0.0, due - time.monotonic()) * 1000) + 1
            try:
                ready = poller.poll(timeout)
            except zmq.ZMQError:
                return
            run_tick = not ready or (due is not None and time.monotonic() >= due)
            for sock, _ in ready:
                if sock in self._watched_lanes:  # a watched inbox with a lane
                    self._drain(sock, handler)
                    continue
                try:
                    frames = self.recv_frames(sock, zmq.NOBLOCK)
                except zmq.Again:
                    continue
                except zmq.ZMQError:
                    return
                if len(frames) == 1:
                    if sock is self._inbox and frames[0] == b"stop" and self._closed:
                        return
                    if frames[0] == self._wake_token:
                        run_tick = True
                    if frames[0] == self._watched.get(sock, self._wake_token):
                        continue
                self._handle(frames, handler, self.address if sock is self._inbox else None)
            if run_tick:
                try:
                    delay = tick()
                except Exception:  # the receive thread must survive a bug in its housekeeping
                    log.exception("error in the receive thread's tick")
                    delay = 0.05
                due = None if delay is None else time.monotonic() + delay
                for sock in self._watched_lanes.holding():  # just watched: its last reader held one
                    self._drain(sock, handler)

    def _drain(self, key: Any, handler: Callable[[Message, list[Any]], None]) -> None:
        """Everything waiting on a watched inbox with a lane, in its senders' order (``lane_merge``)."""
        self._watched_lanes.drain(key, self._watched, lambda frames: self._handle(frames, handler, None))

    def _handle(self, frames: list[Any], handler: Callable[[Message, list[Any]], None], inbox: str | None) -> None:
        msg = self.decode(frames, inbox)
        if msg is None:
            return
        try:
            handler(msg, frames)
        except Exception:
            log.exception("error handling %s message", msg.header.get("k"))

    def wake(self) -> None:
        """From any thread: make :meth:`serve` run its ``tick`` soon."""
        with self._wake_lock:
            if self._closed:
                return
            if self._wake_bell is None:
                self._wake_bell = self.doorbell(self._wake_name)
            self._wake_bell.send(self._wake_token)

    def watch(self, sock: zmq.Socket[Any], token: bytes, lane: _lane.Lane | None = None) -> None:
        """From ``tick`` only: read ``sock`` (and its ``lane``) too (one-frame ``token`` messages on it
        are doorbells)."""
        assert self._poller is not None
        self._watched[sock] = token
        self._poller.register(sock, zmq.POLLIN)
        if lane is not None:
            self._watched_lanes.add(sock, lane)
            self._poller.register(lane.fd, zmq.POLLIN)

    def unwatch(self, sock: zmq.Socket[Any], lane: _lane.Lane | None = None) -> None:
        """From ``tick`` only: stop reading ``sock`` (and its ``lane``)."""
        assert self._poller is not None
        self._watched.pop(sock, None)
        self._poller.unregister(sock)
        if self._watched_lanes.remove(sock, lane) and lane is not None:
            self._poller.unregister(lane.fd)

    @staticmethod
    def recv_frames(sock: zmq.Socket[Any], flags: int = 0) -> list[Any]:
        """Small frames (signature, header, payload) as bytes; buffer frames without copying."""
        return recv_zmq_frames(sock, flags)

    def stop_serving(self) -> None:
        """Make :meth:`serve` return (from any thread)."""
        self._closed = True
        try:
            s = self._client_socket(self.address)
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(self.address)
            s.send(b"stop")
            s.close()
        except zmq.ZMQError:
            pass

    def _other_version(self, h: dict[str, Any]) -> None:
        self.stats.dropped_other_version += 1
        if self.stats.dropped_other_version == 1:
            log.warning(
                "dropped a message from %s: it speaks jupyter_mesh wire protocol %r, this process speaks %s; "
                "install the same jupyter_mesh version on every host",
                str(h.get("s", "an unnamed peer"))[:80],
                h.get("v"),
                VERSION,
            )

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket. ``linger_ms``: how long messages still queued to peers may take to go
        out (0: dropped; a process about to exit that must be heard passes more).

        A thread still in :meth:`serve` is stopped and waited for first: a ZeroMQ socket closed while
        another thread reads it aborts the process (libzmq asserts) or hangs the context's term."""
        server = self._server
        if server is not None and server is not threading.current_thread() and server.is_alive():
            self.stop_serving()
            server.join(5.0)
        self._closed = True
        with self._outs_lock:
            outs, self._outs = list(self._outs.values()), {}
        for s, lock in outs:
            with lock:
                s.close(linger=linger_ms)
        self._lane_out.close()
        with self._wake_lock:
            for sock in list(self._more):  # boxes and bells whose owners did not close them
                if not sock.closed:
                    sock.close(linger=0)
            lanes, self._lanes = self._lanes, []
        for lane in lanes:
            lane.close()
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()


def _hmac_state(key: bytes) -> Any:
    """HMAC-SHA256 keyed with ``key`` and nothing hashed yet; ``copy()`` it per message."""
    try:
        import _hashlib  # OpenSSL's HMAC object: its copy() is the cheapest way to a keyed state

        return _hashlib.hmac_new(key, b"", "sha256")
    except (ImportError, AttributeError, ValueError):
        return hmac.new(key, digestmod=hashlib.sha256)


def _bytes(f: Any) -> bytes:
    return f.bytes if isinstance(f, zmq.Frame) else bytes(f)
