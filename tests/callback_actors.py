"""Actors for tests of get() inside done callbacks (importable by procs: they get our sys.path).

``chain`` runs the same scenario in the controller (called by the test) and in an actor (``Chainer``):
a done callback that the receive thread runs calls ``get()`` on a future still pending."""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

from jupyter_mesh import Actor, ValueMesh, endpoint

KINDS = ("call_one", "call", "choose", "spawn")  # the adverbs whose futures take callbacks


def _gate(path: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


class Gate(Actor):
    @endpoint
    def wait(self, path: str) -> str:
        """Answers once ``path`` exists (at once if it does; at most 120 s)."""
        _gate(path)
        return "open"


class GatedInit(Actor):
    def __init__(self, path: str):
        _gate(path)  # the spawn's ``initialized`` is pending until then

    @endpoint
    def ok(self) -> str:
        return "up"


def make(kind: str, procs: Any, gate: Any, path: str) -> Any:
    """A future of ``kind`` that is done once ``path`` exists."""
    if kind == "call_one":
        return gate.slice(gpus=1).wait.call_one(path)
    if kind == "call":
        return gate.wait.call(path)
    if kind == "choose":
        return gate.wait.choose(path)
    assert kind == "spawn"
    return procs.spawn(f"gated_{uuid.uuid4().hex[:8]}", GatedInit, path).initialized


def plain(v: Any) -> Any:
    return sorted(v.values()) if isinstance(v, ValueMesh) else v


def chain(kind: str, procs: Any, pend_gate: Any, trig_gate: Any, tmp: str) -> dict[str, Any]:
    """A callback on a pending future of ``kind`` calls get()/result()/exception() on another pending
    one of ``kind``, and get() on two done ones; reports what each did, then lets the pending one
    finish and reports its value."""
    tag = uuid.uuid4().hex[:8]
    opened, pend_path, trig_path = (os.path.join(tmp, f"{tag}-{n}") for n in ("open", "pend", "trig"))
    _touch(opened)
    done = make(kind, procs, pend_gate, opened)
    done_value = plain(done.get(timeout=60))
    pending = make(kind, procs, pend_gate, pend_path)
    trigger = make(kind, procs, trig_gate, trig_path)
    report: dict[str, Any] = {"done_before": done_value}
    ran = threading.Event()

    def on_done(f: Any) -> None:
        try:
            report["thread"] = threading.current_thread().name
            for how in ("get", "result", "exception"):
                try:
                    out = getattr(pending, how)(timeout=20)  # a hang would end as MeshTimeoutError
                    report[how] = f"returned {out!r}"
                except Exception as e:  # noqa: BLE001 - the report says what it was
                    report[how] = type(e).__name__
                    report[how + "_message"] = str(e)
            report["still_pending"] = not pending._done()
            report["poll"] = _poll(pending)
            report["done_in_callback"] = plain(done.get(timeout=20))
            report["self_in_callback"] = plain(f.get(timeout=20))
        finally:
            ran.set()

    trigger.add_done_callback(on_done)  # pending until trig_path exists: it runs where the reply is read
    _touch(trig_path)
    report["ran"] = ran.wait(60)
    report["trigger"] = plain(trigger.get(timeout=60))
    _touch(pend_path)  # only now may the call the callback waited on finish
    report["pending_after"] = plain(pending.get(timeout=60))
    return report


def _poll(fut: Any) -> str:
    """get(timeout=0) just looks, on any thread."""
    try:
        fut.get(timeout=0)
        return "done"
    except Exception as e:  # noqa: BLE001
        return type(e).__name__


class Chainer(Actor):
    """Runs ``chain`` in its proc: there the receive thread is the proc's ("recv")."""

    @endpoint
    def chain(self, kind: str, procs: Any, pend_gate: Any, trig_gate: Any, tmp: str) -> dict[str, Any]:
        return chain(kind, procs, pend_gate, trig_gate, tmp)

    @endpoint
    def on_actor_thread(self, gate: Any, tmp: str) -> dict[str, Any]:
        """A callback that runs on this actor's thread (added to a future already done) may wait on a
        pending future: another thread reads its reply."""
        tag = uuid.uuid4().hex[:8]
        opened, pend_path = os.path.join(tmp, f"{tag}-open"), os.path.join(tmp, f"{tag}-pend")
        _touch(opened)
        done = gate.slice(gpus=0).wait.call_one(opened)
        done.get(timeout=60)
        pending = gate.slice(gpus=1).wait.call_one(pend_path)
        report: dict[str, Any] = {"actor_thread": threading.current_thread().name}

        def release() -> None:  # once the callback waits in get(): the call may finish only then
            deadline = time.monotonic() + 60
            while not pending._waiters and time.monotonic() < deadline:
                time.sleep(0.005)
            _touch(pend_path)

        helper = threading.Thread(target=release, daemon=True)
        helper.start()

        def on_done(f: Any) -> None:
            report["thread"] = threading.current_thread().name
            report["value"] = pending.get(timeout=60)

        done.add_done_callback(on_done)  # done: runs at once, here
        helper.join(60)
        return report
