"""The tensor engine used in ways its first tests did not: a second controller on the same procs, device
moves, ops whose shapes depend on values, autograd, copies. Each test is a problem found by trying."""

from __future__ import annotations

import copy

import pytest
import torch
from _procs import reaped_procs
from tensor_actors import Driver, T

from jupyter_mesh import MeshValueError, fetch_shard
from jupyter_mesh._api.tensor_engine.engine import engine_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def procs(host):
    with reaped_procs(host, 2) as pm:
        yield pm


def test_a_second_controller_on_the_same_procs_leaves_our_shards_alone(procs):
    """An actor given the ProcMesh activates it too: its ref ids must not collide with ours (both counters
    started at 1, so its first tensor overwrote our first tensor's shards on every proc)."""
    with procs.activate():
        mine = torch.ones(2)
    assert fetch_shard(mine, gpus=1).get(timeout=T).tolist() == [1.0, 1.0]
    driver = procs.slice(gpus=0).spawn("driver", Driver)
    assert driver.make.call_one(procs, 7.0).get(timeout=T) == [7.0, 7.0]
    for g in (0, 1):
        assert fetch_shard(mine, gpus=g).get(timeout=T).tolist() == [1.0, 1.0]


def test_device_moves_keep_the_shape(procs):
    with procs.activate():
        t = torch.rand(3, 2)
    for moved in (t.cpu(), t.to("cpu"), t.to(torch.device("cpu"), torch.float64), t.to(dtype=torch.int32)):
        assert moved.shape == (3, 2)
        local = fetch_shard(t, gpus=1).get(timeout=T)
        assert torch.equal(fetch_shard(moved, gpus=1).get(timeout=T), local.to(moved.dtype))
    assert t.to(torch.float64).dtype == torch.float64


def test_ops_whose_shape_depends_on_values_are_refused_with_a_way_out(procs):
    with procs.activate():
        t = torch.rand(4)
    for op in (lambda: torch.nonzero(t > 0.5), lambda: torch.unique(t), lambda: torch.masked_select(t, t > 0.5)):
        with pytest.raises(MeshValueError, match=r"depends on the values.*@remote"):
            op()
    with pytest.raises(MeshValueError, match="fetch_shard"):
        0.5 in t  # noqa: B015 - reads values
    with pytest.raises(RuntimeError, match="shape"):  # a shape error stays torch's own
        t.view(3, 5)
    assert fetch_shard(t + 1, gpus=0).get(timeout=T).shape == (4,)  # nothing was sent for the refused ones


def test_copy_is_a_clone_and_lends_nothing(procs):
    with procs.activate():
        t = torch.rand(2)
    c = copy.copy(t)
    c.add_(1)
    assert torch.allclose(fetch_shard(c, gpus=1).get(timeout=T), fetch_shard(t, gpus=1).get(timeout=T) + 1)
    stats = engine_for(procs).workers.stats.call().get(timeout=T)
    assert [s["loans"] for s in stats.values()] == [0, 0]


def test_backward_runs_on_the_procs_and_grad_reads_there(procs):
    with procs.activate():
        w = torch.rand(3, requires_grad=True)
    assert w.requires_grad
    (w * w).sum().backward()
    g = w.grad
    assert g is not None and g.shape == (3,)
    for r in (0, 1):
        assert torch.allclose(fetch_shard(g, gpus=r).get(timeout=T), 2 * fetch_shard(w, gpus=r).get(timeout=T))


def test_a_call_that_does_not_pickle_leaves_no_loan(procs):
    """Pickling an actor call's arguments lends each distributed tensor's shard before a later argument
    fails to pickle: the call is not sent, so nobody would ever collect those loans (held for an hour)."""
    import threading

    from tensor_actors import Holder

    from jupyter_mesh import SerializationError

    holders = procs.spawn("unpicklable", Holder)
    with procs.activate():
        t = torch.rand(2)
    for _ in range(3):
        with pytest.raises(SerializationError, match="does not pickle"):
            holders.describe.call([t, threading.Lock()])  # the shard is lent, then the lock fails
    stats = engine_for(procs).workers.stats.call().get(timeout=T)
    assert [s["loans"] for s in stats.values()] == [0, 0]
    assert holders.describe.call(t).get(timeout=T).item(gpus=1)[0] == "Tensor"  # lending still works


