"""Integration tests: real agent, template and proc processes on loopback."""

from __future__ import annotations

import asyncio
import threading

import pytest
from actors import BadInit, Caller, Counter, FailureReporter, Faulty, Recorder

from jupyter_mesh import (
    ActorError,
    MeshClosedError,
    MeshValueError,
    SerializationError,
    SupervisionError,
    ValueMesh,
    current_rank,
)

pytestmark = pytest.mark.integration


def test_issue_example_verbatim(procs):
    counters = procs.spawn("counter", Counter, 0)
    vm = counters.incr.call().get()
    assert isinstance(vm, ValueMesh) and list(vm.values()) == [1, 1, 1, 1]
    assert vm.sizes == {"gpus": 4}  # this_host() has no dims, as in Monarch
    assert counters.slice(gpus=2).incr.call_one(5).get() == 6
    counters.incr.broadcast()
    assert counters.incr.choose().get() in (3, 8)
    who = [f.get() for f in counters.whoami.stream()]
    assert sorted(w["gpus"] for w in who) == [0, 1, 2, 3]

    async def awaited():
        return await counters.incr.call()

    vm2 = asyncio.run(awaited())
    assert vm2.item(gpus=2) == 8 or vm2.item(gpus=2) == 9


def test_current_rank_inside_and_outside(procs):
    counters = procs.spawn("c", Counter, 0)
    vm = counters.whoami.call().get(timeout=10)
    assert [v["gpus"] for v in vm.values()] == [0, 1, 2, 3]
    assert dict(current_rank()) == {}


def test_slices_views_and_item(procs):
    c = procs.spawn("c", Counter, 100)
    part = c.slice(gpus=slice(1, 3))
    vm = part.incr.call(2).get(timeout=10)
    assert vm.sizes == {"gpus": 2}
    assert vm.item(gpus=0) == 102  # coordinates are relative to the view
    flat = c.flatten("rank")
    assert list(flat.value.call().get(timeout=10).values()) == [100, 102, 102, 100]
    ren = c.rename(gpus="workers")
    assert ren.value.call().get(timeout=10).sizes == {"workers": 4}
    assert c.size() == 4 and c.size("gpus") == 4 and "hosts" not in c.extent


def test_call_one_needs_exactly_one(procs):
    c = procs.spawn("c", Counter, 0)
    with pytest.raises(MeshValueError, match="exactly one actor"):
        c.incr.call_one()


def test_unknown_endpoint_is_attribute_error(procs):
    c = procs.spawn("c", Counter, 0)
    with pytest.raises(AttributeError, match=r"no endpoint 'nope'.*incr"):
        c.nope  # noqa: B018


def test_remote_exception_is_actor_error_and_mesh_survives(procs):
    f = procs.spawn("faulty", Faulty)
    with pytest.raises(ActorError) as ei:
        f.slice(gpus=1).fail_on.call_one([1]).get(timeout=10)
    e = ei.value
    assert e.actor == "faulty" and e.endpoint == "fail_on" and e.coords == {"gpus": 1}
    assert isinstance(e.exception, ValueError)
    assert "rank 1 refuses" in str(e) and "raise ValueError" in str(e) and "fail_on" in e.failures[0].traceback
    # several failed ranks: one error listing all of them
    with pytest.raises(ActorError) as ei:
        f.fail_on.call([0, 3]).get(timeout=10)
    assert [dict(x.coords)["gpus"] for x in ei.value.failures] == [0, 3]
    assert "2 of 4 ranks" in str(ei.value)
    assert list(f.ok.call().get(timeout=10).values()) == ["fine"] * 4


def test_stream_reports_errors_per_rank(procs):
    f = procs.spawn("faulty", Faulty)
    outcomes = [fut.exception(timeout=10) for fut in f.fail_on.stream([2])]
    assert sum(isinstance(o, ActorError) for o in outcomes) == 1


def test_unpicklable_argument_and_result(procs):
    """The message names the call, the argument and why, in one sentence, then says what to do."""
    f = procs.spawn("faulty", Faulty)
    with pytest.raises(SerializationError) as ei:
        f.echo.call(threading.Lock())
    assert str(ei.value).startswith(
        "Faulty.echo was not called: positional argument 0 (lock) does not pickle "
        "(cannot pickle '_thread.lock' object). Arguments and results travel pickled: pass plain data"
    ), str(ei.value)
    assert "create locks, open files, sockets and threads inside the actor" in str(ei.value)
    with pytest.raises(SerializationError, match=r"keyword argument 'x' \(lock\) does not pickle"):
        f.echo.call(x=threading.Lock())
    with pytest.raises(SerializationError, match=r"^Faulty was not spawned: positional argument 0 \(lock\)"):
        procs.spawn("faulty2", Faulty, threading.Lock())
    with pytest.raises(
        ActorError, match=r"Faulty.unpicklable_result ran, but its return value \(\w+\) does not pickle"
    ):
        f.slice(gpus=0).unpicklable_result.call_one().get(timeout=10)


