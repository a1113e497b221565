"""Every adverb carries every payload, on one host and on two: results checked bit for bit.

The matrix is adverbs {call, call_one, choose, stream, broadcast then read back, spawn args and
kwargs, actor -> actor, return values} x payloads (``payload_actors.PAYLOADS``: none, small, each side
of the 32 KiB in-band limit, 1 MiB (the shared-memory threshold), 64 MiB, arrays, bytes, bytearray,
memoryview, a non-contiguous tensor, several tensors nested in dicts and lists) x topologies {one
host, ``LocalJob(hosts=2)``}. After each test the mesh must still answer a small call: a payload
that broke the mesh (a lost sequence number, a dead relay) fails the *next* test too, loudly.
"""

from __future__ import annotations

import functools

import pytest
from payload_actors import PAYLOADS, Sink, digest, make_payload

from jupyter_mesh import LocalJob

pytestmark = pytest.mark.integration

payload_of = functools.lru_cache(maxsize=None)(make_payload)


@pytest.fixture(scope="module", params=["one_host", "two_hosts"])
def topo(request, host):
    """(proc mesh, sink actors, a second actor mesh on the same procs) per topology."""
    job = None
    if request.param == "one_host":
        pm = host.spawn_procs(per_host={"gpus": 2})
    else:
        job = LocalJob(hosts=2)
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
    sink = pm.spawn("sink", Sink)
    other = pm.spawn("other", Sink)
    sink.initialized.get(30)
    other.initialized.get(30)
    yield pm, sink, other
    pm.stop(timeout=5)
    if job is not None:
        job.stop()


def _check_alive(sink) -> None:
    """The mesh still works after the payload: no gap in sequence numbers, no dead relay."""
    assert list(sink.digest.call(1).get(30).values()) == [digest(1)] * len(sink)


def _last(sink):
    """The last rank (on the second host when there are two)."""
    return sink.slice(**{d: n - 1 for d, n in sink.sizes.items()})


@pytest.mark.parametrize("name", PAYLOADS)
def test_call_and_gathered_return_values(topo, name):
    _, sink, _ = topo
    x = payload_of(name)
    assert list(sink.digest.call(x).get(60).values()) == [digest(x)] * len(sink)
    assert [digest(v) for v in sink.echo.call(x).get(60).values()] == [digest(x)] * len(sink)
    _check_alive(sink)


@pytest.mark.parametrize("name", PAYLOADS)
def test_call_one_and_return_value(topo, name):
    _, sink, _ = topo
    x = payload_of(name)
    one = _last(sink)
    assert one.digest.call_one(x).get(60) == digest(x)
    assert digest(one.echo.call_one(x).get(60)) == digest(x)
    assert digest(one.make.call_one(name).get(60)) == digest(x)  # made remotely, pickled there
    _check_alive(sink)


@pytest.mark.parametrize("name", PAYLOADS)
def test_choose(topo, name):
    _, sink, _ = topo
    x = payload_of(name)
    assert sink.digest.choose(x).get(60) == digest(x)
    assert digest(sink.echo.choose(x).get(60)) == digest(x)
    _check_alive(sink)


@pytest.mark.parametrize("name", PAYLOADS)
def test_stream(topo, name):
    _, sink, _ = topo
    x = payload_of(name)
    assert [f.get(60) for f in sink.digest.stream(x)] == [digest(x)] * len(sink)
    assert [digest(f.get(60)) for f in sink.echo.stream(x)] == [digest(x)] * len(sink)
    _check_alive(sink)


@pytest.mark.parametrize("name", PAYLOADS)
def test_broadcast_then_read_back(topo, name):
    _, sink, _ = topo
    x = payload_of(name)
    sink.store.broadcast(x)
    # messages from one sender to one actor run in order: the read sees what was broadcast
    assert list(sink.last_digest.call().get(60).values()) == [digest(x)] * len(sink)
    _check_alive(sink)


@pytest.mark.parametrize("name", PAYLOADS)
def test_spawn_args_and_kwargs(topo, name):
    pm, sink, _ = topo
    x = payload_of(name)
    spawned = pm.spawn(f"s_{name}", Sink, x, kw=x)
    assert list(spawned.init_digests.call().get(60).values()) == [(digest(x), digest(x))] * len(sink)
    _check_alive(sink)


@pytest.mark.parametrize("how", ["call_one", "call"])
@pytest.mark.parametrize("name", PAYLOADS)
def test_actor_to_actor(topo, name, how):
    _, sink, other = topo
    x = payload_of(name)
    first = sink.slice(**{d: 0 for d in sink.sizes})
    target = _last(other) if how == "call_one" else other
    seen, back = first.forward.call_one(target, name, how).get(120)
    if how == "call_one":
        assert (seen, back) == (digest(x), digest(x))
    else:
        assert seen == [digest(x)] * len(other) and back == [digest(x)] * len(other)
    _check_alive(sink)


@pytest.mark.parametrize("kind", ["file", "socket"])
def test_open_files_and_sockets_are_refused_with_a_clear_error(topo, tmp_path, kind):
    """cloudpickle would send an open file's content (and fail on a socket deep inside): refused, named."""
    import socket

    from jupyter_mesh import SerializationError

    _, sink, _ = topo
    obj = open(tmp_path / "f.txt", "w") if kind == "file" else socket.socket()
    try:
        with pytest.raises(SerializationError, match=r"(?s)positional argument 0.*belong to this process"):
            sink.digest.call({"handle": obj}).get(10)
        with pytest.raises(SerializationError, match="belong to this process"):
            sink.slice(**{d: 0 for d in sink.sizes}).digest.call_one(obj).get(10)
    finally:
        obj.close()
    _check_alive(sink)
