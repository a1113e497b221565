"""Limits that must hold under load: bounded memory for worker output, O(1) bookkeeping per call."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from _procs import wait_for
from actors import Sleeper

from jupyter_mesh import Actor, MeshCancelledError, current_rank, endpoint

pytestmark = pytest.mark.integration


def test_choose_stays_cheap_with_thousands_in_flight(procs):
    """Issuing a choose() must not scan every call in flight (it did, and was quadratic: 0.3 s for 1k
    calls, 4.9 s for 6k): while 6,000 calls are issued, the calling thread never walks the table of
    calls in flight (the per-rank counts answer instead). Walks by the runtime's threads do not count."""
    from jupyter_mesh._runtime.client import current_client
    from jupyter_mesh._runtime.pending import PendingTable

    me = threading.get_ident()
    walks: list[str] = []

    class Watched(PendingTable):
        """The same table, noting each walk made from the test's thread."""

        def _walk(self, how: str) -> None:
            if threading.get_ident() == me:
                walks.append(how)

        def __iter__(self):
            self._walk("iter")
            return super().__iter__()

        def values(self):
            self._walk("values")
            return super().values()

        def items(self):
            self._walk("items")
            return super().items()

        def keys(self):
            self._walk("keys")
            return super().keys()

        def copy(self):
            self._walk("copy")
            return super().copy()

    s = procs.spawn("s", Sleeper)
    s.initialized.get(timeout=30)
    client = current_client()
    table = client.calls.pending
    assert type(table) is PendingTable
    futs = []
    t0 = time.perf_counter()
    try:
        table.__class__ = Watched
        try:
            for _ in range(6000):
                futs.append(s.nap.choose(30))  # the first call per rank runs, the others queue behind it
        finally:
            table.__class__ = PendingTable
        assert not walks, f"issuing 6,000 choose() calls walked the calls in flight {len(walks)} times: {walks[:5]}"
        print(f"6,000 choose() calls issued in {time.perf_counter() - t0:.2f} s")
        # least loaded first: the calls spread evenly over the 4 ranks
        load = {r: n for (a, r), n in client.calls.pending.load.items() if a == s._actor_id}
        assert sum(load.values()) == sum(not f.done() for f in futs)
        assert max(load.values()) - min(load.values()) <= 2, load
    finally:
        for f in futs:
            f.cancel()
    for f in futs:
        with pytest.raises(MeshCancelledError):
            f.get(timeout=30)
    assert not any(a == s._actor_id for a, _ in client.calls.pending.load), "in-flight counts drifted"
    # with nothing in flight, four calls go to four different ranks
    four = [s.nap.choose(30) for _ in range(4)]
    assert sorted(n for (a, _), n in client.calls.pending.load.items() if a == s._actor_id) == [1, 1, 1, 1]
    for f in four:
        f.cancel()


class Flooder(Actor):
    @endpoint
    def flood(self, lines: int, width: int) -> None:
        rank = current_rank().rank
        pad = "x" * width
        for i in range(lines):
            sys.stdout.write(f"flood {rank} {i} {pad}\n")
        sys.stdout.write(f"flood {rank} done\n")
        sys.stdout.flush()

    @endpoint
    def one_long_line(self, width: int) -> None:
        print("long " + "y" * width, flush=True)


def test_worker_logs_are_bounded_in_bytes(procs):
    """20,000 lines of 64 KiB once took the controller from 80 MiB to 1.6 GiB, held after stop():
    now each rank keeps its latest JUPYTER_MESH_LOG_BYTES, long lines are cut, a stopped mesh keeps
    a short tail."""
    from jupyter_mesh._runtime import logs
    from jupyter_mesh._runtime.controller import Controller

    ctl = Controller.get()
    seen: dict[str, int] = {"lines": 0, "longest": 0, "done": 0, "cut": 0}

    def sink(mesh: str, rank: int, label: str, fd: int, lines: list[str]) -> None:
        seen["lines"] += len(lines)
        seen["longest"] = max([seen["longest"], *map(len, lines)])
        seen["done"] += sum(line.endswith(" done") for line in lines)
        seen["cut"] += sum("… [cut " in line for line in lines)

    prev, ctl.output = ctl.output, sink
    try:
        f = procs.spawn("f", Flooder)
        per_rank = ctl.worker_logs.per_rank
        n = per_rank // (logs.LINE_MAX + 64) * 3 // 2  # half as much again as a rank may keep
        f.flood.call(n, 70_000).get(timeout=120)  # every line is cut: 70,000 > LINE_MAX
        assert wait_for(lambda: seen["done"] == 4, 60), seen
        f.slice(gpus=0).one_long_line.call_one(200_000).get(timeout=30)  # > 64 KiB: split by the agent too
        assert wait_for(lambda: any("long" in x for x in procs.logs(rank=0, tail=10)), 30)
    finally:
        ctl.output = prev
    assert seen["longest"] <= logs.LINE_MAX + 40 and seen["cut"] >= 4 * n, seen  # printed: cut, marked
    mesh_id = procs._ref.mesh_id
    for r in range(4):
        kept = procs.logs(rank=r, tail=None)
        assert kept[-1].endswith(" done") or "y" in kept[-1], kept[-1][-200:]
        assert f"flood {r} 0 " not in kept[0], "the oldest lines should have been dropped"
        assert len(kept) < n and all(len(x) <= logs.LINE_MAX + 100 for x in kept)
    assert ctl.worker_logs.held(mesh_id) <= 4 * per_rank
    procs.stop(timeout=5)
    assert ctl.worker_logs.held(mesh_id) <= 4 * logs.STOPPED_TAIL
    tail = procs.logs(rank=1, tail=5)  # a stopped mesh still shows its last words
    assert tail and tail[-1].endswith(" done")


def test_overall_log_cap_trims_the_biggest_ranks_first():
    from jupyter_mesh._runtime.logs import LINE_OVERHEAD, WorkerLogs

    store = WorkerLogs(per_rank=100_000, total=150_000)
    line = "z" * (1000 - LINE_OVERHEAD)  # 1,000 bytes each, as counted
    for i in range(90):
        store.add("m", 0, 1, [f"{i:04d}" + line[4:]], float(i))  # the big rank
    for i in range(30):
        store.add("m", 1, 1, [f"{i:04d}" + line[4:]], 100.0 + i)
    for i in range(40):
        store.add("m", 2, 1, [f"{i:04d}" + line[4:]], 200.0 + i)  # total 160,000 > 150,000
    assert store.held() <= 150_000
    assert len(store.lines("m", 1)) == 30, "a small rank lost lines while a bigger one had plenty"
    kept0 = store.lines("m", 0)
    assert kept0[-1][3].startswith("0089") and not kept0[0][3].startswith("0000")
    store.stopped("m")
    assert store.held("m") <= 3 * 64 * 1024