def test_init_failure_is_supervision_error(procs):
    bad = procs.spawn("bad", BadInit, True)
    with pytest.raises(SupervisionError, match="constructor exploded") as ei:
        bad.initialized.get(timeout=10)
    assert {f.kind for f in ei.value.failures} == {"init"}
    assert len(ei.value.failures) == 4
    with pytest.raises(SupervisionError, match="__init__ raised"):
        bad.ok.call().get(timeout=10)
    good = procs.spawn("good", BadInit, False)
    good.initialized.get(timeout=10)
    assert good.slice(gpus=3).ok.call_one().get(timeout=10) == "fine"


def test_actor_to_actor(procs, host):
    counters = procs.spawn("counters", Counter, 0)
    other = host.spawn_procs(per_host={"gpus": 1})
    try:
        caller = other.spawn("caller", Caller)
        one = caller.slice(gpus=0)
        assert one.sync_sum.call_one(counters).get(timeout=20) == 4
        assert one.async_one.call_one(counters).get(timeout=20) == 11
        assert one.choose.call_one(counters).get(timeout=20) in (1, 11)
        # an actor calling actors on its own proc mesh (same procs) does not deadlock
        local_caller = procs.spawn("local_caller", Caller)
        assert local_caller.slice(gpus=1).sync_sum.call_one(counters).get(timeout=20) == 12 + 2 + 2 + 2
    finally:
        other.stop()


def test_fifo_per_sender_across_paths(procs):
    rec = procs.spawn("rec", Recorder)
    n = 0
    futs = []
    for i in range(60):
        n += 1
        kind = i % 4
        if kind == 0:
            futs.append(rec.note.call("main", n, 0.002))
        elif kind == 1:
            futs.append(rec.slice(gpus=i % 4).note.call_one("main", n, 0.002))
        elif kind == 2:
            rec.note_sync.broadcast("main", n)
        else:
            futs.append(rec.slice(gpus=slice(1, 3)).note_sync.call("main", n))
    for f in futs:
        f.get(timeout=20)
    logs = rec.get_log.call().get(timeout=10)
    for log in logs.values():
        ns = [x for _, x in log]
        assert ns == sorted(ns), ns


def test_fifo_under_concurrent_senders(procs):
    rec = procs.spawn("rec", Recorder)
    errors = []

    def sender(tag):
        try:
            fs = []
            for n in range(40):
                if n % 3 == 0:
                    fs.append(rec.note.call(tag, n, 0.001))
                else:
                    fs.append(rec.slice(gpus=n % 4).note_sync.call_one(tag, n))
            for f in fs:
                f.get(timeout=30)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=sender, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for log in rec.get_log.call().get(timeout=10).values():
        for tag in {t for t, _ in log}:
            ns = [n for t, n in log if t == tag]
            assert ns == sorted(ns)


def test_worker_output_reaches_controller_with_rank(procs):
    from _procs import wait_for

    from jupyter_mesh._runtime.controller import Controller

    seen = []
    ctl = Controller.get()
    old = ctl.output
    ctl.output = lambda mesh, rank, label, fd, lines: seen.extend((label, fd, line) for line in lines)
    try:
        f = procs.spawn("f", Faulty)
        f.shout.call("hello from a worker").get(timeout=10)
        assert wait_for(lambda: len([s for s in seen if s[2] == "hello from a worker"]) == 4, 5)
        assert {s[0] for s in seen if s[2] == "hello from a worker"} == {f"gpus={i}" for i in range(4)}
    finally:
        ctl.output = old


def test_stop_and_stopped_errors(host):
    """As in Monarch: calls to a stopped mesh raise SupervisionError (kind stopped), a RuntimeError;
    spawning on it raises a RuntimeError too."""
    from _procs import wait_dead

    with host.spawn_procs(per_host={"gpus": 2}) as pm:
        c = pm.spawn("c", Counter, 0)
        assert list(c.incr.call().get(timeout=10).values()) == [1, 1]
        pids = set(pm.pids().values())
    assert pm.stopped
    assert not wait_dead(pids, 5)
    with pytest.raises(SupervisionError, match="stopped") as ei:
        c.incr.call()
    assert isinstance(ei.value, RuntimeError) and {f.kind for f in ei.value.failures} == {"stopped"}
    with pytest.raises(RuntimeError, match="stopped"):
        c.slice(gpus=0).incr.call_one()
    with pytest.raises(MeshClosedError) as ei2:
        pm.spawn("again", Counter, 0)
    assert isinstance(ei2.value, RuntimeError)
    assert pm.stop().get(timeout=1) is None  # idempotent, and a Future as in Monarch


def test_pending_call_fails_on_stop(host):
    pm = host.spawn_procs(per_host={"gpus": 1})
    f = pm.spawn("f", Faulty)
    fut = f.sleep.call(30)
    pm.stop(timeout=1)
    with pytest.raises(SupervisionError, match="stopped"):
        fut.get(timeout=5)


