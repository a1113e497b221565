"""Which signed messages a process takes: each once, and only at the incarnation it was meant for.

Every header carries its sender's epoch (random, new with every process), a counter of the sender's,
and its destination (an address, or the agents a cast goes through). A receiver keeps, per sender and
path, the highest counter it took and a bitmap of the WINDOW below it; anything seen or older is a
replay. A message for an address that is none of our inboxes (another process, or an earlier
incarnation of a respawned one, whose inboxes had other addresses) is misaddressed.

A relayer (our agent) forwards casts to several of our inboxes (the proc's, each actor's), each read by
its own thread at its own pace: an actor busy for minutes reads its queued casts after other inboxes
took thousands of later ones. So a relayed path has a window per inbox it reached, each in the order
the relayer forwarded. A copy replayed into another inbox of ours passes that inbox's window and goes
no further: an actor's inbox takes only its own calls, and an actor runs a sender's calls once each,
in their sequence numbers (``proc.ActorHost._in_order``). What the agent relayed before a proc was born
is below the floors the proc started with (``accept_via``).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["WINDOW", "ReplayGuard", "Window"]

WINDOW = 4096  # counters of one sender on one path that may arrive out of order (threads race to send)
_FULL = (1 << WINDOW) - 1


class Window:
    """Which of one sender's counters (on one path) were received: the highest, and a bitmap of the
    WINDOW below it. Anything older than the window, or seen, is a replay."""

    __slots__ = ("seen", "top")

    def __init__(self, top: int = 0, seen: int = 0):
        self.top, self.seen = top, seen

    @classmethod
    def floor(cls, top: int) -> Window:
        """Everything up to ``top`` counts as taken (it went out before this receiver existed)."""
        return cls(top, _FULL)

    def admit(self, n: int) -> bool:
        if n > self.top:
            self.seen = ((self.seen << (n - self.top)) | 1) & _FULL
            self.top = n
            return True
        age = self.top - n
        if age >= WINDOW or self.seen >> age & 1:
            return False
        self.seen |= 1 << age
        return True


class ReplayGuard:
    """One process's record of what it took, keyed by (epoch, our inbox) for direct messages and by
    (epoch, relayer, the inbox it reached) for relayed ones."""

    def __init__(self) -> None:
        self._mine: set[str] = set()  # our inboxes' addresses, and relayers we accept casts through
        self._relayers: dict[str, dict[str, int]] = {}  # relayer -> the floors we started with
        self._windows: dict[tuple[str, ...], Window] = {}
        self._lock = threading.Lock()

    def add_inbox(self, address: str) -> None:
        self._mine.add(address)

    def check(self, h: dict[str, Any], inbox: str | None) -> str | None:
        """None to take the message; else the stats counter it falls under."""
        to, epoch, n = h.get("dst"), h.get("se"), h.get("sn")
        if isinstance(to, str):
            via = to if to in self._mine else None
        elif isinstance(to, list):
            via = next((a for a in to if isinstance(a, str) and a in self._mine), None)
        else:
            via = None
        if via is None:
            return "dropped_misaddressed"
        if not isinstance(epoch, str) or type(n) is not int:
            return "dropped_malformed"
        floors = self._relayers.get(via)
        key: tuple[str, ...] = (epoch, via) if floors is None else (epoch, via, inbox or "")
        with self._lock:
            w = self._windows.get(key)
            if w is None:
                floor = floors.get(epoch) if floors else None
                w = self._windows[key] = Window() if floor is None else Window.floor(floor)
            if w.admit(n):
                return None
        return "dropped_replayed"

    def accept_via(self, relayer: str, floors: dict[str, int] | None = None) -> None:
        """Take messages meant for ``relayer`` (our agent, which forwards casts as they were signed),
        but none a sender numbered ``floors[sender]`` or lower: those went out before we existed."""
        with self._lock:
            self._relayers[relayer] = {epoch: int(top) for epoch, top in (floors or {}).items()}
        self._mine.add(relayer)

    def floors(self, via: str) -> dict[str, int]:
        """Per sender, the highest counter taken on the path ``via``."""
        out: dict[str, int] = {}
        with self._lock:
            for key, w in self._windows.items():
                if key[1] == via:
                    out[key[0]] = max(out.get(key[0], 0), w.top)
        return out
