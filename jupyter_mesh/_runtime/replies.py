"""Reply boxes: a caller that waits for its call receives the reply itself.

On 2 cores, handing a reply from the controller's receive thread to the thread waiting in
``Future.get`` cost ~60 us, and the receive thread waking for every reply slowed the rest of the call
too (W2 p50 went from ~380 to ~260 us without it; ``benchmarks/NOTES.md``). So each calling thread
gets a socket of its own, a *reply box*: its ``call_one``/``choose``/``call`` ask for their replies
there, and ``get()`` on that thread reads the box itself.

Every box that replies may reach must be read by someone, or a future would never finish:

* its owner thread while it waits in ``get()`` on one of the box's futures (it dispatches every reply
  that arrives, for any of its calls, exactly like the receive thread would);
* otherwise the receive thread, which *adopts* the box: at once when one of its futures is awaited,
  given a callback, polled with ``done()`` or waited on by another thread; and by a sweep (every
  ``SWEEP_S``) when replies have been due for a while and nobody waits. An adopted box stays with the
  receive thread until its calls are all answered, then goes back to a pool; meanwhile its owner
  takes another box. The receive thread sweeps only while some box has calls in flight; a call sent
  while it sleeps wakes it (once: the sweeps go on until all is answered).

ZeroMQ sockets are used by one thread at a time: who may read a box is decided under the box's lock.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core.future import on_receive_thread, time_left
from .._wire.lane_merge import Inbox
from .._wire.transport import Message, Transport
from . import interrupts

if TYPE_CHECKING:
    from .._core.future import Future

__all__ = ["ReplyBox", "ReplyBoxes"]

log = logging.getLogger("jupyter_mesh.replies")

_RECEIVE_THREAD = -1  # the owner of a box taken out of the pool by the receive thread
SWEEP_S = 0.02  # how long replies may wait in a box nobody reads before the receive thread takes it


def _spin_s() -> float:
    """``JUPYTER_MESH_SPIN_US`` in seconds: 100 us unless set; 0 turns it off; at most 10 ms (a caller
    that spun for as long as its call took would burn a core for nothing)."""
    try:
        us = float(os.environ.get("JUPYTER_MESH_SPIN_US", "100"))
    except ValueError:
        us = 100.0
    return min(max(us, 0.0), 10_000.0) / 1e6 if math.isfinite(us) else 100e-6


# A caller looks for its reply without sleeping for this long before it sleeps in ``poll``: on a VM
# whose cores idle, waking a sleeping thread costs tens of microseconds (the vCPU leaves its idle
# state), as much as a third of a same-host round trip. ``benchmarks/bench_spin.py``: call_one p50
# ~170 -> ~125 us on the quiet 2-core VM, +~30 us of caller CPU per call; on a busy one no change.
# ``JUPYTER_MESH_SPIN_US=0`` turns it off.
SPIN_S = _spin_s()
MAX_BOXES = 16  # more calling threads than this share the receive thread's inbox
# (but the receive thread itself always gets one: a call made in a done callback is answered in it, and
# its get() there is refused otherwise: ``Future._refuse_unanswerable``)


class ReplyBox:
    """One reply socket; owned by one thread at a time (or by the receive thread once adopted)."""

    def __init__(self, boxes: ReplyBoxes, n: int):
        self._boxes = boxes
        inproc = f"inproc://jupyter-mesh-reply-{n}-{id(self):x}"
        # replies from procs of this host come over the box's lane when small (``_wire.lane``)
        self.sock, self.address, self.lane = boxes.transport.bind_inbox_with_lane(inproc)
        self._reader = Inbox(self.sock, self.lane)
        self.token = secrets.token_bytes(16)  # the doorbell's frame: wakes a waiting owner
        self._bell = boxes.transport.doorbell(inproc)
        self._bell_lock = threading.Lock()
        self.lock = threading.Lock()
        self.owner = 0  # thread ident; 0 while in the pool
        self.holder: weakref.ref[_Held] | None = None  # dead once the owner thread let go (or ended)
        self.readers: set[object] = set()  # reads running on the owner's thread (nested ones too)
        self.adopted = False  # the receive thread reads it
        self.adopt_asked = False  # asked while the owner was reading: handed over when it stops
        self.last_send = 0.0

    # -- Future hooks (see _future.Future) ----------------------------------------------------------
    def drive(self, fut: Future[Any], timeout: float | None) -> float | None:
        """Read this box until ``fut`` is done or ``timeout`` passes; returns the time left.

        Only the owner reads; anyone else (or the owner after a hand-over) makes sure the receive
        thread does, and waits the ordinary way."""
        ident = threading.get_ident()
        me = object()  # this read's entry in ``readers``: discarding it is idempotent, unlike a count
        deadline = None if timeout is None else time.monotonic() + timeout
        try:  # entered before the entry exists: a Ctrl-C anywhere from here on is cleaned up below
            with self.lock:
                # a nested read (a callback of a reply this thread dispatches, waiting on another
                # future) goes ahead even if a hand-over was asked: it happens when the outer one ends
                mine = self.owner == ident and not self.adopted and (bool(self.readers) or not self.adopt_asked)
                if mine:
                    self.readers.add(me)
            if not mine:
                self._boxes.adopt(self)
                return timeout
            nested = interrupts.held()  # inside a dispatch on this thread: stay interruptible while waiting
            while not fut._done() and not fut._poked:  # poked: a debugger prompt needs this thread
                wait_ms = -1 if deadline is None else int(time_left(deadline) * 1000)
                # Ctrl-C here loses nothing: nothing was read.
                # With no time left it still looks once: get(timeout=0) finds a reply already here
                if nested:
                    interrupts.release()
                try:
                    ready = self._reader.wait(wait_ms, SPIN_S)  # (one held back by ``lane_merge.take``: at once)
                finally:
                    if nested:
                        interrupts.hold()
                if ready:
                    self._read_one()
                elif deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            # End this read, even if a Ctrl-C lands in here: a reader left behind would keep the
            # receive thread away from this box for good. Inline, not a call: a signal is handled
            # on entry to a function, before any try in it could catch the interrupt.
            interrupted = False
            while True:
                try:
                    with self.lock:
                        self.readers.discard(me)  # idempotent, so retrying is safe
                        hand_over = not self.readers and self.adopt_asked
                        if hand_over:
                            self.adopt_asked = False
                    if hand_over:  # (lost to a Ctrl-C just before it, the sweep still adopts the box)
                        self._boxes.adopt(self)
                    break
                except KeyboardInterrupt:
                    interrupted = True
            if interrupted:
                raise KeyboardInterrupt
        return None if deadline is None else time_left(deadline)

    @property
    def depth(self) -> int:
        """How many reads of this box are running on its owner's thread (nested ones count)."""
        return len(self.readers)

    def detach(self) -> None:
        """The future will be waited for some other way (await, callback, another thread)."""
        self._boxes.adopt(self)

    def wake(self) -> None:
        """A future of this box finished without its reply being read here (a failure, a cancel)."""
        if self.readers and threading.get_ident() != self.owner:
            with self._bell_lock:
                self._bell.send(self.token)

    # -- owner side ---------------------------------------------------------------------------------
    def _read_one(self) -> None:
        transport = self._boxes.transport
        held = interrupts.hold()  # a reply taken off the socket is always dispatched
        try:
            frames = self._reader.recv_nowait()
            if frames is None:
                return
            if len(frames) == 1:  # our doorbell
                return
            msg = transport.decode(frames)
            if msg is not None:
                try:
                    self._boxes.dispatch(msg)
                except Exception:  # as on the receive thread: a bad reply must not break the caller
                    log.exception("error dispatching a %s reply", msg.header.get("k"))
        finally:
            if held:
                interrupts.release()

    def close(self) -> None:
        with self._bell_lock:
            self._bell.close(linger=0)
        self.sock.close(linger=0)
        if self.lane is not None:
            self.lane.close()