def test_malformed_ops_do_not_end_the_engine(procs):
    """Anything holding the workers' actor mesh (in the trust domain: the user's code) can send them any
    payload. A malformed one must not end the actor (a broadcast's error would: every tensor lost)."""
    with procs.activate():
        t = torch.ones(2)
    workers = engine_for(procs).workers
    for batch in (5, None, [None], [()], [("del", None)], [("lend", -5, object(), None)], [("nope",)],
                  [("run", "not callable", "x", (), {}, 7)], [("reduce", -1, "sum", {}, {}, 1, [3])]):  # fmt: skip
        workers.ops.broadcast(batch)
    for ids in ([-1], [10**100], ["a"]):
        with pytest.raises(Exception, match="no distributed tensor with ref"):
            workers.slice(gpus=0).fetch.call_one(ids).get(timeout=T)
    for g in (0, 1):
        assert fetch_shard(t + 1, gpus=g).get(timeout=T).tolist() == [2.0, 2.0]


def test_a_tensor_travels_only_in_actor_calls_and_spawns(procs, tmp_path):
    """Pickled for anything else (a port, pickle.dumps, torch.save) it lent its shard to every proc for an
    hour, and could never be read (through a port it failed on the receiving side, long after)."""
    import pickle

    from tensor_actors import Opener

    from jupyter_mesh import SerializationError

    with procs.activate():
        t = torch.arange(2.0)
    spawned = procs.spawn("opener", Opener, t * 2)  # a spawn argument: each actor gets its proc's shard
    assert spawned.first_arg.call().get(timeout=T).item(gpus=1) == ("Tensor", [0.0, 2.0])
    port = spawned.slice(gpus=1).open.call_one().get(timeout=T)
    for send in (port.send, pickle.dumps, lambda x: torch.save(x, str(tmp_path / "t.pt"))):
        with pytest.raises((MeshValueError, SerializationError), match="only as an argument of an actor call or spawn"):
            send(t)
    stats = engine_for(procs).workers.stats.call().get(timeout=T)
    assert [s["loans"] for s in stats.values()] == [0, 0]


def test_no_grad_here_is_no_grad_on_the_procs(procs):
    """Grad mode is this thread's: the procs recorded autograd graphs for ops made under no_grad()."""
    with procs.activate():
        w = torch.rand(3, requires_grad=True)
    with torch.no_grad():
        y = w * 2
        w.add_(1)  # the usual optimizer step: in place on a leaf, allowed only without grad
    z = w * 2
    assert not y.requires_grad and z.requires_grad
    assert not fetch_shard(y, gpus=1).get(timeout=T).requires_grad
    assert fetch_shard(z, gpus=1).get(timeout=T).requires_grad


def test_the_first_reduce_does_not_wait_for_queued_ops(host, tmp_path):
    """The first reduce on a mesh asked every worker for its inbox and waited for the answer, which
    queued behind the ops before it: the controller blocked until they were done (up to 120 s, then
    MeshTimeoutError), and a held or hung worker blocked the cell."""
    import threading

    from tensor_actors import wait_for_file

    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        gate = tmp_path / "go"
        with pm.activate():
            t = torch.ones(2)
        held = wait_for_file(t, str(gate))  # each proc's engine now waits for the file (at most 60 s)
        out: list[object] = []
        issuer = threading.Thread(target=lambda: out.append(held.reduce("gpus")), daemon=True)
        issuer.start()
        issuer.join(30)
        returned_while_held = bool(out)
        gate.touch()
        issuer.join(T)
        assert returned_while_held, "reduce() waited for the ops queued before it"
        assert fetch_shard(out[0], gpus=1).get(timeout=T).tolist() == [20.0, 20.0]
    finally:
        pm.stop(timeout=5)


