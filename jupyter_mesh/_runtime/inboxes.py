"""Where a call for one actor goes: the actor's own inbox, once its address is known.

Every actor has an inbox socket of its own on its proc (``proc.ActorHost``); calls sent there wake
the actor's thread directly, while the proc's inbox would hand them over. Callers (the client) and
host agents (their relays) learn the addresses from spawn replies and ``actor_up`` messages. They are
kept per proc *address*: a respawned rank is a new proc at a new address, so a stale inbox is never
used, and forgetting a dead proc forgets its actors' inboxes with it.
"""

from __future__ import annotations

from .._wire.transport import Transport

__all__ = ["ActorInboxes"]


class ActorInboxes:
    def __init__(self, transport: Transport):
        self._transport = transport
        self._by_proc: dict[str, dict[str, str]] = {}  # proc address -> actor id -> actor inbox

    def learn(self, proc: str, actor_id: str, inbox: str) -> None:
        self._by_proc.setdefault(proc, {})[actor_id] = inbox

    def address(self, proc: str, actor_id: str) -> str:
        """The actor's inbox if known, else its proc's (whose receive thread hands the call over)."""
        inboxes = self._by_proc.get(proc)
        return inboxes.get(actor_id, proc) if inboxes else proc

    def forget_proc(self, proc: str) -> None:
        """A proc is gone: close the sockets to it and to its actors' inboxes."""
        self._transport.forget(proc)
        for inbox in self._by_proc.pop(proc, {}).values():
            self._transport.forget(inbox)