class _Held:
    """A thread's hold on its box, kept in the thread's locals: when the thread ends, this goes, and
    a weakref callback wakes the receive thread to put the box back in the pool (or adopt it)."""

    __slots__ = ("__weakref__", "box")

    def __init__(self) -> None:
        self.box: ReplyBox | None = None


class ReplyBoxes:
    """The boxes of one client: one per calling thread, a pool, and the receive thread's part."""

    def __init__(self, transport: Transport, dispatch: Callable[[Message], None], busy: Callable[[], set[ReplyBox]]):
        self.transport, self.dispatch, self._busy = transport, dispatch, busy
        self._lock = threading.Lock()
        self._all: list[ReplyBox] = []
        self._free: list[ReplyBox] = []
        self._mine = threading.local()
        self._handover: queue.SimpleQueue[ReplyBox] = queue.SimpleQueue()
        self._watched: set[ReplyBox] = set()
        self._closed = False
        self._sweeping = False  # the receive thread will tick within SWEEP_S

    def for_call(self) -> ReplyBox | None:
        """The box the calling thread's next call should be answered in (None: use the inbox)."""
        held: _Held | None = getattr(self._mine, "held", None)
        box = held.box if held is not None else None
        ident = threading.get_ident()
        if box is None or box.owner != ident or box.adopted or box.adopt_asked:
            held = _Held()
            box = self._take(ident, held)
            self._mine.held = held if box is not None else None
        if box is not None:
            box.last_send = time.monotonic()
        return box

    def _let_go(self, _ref: Any) -> None:
        try:
            self.transport.wake()
        except Exception:  # noqa: BLE001 - at interpreter exit there may be nothing left to wake
            pass

    def sent(self) -> None:
        """After a call answered in a box was registered: make sure the receive thread sweeps."""
        if not self._sweeping:
            self._sweeping = True
            self.transport.wake()

    def _take(self, ident: int, held: _Held) -> ReplyBox | None:
        with self._lock:
            if self._closed:
                return None
            # other threads use at most MAX_BOXES at a time, so one more is always left for the
            # receive thread: busy calling threads (a pool of 16 workers) took every box, and a call
            # made in a callback was answered in the inbox only that thread reads (refused, a hang before)
            receive = on_receive_thread()
            if not receive and len(self._all) - len(self._free) >= MAX_BOXES:
                return None
            if self._free:
                box = self._free.pop()
            elif len(self._all) < MAX_BOXES + 1:
                box = ReplyBox(self, len(self._all))
                self._all.append(box)
            else:
                return None
            with box.lock:
                box.owner, box.holder = ident, weakref.ref(held, self._let_go)
                box.adopted = box.adopt_asked = False
            held.box = box
        return box

    def adopt(self, box: ReplyBox) -> None:
        """Make the receive thread read ``box`` (now, or when its owner stops reading it)."""
        with box.lock:
            if box.adopted or box.owner == 0:
                return
            if box.depth:
                box.adopt_asked = True  # the owner dispatches everything until then
                return
            box.adopted = True
        self._handover.put(box)
        self.transport.wake()

    # -- receive thread -----------------------------------------------------------------------------
    def tick(self) -> float | None:
        """Called by ``Transport.serve`` on the receive thread; returns how soon to call again."""
        self._sweeping = False  # before looking at the calls in flight: see sent()
        while True:
            try:
                box = self._handover.get_nowait()
            except queue.Empty:
                break
            if box not in self._watched and not self._closed:
                self._watched.add(box)
                self.transport.watch(box.sock, box.token, box.lane)
        now = time.monotonic()
        busy = self._busy()
        for box in list(self._all):
            if box.owner == 0:
                if box in busy:  # a call was routed to it just as it went back to the pool: read it
                    with self._lock, box.lock:
                        if box.owner == 0 and box in self._free:
                            self._free.remove(box)
                            box.owner, box.adopted = _RECEIVE_THREAD, True
                            self._watched.add(box)
                            self.transport.watch(box.sock, box.token, box.lane)
                continue
            if box.adopted:
                if box in self._watched and box not in busy:  # all answered: back to the pool
                    self._watched.discard(box)
                    self.transport.unwatch(box.sock, box.lane)
                    with self._lock, box.lock:
                        box.owner, box.adopted, box.holder = 0, False, None
                        self._free.append(box)
                continue
            gone = box.holder is None or box.holder() is None  # its thread ended, or took another box
            if box.depth or (not gone and now - box.last_send < SWEEP_S):
                continue
            if box in busy:  # replies due and nobody reading: take it
                self.adopt(box)
            elif gone:  # its thread ended (or took another box): back to the pool
                with self._lock, box.lock:
                    if box.depth == 0 and not box.adopted:
                        box.owner, box.holder = 0, None
                        self._free.append(box)
        if busy or self._watched or any(b.depth for b in self._all):
            self._sweeping = True
            return SWEEP_S
        return None  # nothing in flight: sleep until a call is sent

    def close(self) -> None:
        with self._lock:
            self._closed = True
            boxes, self._all, self._free = list(self._all), [], []
        for box in boxes:
            box.close()