def test_a_shard_that_arrives_after_its_reduce_gave_up_is_dropped(tmp_path):
    """A peer later than $JUPYTER_MESH_TENSOR_WAIT fails the reduction; its shard, arriving after that,
    was parked in the inbox for a reduction that would never come, until the worker ended."""
    from tensor_actors import wait_on_gpus_1

    from jupyter_mesh import ActorError
    from jupyter_mesh.jobs import LocalJob

    job = LocalJob(env={"JUPYTER_MESH_TENSOR_WAIT": "2"})
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        gate = tmp_path / "go"
        with pm.activate():
            t = torch.ones(2)
        late = wait_on_gpus_1(t, str(gate)).reduce("gpus")  # gpus=0 waits 2 s for gpus=1, then gives up
        with pytest.raises(ActorError, match="reduce"):
            fetch_shard(late, gpus=0).get(timeout=T)
        gate.touch()
        assert fetch_shard(late, gpus=1).get(timeout=T).tolist() == [2.0, 2.0]  # gpus=1 had gpus=0's shard

        def parked() -> int:
            return engine_for(pm).workers.slice(gpus=0).stats.call_one().get(timeout=T)["parked"]

        # the late shard is read by the next reduction on gpus=0, which must not keep it
        assert fetch_shard(t.reduce("gpus"), gpus=0).get(timeout=T).tolist() == [2.0, 2.0]
        assert parked() == 0
    finally:
        job.stop()


def test_a_peer_without_the_shard_fails_the_reduce_at_once_and_the_next_one_works(tmp_path):
    """A proc that lacks the shard (freed there, or respawned) raised before sending anything: its peers
    waited $JUPYTER_MESH_TENSOR_WAIT, and their timed-out receive then swallowed the next reduction's
    message, so every later reduce on those procs failed too."""
    from jupyter_mesh import ActorError
    from jupyter_mesh.jobs import LocalJob

    job = LocalJob(env={"JUPYTER_MESH_TENSOR_WAIT": "2"})
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        with pm.activate():
            t, u = torch.ones(2), torch.full((2,), 3.0)
        engine_for(pm).workers.slice(gpus=1).ops.broadcast([("del", [t._jm_ref])])  # as after a respawn
        gone = t.reduce("gpus")
        for g in (0, 1):
            with pytest.raises(ActorError, match="no distributed tensor with ref"):
                fetch_shard(gone, gpus=g).get(timeout=T)
        for _ in range(2):
            for g in (0, 1):
                assert fetch_shard(u.reduce("gpus"), gpus=g).get(timeout=T).tolist() == [6.0, 6.0]
    finally:
        job.stop()


def test_reduce_works_after_a_rank_is_respawned(tmp_path):
    """The engine kept the workers' inbox ports from before: a respawned proc's worker has a new one, so
    its peers sent their shards to a dead port and it waited for them in vain."""
    import os
    import signal

    from _procs import wait_for

    from jupyter_mesh import ActorError
    from jupyter_mesh.jobs import LocalJob

    job = LocalJob(env={"JUPYTER_MESH_TENSOR_WAIT": "5"})
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        with pm.activate():
            t = torch.ones(2)
        assert fetch_shard(t.reduce("gpus"), gpus=1).get(timeout=T).tolist() == [2.0, 2.0]
        os.kill(pm.pids()[1], signal.SIGKILL)
        assert wait_for(lambda: pm.state().ranks[1].state == "failed", 10)
        pm.respawn([1])
        for _ in range(2):  # the first call after the failure may report it
            try:
                with pm.activate():
                    u = torch.full((2,), 3.0)
                fetch_shard(u, gpus=1).get(timeout=T)
                break
            except Exception:  # noqa: BLE001 - reported once
                continue
        with pytest.raises(ActorError, match="respawned"):  # the old tensor is gone there
            fetch_shard(t + 1, gpus=1).get(timeout=T)
        for g in (0, 1):
            assert fetch_shard(u.reduce("gpus"), gpus=g).get(timeout=T).tolist() == [6.0, 6.0]
    finally:
        job.stop()
