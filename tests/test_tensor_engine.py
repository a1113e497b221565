"""The tensor engine (Monarch's ``activate()``, ``fetch_shard``, ``@remote``, ``.rref``) on real procs."""

from __future__ import annotations

import gc
import os
import signal

import pytest
import torch
from _procs import reaped_procs, wait_for
from tensor_actors import Holder, Linear, T, fails_on_gpus_1, rank_and_pid, wait_for_file

from jupyter_mesh import (
    ActorError,
    Channel,
    MeshError,
    MeshValueError,
    SerializationError,
    SupervisionError,
    fetch_shard,
    send,
)
from jupyter_mesh._api.tensor_engine.engine import engine_for
from jupyter_mesh._api.tensor_engine.tensor import DistributedTensor

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mesh4(host):
    """One 4-proc mesh for the tests that leave it usable (its procs import torch once)."""
    with reaped_procs(host, 4) as pm:
        yield pm


@pytest.fixture
def procs(mesh4):
    return mesh4


def shards(t, pm):
    return [fetch_shard(t, gpus=g).get(timeout=T) for g in range(pm.size("gpus"))]


def test_activate_makes_one_shard_per_proc(procs):
    with procs.activate():
        t = torch.rand(3, 4)
    assert isinstance(t, DistributedTensor) and t.shape == (3, 4) and t.dtype == torch.float32
    assert f"mesh '{procs.name}'" in repr(t) and "local shape=(3, 4)" in repr(t) and "float32" in str(t)
    one, two = fetch_shard(t, gpus=0).get(timeout=T), fetch_shard(t, {"gpus": 1}).get(timeout=T)
    assert type(one) is torch.Tensor and one.shape == (3, 4)
    assert not torch.equal(one, two)  # each proc draws its own values
    with pytest.raises(MeshValueError, match="has dims"):
        fetch_shard(t, hosts=0)
    with pytest.raises(MeshValueError, match="outside"):
        fetch_shard(t, gpus=7)
    # outside the block, torch is local again
    assert type(torch.ones(2)) is torch.Tensor
    with procs.activate():  # inside the block, plain tensors stay plain: a fetched shard prints here
        shard = fetch_shard(t, gpus=0).get(timeout=T)
        assert type(shard + 1) is torch.Tensor and repr(shard).startswith("tensor([[")


def test_torch_ops_run_on_the_shards_inside_and_outside_activate(procs):
    with procs.activate():
        t = torch.rand(3, 4)
        d = t @ t.T
    row, r, y, s = d[0], torch.relu(t - 0.5), t + 1, t.sum()  # outside: the argument is distributed
    assert (d.shape, row.shape, s.shape) == ((3, 3), (3,), ())
    t.mul_(2)  # in place: the same tensor, after the reads above
    for g, local in enumerate(shards(t, procs)):
        base = local / 2
        got = fetch_shard([d, row, r, y, s, {"t": t}], gpus=g).get(timeout=T)
        assert torch.allclose(got[0], base @ base.T) and torch.allclose(got[1], (base @ base.T)[0])
        assert torch.allclose(got[2], torch.relu(base - 0.5)) and torch.allclose(got[3], base + 1)
        assert torch.allclose(got[4], base.sum()) and torch.equal(got[5]["t"], local)
    with pytest.raises(RuntimeError):  # a shape error is found here, before anything is sent
        t @ t
    with pytest.raises(MeshValueError, match="fetch_shard"):
        t.item()


def test_ops_are_pipelined_the_controller_never_waits(procs, tmp_path):
    gate = tmp_path / "go"
    with procs.activate():
        t = torch.ones(2)
    held = wait_for_file(t, str(gate))  # each proc's engine now waits for the file
    later = [held + i for i in range(20)]  # all of these return while the workers are held
    fut = fetch_shard(later[-1], gpus=3)
    assert not fut.done() and later[-1].shape == (2,)
    gate.touch()
    assert fut.get(timeout=T).tolist() == [29.0, 29.0]


