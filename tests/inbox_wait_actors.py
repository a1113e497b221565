"""Actors for the inbox-wait hammer (``test_inbox_wait.py``; importable by procs: they get our sys.path)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from jupyter_mesh import Actor, endpoint


def payload(rng: random.Random, max_bytes: int) -> Any:
    """Something around the lane's bound (either way, by a few hundred bytes), small, or out of band."""
    r = rng.random()
    if r < 0.6:
        return bytes([rng.randrange(256)]) * (max_bytes + rng.randrange(-900, 400))
    if r < 0.75:
        return b"s" * rng.randrange(1, 64)
    if r < 0.9:
        import numpy as np

        return np.full(rng.choice([8, 4096, (max_bytes + rng.randrange(-900, 400)) // 8, 40_000]), rng.random())
    try:
        import torch
    except ImportError:  # numpy's out-of-band buffers then
        torch = None
    if torch is None:
        import numpy as np

        return np.zeros(max_bytes // 4, dtype=np.float32)
    return torch.full((rng.choice([4, 1024, max_bytes // 4 + rng.randrange(-200, 100)]),), rng.random())


def same(a: Any, b: Any) -> bool:
    if isinstance(a, bytes | str | int | float | type(None)):
        return bool(a == b)
    if type(a).__module__.startswith("torch"):
        return bool(a.shape == b.shape and (a == b).all().item())
    return bool(a.shape == b.shape and (a == b).all())


class Echo(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def echo(self, x: Any) -> Any:
        self.n += 1
        return x

    @endpoint
    def slow(self, s: float, x: Any) -> Any:
        time.sleep(s)
        return x

    @endpoint
    def count(self) -> int:
        return self.n

    @endpoint
    def hammer(self, other: Any, seed: int, seconds: float, threads: int, max_bytes: int) -> dict[str, int]:
        """Actor -> actor: ``threads`` threads of this proc (this one too) call ``other`` for ``seconds``."""
        out: dict[str, int] = {}
        errs: list[str] = []

        def run(k: int) -> None:
            try:
                for key, v in drive(other, random.Random(seed * 100 + k), seconds, max_bytes).items():
                    out[key] = out.get(key, 0) + v
            except BaseException as e:  # noqa: BLE001 - reported to the controller
                errs.append(f"{type(e).__name__}: {e}")

        ts = [threading.Thread(target=run, args=(k,)) for k in range(1, threads)]
        for t in ts:
            t.start()
        run(0)
        for t in ts:
            t.join(seconds + 120)
        if errs:
            raise RuntimeError("; ".join(errs[:3]))
        return out


def drive(mesh: Any, rng: random.Random, seconds: float, max_bytes: int, other_thread: Any = None) -> dict[str, int]:
    """Calls of every kind to ``mesh`` (an Echo mesh) for ``seconds``; every value checked, every get bounded
    (a lost message is a ``MeshTimeoutError``). Returns how many of each were done."""
    from jupyter_mesh import MeshCancelledError, MeshTimeoutError

    done: dict[str, int] = {}
    one = mesh.slice(**{k: 0 for k in mesh.sizes}) if mesh.size() > 1 else mesh
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        p = payload(rng, max_bytes)
        how = rng.randrange(11 if other_thread is not None else 10)
        if how == 0:
            assert same(one.echo.call_one(p).get(30), p)
        elif how == 1:
            vals = mesh.echo.call(p).get(30)
            assert all(same(v, p) for v in vals.values())
        elif how == 2:
            assert same(mesh.echo.choose(p).get(30), p)
        elif how == 3:
            for f in mesh.echo.stream(p):
                assert same(f.get(30), p)
        elif how == 4:
            mesh.echo.broadcast(p)
            assert same(one.echo.call_one(p).get(30), p)
        elif how == 5:  # a timeout that expires, then the same future again
            f = one.slow.call_one(rng.choice([0.0, 0.002, 0.02]), p)
            try:
                v = f.get(rng.choice([0, 0.0005, 0.005]))
            except MeshTimeoutError:
                done["expired"] = done.get("expired", 0) + 1
                v = f.get(30)
            assert same(v, p)
        elif how == 6:  # several in flight, read in another order, some with get(timeout=0) first
            fs = [(one.echo.call_one(q), q) for q in (p, payload(rng, max_bytes), b"x")]
            rng.shuffle(fs)
            for f, q in fs:
                if rng.random() < 0.5:
                    try:
                        f.get(0)
                    except MeshTimeoutError:
                        pass
                assert same(f.get(30), q)
        elif how == 7:  # a cancel, then the actor still answers
            f = one.slow.call_one(0.01, p)
            if rng.random() < 0.5:
                time.sleep(rng.choice([0, 0.001, 0.02]))
            f.cancel()
            try:
                f.get(30)
            except MeshCancelledError:
                done["cancelled"] = done.get("cancelled", 0) + 1
            assert same(one.echo.call_one(b"after").get(30), b"after")
        elif how == 8:  # waited for by another thread (the receive thread adopts the box) or polled
            f = one.echo.call_one(p)
            if other_thread is not None and rng.random() < 0.5:
                got = other_thread(lambda f=f: f.get(30))
            else:
                while not f.done():
                    time.sleep(0.0005)
                got = f.get(30)
            assert same(got, p)
        elif how == 9:  # two calls: the second's reply arrives while this thread waits for the first
            f1 = one.slow.call_one(0.003, p)
            f2 = one.echo.call_one(b"quick")
            assert same(f1.get(30), p)
            assert f2.get(30) == b"quick"
        else:  # a callback added from another thread while this one reads its box (a hand-over is
            # asked and waits) that gets another call of the same box: it runs inside this thread's read
            _callback_in_a_read(one, p, other_thread)
        done[str(how)] = done.get(str(how), 0) + 1
    return done


def _callback_in_a_read(one: Any, p: Any, other_thread: Any) -> None:
    """A done-callback added from another thread while this thread reads the box, waiting on another
    call of the box. (If the read ended first, the callback runs on the receive thread, where a get
    would wait on itself: it then only notes the value.)"""
    f1 = one.slow.call_one(0.05, p)
    f2, f3 = one.echo.call_one(b"2"), one.echo.call_one(p)
    got: list[Any] = []

    def then(_f: Any) -> None:
        if threading.current_thread().name == "jupyter-mesh-recv":
            got.append(p)  # the read had ended: a get here would block the receive thread itself
            return
        try:
            got.append(f3.get(30))
        except BaseException as e:  # noqa: BLE001 - checked below
            got.append(e)

    def add() -> None:
        box = f1._driver
        while not f1._done():
            if box is not None and box.depth:
                f2.add_done_callback(then)
                return
            time.sleep(0.0005)
        got.append(p)  # the read was over before it could be caught

    th = threading.Thread(target=add)
    th.start()
    assert same(f1.get(30), p)
    th.join(30)
    until = time.monotonic() + 30
    while not got and time.monotonic() < until:
        time.sleep(0.001)
    assert got, "the callback never ran"
    assert not isinstance(got[0], BaseException), f"the callback's get: {got[0]!r}"
    assert same(got[0], p)
    assert f2.get(30) == b"2" and same(f3.get(30), p)