def test_tensors_and_arrays_roundtrip(procs):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    f = procs.spawn("f", Faulty)
    one = f.slice(gpus=0)
    t = torch.arange(1_000_000, dtype=torch.float32).reshape(1000, 1000)
    back = one.echo.call_one(t).get(timeout=20)
    assert torch.equal(back, t)
    small = {"bf16": torch.ones(3, dtype=torch.bfloat16), "empty": torch.zeros(0, 2), "view": t[::2, 1]}
    back = one.echo.call_one(small).get(timeout=20)
    for k, v in small.items():
        assert torch.equal(back[k], v) and back[k].dtype == v.dtype
    a = np.random.rand(300, 300)
    assert (one.echo.call_one(a).get(timeout=20) == a).all()
    p = torch.nn.Parameter(torch.randn(4, 4))
    bp = one.echo.call_one(p).get(timeout=20)
    assert isinstance(bp, torch.nn.Parameter) and torch.equal(bp, p)


def test_proc_that_fails_to_start_is_a_start_failure(host):
    with pytest.raises(SupervisionError) as ei:
        host.spawn_procs(per_host={"gpus": 2}, preload=["jm_no_such_module_xyz"], timeout=30)
    e = ei.value
    assert {f.kind for f in e.failures} == {"start"} and len(e.failures) == 2
    assert "ModuleNotFoundError" in str(e) and "jm_no_such_module_xyz" in str(e)
    assert "exited with code 3" in str(e)
    # the host is fine afterwards
    pm = host.spawn_procs(per_host={"gpus": 1})
    pm.stop()


def test_torchrun_variables_and_one_gpu_per_proc(procs):
    from actors import EnvReader

    e = procs.spawn("env", EnvReader)
    envs = list(
        e.env.call("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES").get(10).values()
    )
    assert [x["RANK"] for x in envs] == ["0", "1", "2", "3"]
    assert {x["WORLD_SIZE"] for x in envs} == {"4"} and {x["LOCAL_WORLD_SIZE"] for x in envs} == {"4"}
    assert [x["LOCAL_RANK"] for x in envs] == ["0", "1", "2", "3"]
    assert [x["CUDA_VISIBLE_DEVICES"] for x in envs] == ["0", "1", "2", "3"]


def test_background_tasks_of_async_endpoints_keep_running(procs):
    import time

    from actors import Ticker

    t = procs.spawn("ticker", Ticker).slice(gpus=0)
    t.start.call_one().get(timeout=10)
    time.sleep(0.5)  # the actor is idle: its loop must still run the task
    first = t.ticks_now.call_one().get(timeout=10)
    assert first >= 10, first
    time.sleep(0.3)
    assert t.ticks_async.call_one().get(timeout=10) > first


def test_a_failure_returned_by_an_endpoint_is_its_value_not_its_error(procs):
    """A Failure (or RemoteFailure) that an endpoint returns is data: it once made the call raise a
    SupervisionError (or ActorError) as if the rank itself had failed."""
    from jupyter_mesh import Failure, RemoteFailure

    r = procs.spawn("rep", FailureReporter)
    one = r.slice(gpus=0).failure.call_one().get(timeout=10)
    assert isinstance(one, Failure) and one.signal == 9
    assert all(isinstance(v, Failure) for v in r.failure.call().get(timeout=10).values())
    assert all(isinstance(v, RemoteFailure) for v in r.remote_failure.call().get(timeout=10).values())
    assert all(isinstance(f.get(timeout=10), Failure) for f in r.failure.stream())
    assert isinstance(r.remote_failure.choose().get(timeout=10), RemoteFailure)


_HANDLE_AFTER_SHUTDOWN = """
import sys, time
sys.path.insert(0, sys.argv[1])
import jupyter_mesh
from jupyter_mesh import SupervisionError, this_host
from actors import Counter
c = this_host().spawn_procs(per_host={"gpus": 1}).spawn("c", Counter, 0)
assert c.incr.call_one().get(timeout=20) == 1
jupyter_mesh.shutdown()
for _ in range(2):  # the first call starts a new controller; the second one runs on it
    t0 = time.monotonic()
    try:
        c.incr.call_one().get(timeout=10)
        print("answered?!")
    except SupervisionError as e:  # its proc mesh was stopped with the runtime
        assert {f.kind for f in e.failures} == {"stopped"}, e
        print("stopped", round(time.monotonic() - t0))
"""


def test_a_handle_from_a_shut_down_controller_fails_as_stopped():
    """After shutdown() (a kernel restarting the runtime) a kept actor mesh fails at once as stopped; its
    calls went to the old agents' closed addresses and waited out their timeout."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _HANDLE_AFTER_SHUTDOWN, here], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["stopped 0", "stopped 0"], out.stdout