def test_a_failed_op_fails_its_refs_and_says_which_op_where(procs):
    with procs.activate():
        t = torch.rand(3, 4)
    bad = t[torch.tensor([7])]  # fine on meta tensors, out of bounds on the procs
    worse = bad + 1
    for x in (bad, worse):  # a ref made from a failed one carries the first failure
        with pytest.raises(ActorError) as e:
            fetch_shard(x, gpus=2).get(timeout=T)
        msg = str(e.value)
        assert "IndexError" in msg and "Tensor.__getitem__" in msg and "gpus=2" in msg and "Traceback" in msg
    only_one = fails_on_gpus_1(t)
    assert torch.equal(fetch_shard(only_one, gpus=0).get(timeout=T), fetch_shard(t, gpus=0).get(timeout=T))
    with pytest.raises(ActorError, match="this proc refuses"):
        fetch_shard(only_one, gpus=1).get(timeout=T)
    assert fetch_shard(t + 1, gpus=1).get(timeout=T).shape == (3, 4)  # the engine lives on


def test_an_actor_gets_the_shard_of_its_own_proc(procs):
    holders = procs.spawn("holders", Holder)
    with procs.activate():
        t = torch.rand(2, 2)
    expect = [s.flatten().tolist() for s in shards(t, procs)]
    got = holders.describe.call(t * 1).get(timeout=T)  # the argument is dropped right after the call
    gc.collect()
    for g in range(4):
        kind, values, rank = got.item(gpus=g)
        assert kind == "Tensor" and rank == {"gpus": g}
        assert values == pytest.approx([v * 1 for v in expect[g]])
    # the Monarch example's form: a row of a product, to actors of another class on the same procs
    assert holders.slice(gpus=3).describe.call_one(t[0]).get(timeout=T)[1] == pytest.approx(expect[3][:2])
    # only the procs a call goes to set the shard aside, and each took its loan
    stats = engine_for(procs).workers.stats.call().get(timeout=T)
    assert [s["loans"] for s in stats.values()] == [0, 0, 0, 0]


def test_a_tensor_of_one_mesh_is_refused_by_another(host, procs):
    other = host.spawn_procs(per_host={"gpus": 2})
    try:
        with procs.activate():
            a = torch.ones(2)
        with other.activate():
            b = torch.ones(2)
            with pytest.raises(MeshValueError, match="different meshes"):
                a + 1  # a lives on procs, the active mesh is other
        with pytest.raises(MeshValueError, match="different meshes"):
            a + b
        stranger = other.spawn("stranger", Holder)
        with pytest.raises(SerializationError, match="lives on proc mesh"):  # refused here, nothing sent
            stranger.describe.call(a)
    finally:
        other.stop(timeout=5)


def test_rref_keeps_each_result_on_its_proc(procs):
    lin = procs.spawn("lin", Linear)
    with procs.activate():
        t = torch.rand(4, 3)
    o = torch.relu(lin.forward.rref(t))
    assert isinstance(o, DistributedTensor) and o.shape == (4, 3)
    for g, local in enumerate(shards(t, procs)):
        assert torch.allclose(fetch_shard(o, gpus=g).get(timeout=T), torch.relu(local @ torch.full((3, 3), 2.0)))
    with pytest.raises(MeshValueError, match="propagate"):
        lin.no_shape.rref(t)
    # each proc calls its own actor, numbered as in a call to the whole mesh (not as a one-point slice)
    r = lin.ranked.rref(t)
    for g, local in enumerate(shards(t, procs)):
        assert torch.equal(fetch_shard(r, gpus=g).get(timeout=T), local + g)


def test_remote_functions_call_and_send_to_a_port(procs):
    with procs.activate():
        got = rank_and_pid.call().get(timeout=T)
    assert sorted(v[0]["gpus"] for v in got.values()) == [0, 1, 2, 3]
    assert {v[1] for v in got.values()} == set(procs.pids().values())
    port, recv = Channel.open()
    with procs.activate():
        send(rank_and_pid, args=(), kwargs={}, port=port)
    pids = {recv.recv().get(timeout=T)[1] for _ in range(4)}
    assert pids == set(procs.pids().values())
    with pytest.raises(MeshValueError, match="activate"):
        rank_and_pid.call()


