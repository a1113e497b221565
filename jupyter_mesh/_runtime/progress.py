"""Per-rank progress of gathered casts, from a host agent to the callers.

An agent gathers its procs' replies to a cast into one message, so without this the caller learns
nothing until the host's last rank answered: ranks that finished would still look busy. The relay
tells a :class:`ProgressSender` each rank whose reply it now holds; the sender batches them and sends
each caller at most one ``progress`` message per ``interval`` (one small header, no payload), on a
thread of its own that sleeps while there is nothing to send. A gather that completes drops its
pending ranks: the gathered reply says more. A rank's news waits one ``interval``, so a cast whose
gather completes within it (most) sends no progress at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .._wire.protocol import progress

__all__ = ["INTERVAL", "ProgressSender"]

INTERVAL = 0.05
"""At most this often one message per caller: 20 a second, whatever the number of ranks."""


class ProgressSender:
    def __init__(self, send: Callable[[str, dict[str, Any]], object], interval: float = INTERVAL):
        self._send = send
        self.interval = interval
        self._cond = threading.Condition()
        self._pending: dict[str, dict[int, list[int]]] = {}  # caller's inbox -> call id -> ranks
        self._thread: threading.Thread | None = None
        self._closed = False
        self.sent = 0  # messages sent (tests check the batching)

    def done(self, caller: str, call_id: int, rank: int) -> None:
        """``rank``'s reply to call ``call_id`` of ``caller`` is held for its gather (cheap: the relay
        calls it on the agent's receive thread)."""
        with self._cond:
            if self._closed:
                return
            self._pending.setdefault(caller, {}).setdefault(call_id, []).append(rank)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jupyter-mesh-progress", daemon=True)
                self._thread.start()
            self._cond.notify()

    def forget(self, caller: str, call_id: int) -> None:
        """The call's gathered reply went out: its progress is news to nobody."""
        with self._cond:
            calls = self._pending.get(caller)
            if calls is not None and calls.pop(call_id, None) is not None and not calls:
                del self._pending[caller]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()  # nothing to say: sleep, no polling
                if self._closed:
                    return
            # news waits one interval: ranks finishing meanwhile join this message (the rate bound),
            # and a gather that completes meanwhile needs none (``forget``): a fast cast costs its
            # agent, and its caller, no progress message at all
            time.sleep(self.interval)
            with self._cond:
                batch, self._pending = self._pending, {}
            for caller, calls in batch.items():
                if not calls:
                    continue
                try:
                    self._send(caller, progress(calls))
                    self.sent += 1
                except Exception:  # noqa: BLE001 - a caller gone: its calls are over anyway
                    pass
