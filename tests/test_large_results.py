"""A gathered call's large results (``GATHER_DIRECT_MIN``) go from each proc straight to the caller,
through shared memory on one host, and the host agent only counts them: an agent that took in every
rank's result held them all at once (two ranks returning 512 MiB each: a 2 GiB agent), copied each
once more and answered its heartbeats so late that its host was declared lost, for good.

The tree's share (large results of a fan-out-2 tree, a reduce of large tensors folded in the agents)
is in ``test_tree.py``; every adverb x payload on one and two hosts in ``test_payloads.py``."""

from __future__ import annotations

import pytest
from _procs import wait_for
from payload_actors import Sink, digest, make_payload

from jupyter_mesh import ActorError, LocalJob
from jupyter_mesh._runtime.controller import Controller
from jupyter_mesh._wire import shm
from jupyter_mesh._wire.protocol import GATHER_DIRECT_MIN

pytestmark = pytest.mark.integration

MIB = 1 << 20


@pytest.fixture(scope="module")
def two_hosts():
    job = LocalJob(hosts=2)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        sink = pm.spawn("sink", Sink)
        sink.initialized.get(60)
        yield job, pm, sink
        sink.stop().get(timeout=30)
        pm.stop(timeout=5)
    finally:
        job.stop()


def _peak_rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmHWM:"))


def test_an_agent_never_holds_its_ranks_large_results(two_hosts):
    job, _, sink = two_hosts
    name = f"tensor:{96 * MIB}"
    got = sink.make.call(name).get(120)
    assert [digest(v) for v in got.values()] == [digest(make_payload(name))] * 4
    peaks = [_peak_rss_mib(pid) for pid in job.pids()]
    assert max(peaks) < 90, f"an agent's peak RSS (MiB): {peaks}; it took in 2 x 96 MiB of results"


@pytest.mark.parametrize("delta", [-64, -1, 0, 1])
@pytest.mark.parametrize("kind", ["tensor", "bytes"])
def test_results_around_the_direct_size(two_hosts, kind, delta):
    """Either side of the limit (a pickle's few bytes of framing included), out of band (a tensor) or
    in the pickle itself (bytes): every result arrives whole, whichever way it went."""
    _, _, sink = two_hosts
    name = f"{kind}:{GATHER_DIRECT_MIN + delta * (4 if kind == 'tensor' else 1)}"
    got = sink.make.call(name).get(60)
    assert [digest(v) for v in got.values()] == [digest(make_payload(name))] * 4


def test_a_rank_that_raises_among_large_results(two_hosts):
    """One rank raises while the others send 8 MiB each straight to the caller: the call fails
    naming that rank, nothing of the others' results is left in shared memory, and the mesh works."""
    _, _, sink = two_hosts
    with pytest.raises(ActorError, match="rank 2 makes nothing") as e:
        sink.make_or_raise.call(f"tensor:{8 * MIB}", 2).get(60)
    assert [dict(f.coords) for f in e.value.failures] == [{"hosts": 1, "gpus": 0}]
    assert list(sink.digest.call(1).get(30).values()) == [digest(1)] * 4
    assert wait_for(lambda: not shm.leftovers(Controller.get().transport.shm_prefix), 10)


def test_large_results_to_an_actor_that_calls(two_hosts):
    """Actor -> actor: a proc's ``call`` to the mesh gets the large results straight too."""
    _, pm, sink = two_hosts
    caller = pm.spawn("caller", Sink)  # (an actor of its own: ``sink`` is busy in no call of ours)
    seen, back = caller.slice(hosts=1, gpus=1).forward.call_one(sink, "tensor_64m", "call").get(120)
    caller.stop().get(timeout=30)
    want = digest(make_payload("tensor_64m"))
    assert seen == [want] * 4 and back == [want] * 4
