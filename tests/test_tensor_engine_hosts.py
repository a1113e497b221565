"""The tensor engine on a mesh over two host agents (``LocalJob(hosts=2)``): shards on every host, a
reduce across hosts (the workers send each other shards through ports, across agents), rrefs and
shards lent to actors on both hosts. The single-agent cases are in ``test_tensor_engine.py``."""

from __future__ import annotations

import pytest
import torch
from _procs import reaped_procs
from tensor_actors import Holder, Linear, T, fails_on_gpus_1

from jupyter_mesh import ActorError, fetch_shard

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def grid():
    """2 hosts by 2 procs, each host with its own agent."""
    from jupyter_mesh import LocalJob

    job = LocalJob(hosts=2)
    try:
        with reaped_procs(job.host_mesh(), 2) as pm:
            yield pm
    finally:
        job.stop()


def _all(t, pm):
    return {(h, g): fetch_shard(t, hosts=h, gpus=g).get(timeout=T) for h in range(2) for g in range(2)}


def test_shards_live_on_every_host_and_reduce_across_them(grid):
    with grid.activate():
        t = torch.rand(2, 3)
    local = _all(t, grid)
    assert len({tuple(v.flatten().tolist()) for v in local.values()}) == 4  # each proc drew its own
    every = t.reduce(("hosts", "gpus"), "sum")
    per_host = t.reduce("hosts", "max")
    for h, g in local:
        assert torch.allclose(fetch_shard(every, hosts=h, gpus=g).get(timeout=T), sum(local.values()))
        want = torch.maximum(local[(0, g)], local[(1, g)])
        assert torch.equal(fetch_shard(per_host, hosts=h, gpus=g).get(timeout=T), want)
    stacked = t.reduce("gpus", "stack")
    assert torch.equal(
        fetch_shard(stacked, hosts=1, gpus=0).get(timeout=T), torch.stack([local[(1, 0)], local[(1, 1)]])
    )


def test_a_failed_shard_on_one_host_fails_the_cross_host_reduce_everywhere(grid):
    with grid.activate():
        t = torch.ones(3)
    failed = fails_on_gpus_1(t).reduce(("hosts", "gpus"), "avg")
    for h in (0, 1):
        with pytest.raises(ActorError, match="this proc refuses"):
            fetch_shard(failed, hosts=h, gpus=0).get(timeout=T)
    # the mesh still works after it
    with grid.activate():
        ok = (torch.ones(3) * 2).reduce(("hosts", "gpus"), "sum")
    assert torch.equal(fetch_shard(ok, hosts=1, gpus=1).get(timeout=T), torch.full((3,), 8.0))


def test_rrefs_and_shards_lent_to_actors_on_both_hosts(grid):
    lin, holders = grid.spawn("lin", Linear), grid.spawn("holders", Holder)
    with grid.activate():
        t = torch.rand(4, 3)
    local = _all(t, grid)
    o = lin.forward.rref(t)
    got = holders.describe.call(t).get(timeout=T)
    for h, g in local:
        assert torch.allclose(fetch_shard(o, hosts=h, gpus=g).get(timeout=T), local[(h, g)] @ torch.full((3, 3), 2.0))
        kind, values, rank = got.item(hosts=h, gpus=g)
        assert kind == "Tensor" and rank == {"hosts": h, "gpus": g}
        assert values == pytest.approx(local[(h, g)].flatten().tolist())