def test_activate_nests_and_is_left_on_exceptions(host, procs):
    half = procs.slice(gpus=slice(0, 2))
    with pytest.raises(ZeroDivisionError):
        with procs.activate():
            with half.activate():
                h = torch.zeros(2)
            raise ZeroDivisionError("an error inside the blocks")
    assert type(torch.zeros(1)) is torch.Tensor  # both left
    assert h._jm_view.ranks() == half._shape.ranks()
    assert fetch_shard(h, gpus=1).get(timeout=T).tolist() == [0.0, 0.0]
    with pytest.raises(MeshValueError, match="outside"):
        fetch_shard(h, gpus=3)


def test_dropped_tensors_are_freed_on_the_procs(procs):
    def held():
        gc.collect()
        engine_for(procs).flush()
        return [s["refs"] for s in engine_for(procs).workers.stats.call().get(timeout=T).values()]

    with procs.activate():
        t = torch.ones(8)
    before = held()
    for _ in range(300):
        t = t + 1  # each step drops the tensor before it
    assert fetch_shard(t, gpus=0).get(timeout=T)[0].item() == 301.0
    assert all(n <= b + 1 for n, b in zip(held(), before, strict=True))  # only t is left of the 300
    del t
    assert all(n <= b - 1 for n, b in zip(held(), before, strict=True))


def test_a_killed_proc_fails_fetches_of_its_shards(host):
    procs = host.spawn_procs(per_host={"gpus": 2})
    with procs.activate():
        t = torch.ones(2)
    assert fetch_shard(t, gpus=1).get(timeout=T).tolist() == [1.0, 1.0]
    os.kill(procs.pids()[1], signal.SIGKILL)
    assert wait_for(lambda: procs.state().ranks[1].state == "failed", 10)
    try:
        with pytest.raises(SupervisionError):
            fetch_shard(t, gpus=1).get(timeout=T)
        try:  # an op on the mesh now: refused at once, or its refs fail on the dead proc only
            u = t + 1
        except SupervisionError as e:
            assert "gpus=1" in str(e)
        else:
            assert fetch_shard(u, gpus=0).get(timeout=T).tolist() == [2.0, 2.0]
    finally:
        procs.stop(timeout=5)


def test_a_stopped_mesh_refuses_fetches_and_activation(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    with pm.activate():
        t = torch.ones(2)
    assert fetch_shard(t, gpus=0).get(timeout=T).tolist() == [1.0, 1.0]
    pm.stop(timeout=5)
    with pytest.raises(MeshError):
        fetch_shard(t, gpus=0).get(timeout=T)
    with pytest.raises((MeshError, RuntimeError), match="stopped"):
        with pm.activate():
            pass
    assert type(torch.ones(1)) is torch.Tensor


def test_reduce_over_a_mesh_dim(procs):
    with procs.activate():
        t = torch.rand(2, 3)
    local = shards(t, procs)
    total, stacked, top = t.reduce("gpus", "sum"), t.reduce(("gpus",), "stack"), t.reduce("gpus", "max") * 2
    assert (total.shape, stacked.shape) == ((2, 3), (4, 2, 3))
    for g in (0, 3):
        assert torch.allclose(fetch_shard(total, gpus=g).get(timeout=T), sum(local))
        assert torch.equal(fetch_shard(stacked, gpus=g).get(timeout=T), torch.stack(local))
        assert torch.allclose(fetch_shard(top, gpus=g).get(timeout=T), torch.stack(local).amax(0) * 2)
    # one proc's failed shard fails the reduction everywhere, and nobody hangs for it
    failed = fails_on_gpus_1(t).reduce("gpus", "avg")
    for g in (0, 1):
        with pytest.raises(ActorError, match="this proc refuses"):
            fetch_shard(failed, gpus=g).get(timeout=T)
    with pytest.raises(MeshValueError, match="not \\['hosts'\\]"):
        t.reduce("hosts")
