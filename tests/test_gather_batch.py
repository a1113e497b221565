"""The controller's per-call work is batched per gathered reply, not per rank (issue #14): one busy/idle
event per batch, one decode pass per table, whole-mesh sequence numbers in one step. No processes:
a real ``Client`` and ``StateTracker`` on a transport that sends nothing, fed the tables agents send."""

from __future__ import annotations

from typing import Any

import pytest
from _no_io import Actors, gathered, no_io_mesh

from jupyter_mesh import ActorError, ProcState, SupervisionError
from jupyter_mesh._core.state import StateTracker
from jupyter_mesh._runtime.client import Client
from jupyter_mesh._wire.protocol import BROKEN, OK, RAISED
from jupyter_mesh.errors import Failure


def _mesh(hosts: int = 2, per_host: int = 4) -> tuple[Client, StateTracker, Actors, list[Any]]:
    client, state, mesh = no_io_mesh(hosts, per_host)
    events: list[Any] = []
    state.subscribe(events.append)
    return client, state, mesh, events


def _call(client: Client, mesh: Actors) -> tuple[Any, int]:
    fut = client.cast(mesh, "step", (), {}, "call")  # type: ignore[arg-type]
    return fut, next(reversed(client.calls.pending))


def _error(rank: int) -> dict[str, Any]:
    return {"type": "ValueError", "msg": f"bad rank {rank}", "tb": "Traceback ...\nValueError\n", "endpoint": "step"}


def test_a_call_is_one_busy_event_and_one_idle_event_per_gathered_reply():
    client, state, mesh, events = _mesh(hosts=2, per_host=4)
    fut, call_id = _call(client, mesh)
    calls = [e for e in events if e.kind == "calls"]
    assert [(e.state, e.previous, e.ranks) for e in calls] == [(ProcState.BUSY, ProcState.IDLE, tuple(range(8)))]
    assert not [e for e in events if e.kind == "state"]  # no per-rank event on the call path
    snap = state.snapshot("m-0")
    assert snap.counts()["busy"] == 8 and snap.progress is not None and len(snap.progress.left) == 8
    client.on_reply(gathered(call_id, [(r, OK, r * 10) for r in range(4)]))
    snap = state.snapshot("m-0")
    assert [r.state for r in snap.ranks] == [ProcState.IDLE] * 4 + [ProcState.BUSY] * 4
    assert snap.progress is not None and snap.progress.done == (0, 1, 2, 3) and snap.progress.left == (4, 5, 6, 7)
    assert not fut.done()
    client.on_reply(gathered(call_id, [(r, OK, r * 10) for r in range(4, 8)]))
    assert fut.get(timeout=0).values() is not None and list(fut.get(timeout=0).values()) == [r * 10 for r in range(8)]
    calls = [e for e in events if e.kind == "calls"]
    assert [e.ranks for e in calls[1:]] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert all(e.state == ProcState.IDLE for e in calls[1:])
    assert state.snapshot("m-0").progress is None and state.snapshot("m-0").counts()["idle"] == 8


def test_overlapping_calls_keep_ranks_busy_until_the_last_one_ends():
    client, state, mesh, events = _mesh(hosts=1, per_host=4)
    fut1, id1 = _call(client, mesh)
    fut2, id2 = _call(client, mesh)
    assert [r.inflight for r in state.snapshot("m-0").ranks] == [2] * 4
    assert len([e for e in events if e.kind == "calls"]) == 1  # the second call moved no rank
    client.on_reply(gathered(id1, [(r, OK, None) for r in range(4)]))
    assert all(r.state == ProcState.BUSY for r in state.snapshot("m-0").ranks)
    client.on_reply(gathered(id2, [(r, OK, None) for r in range(4)]))
    assert all(r.state == ProcState.IDLE and r.inflight == 0 for r in state.snapshot("m-0").ranks)
    assert list(fut1.get(timeout=0).values()) == [None] * 4 == list(fut2.get(timeout=0).values())


def test_a_paused_rank_stays_paused_through_its_calls():
    client, state, mesh, _ = _mesh(hosts=1, per_host=2)
    state.paused("m-0", 1, "train.py:12")
    fut, call_id = _call(client, mesh)
    client.on_reply(gathered(call_id, [(0, OK, 1), (1, OK, 2)]))
    assert [r.state for r in state.snapshot("m-0").ranks] == [ProcState.IDLE, ProcState.PAUSED]
    state.resumed("m-0", 1)
    assert state.snapshot("m-0").ranks[1].state == ProcState.IDLE
    assert list(fut.get(timeout=0).values()) == [1, 2]


def test_per_rank_errors_in_a_gathered_table_name_each_rank():
    client, _, mesh, _ = _mesh(hosts=2, per_host=2)
    fut, call_id = _call(client, mesh)
    client.on_reply(gathered(call_id, [(0, OK, 0), (1, RAISED, _error(1))]))
    client.on_reply(gathered(call_id, [(2, RAISED, _error(2)), (3, OK, 3)]))
    with pytest.raises(ActorError) as ei:
        fut.get(timeout=0)
    assert [dict(f.coords) for f in ei.value.failures] == [{"hosts": 0, "gpus": 1}, {"hosts": 1, "gpus": 0}]
    assert [f.message for f in ei.value.failures] == ["bad rank 1", "bad rank 2"]
    assert "failed on 2 of 4 ranks" in str(ei.value)


def test_a_result_that_does_not_unpickle_is_that_ranks_error():
    client, _, mesh, _ = _mesh(hosts=1, per_host=3)
    fut, call_id = _call(client, mesh)
    client.on_reply(gathered(call_id, [(0, OK, 0), (1, OK, b"\x80\x05not a pickle"), (2, OK, 2)]))
    with pytest.raises(ActorError) as ei:
        fut.get(timeout=0)
    (failure,) = ei.value.failures
    assert dict(failure.coords) == {"hosts": 0, "gpus": 1} and "does not unpickle here" in str(ei.value)


def test_a_returned_failure_is_a_value_and_a_broken_rank_fails_the_call():
    client, _, mesh, _ = _mesh(hosts=1, per_host=2)
    seen = Failure("other", {"gpus": 0}, "signal", "killed", signal=9)
    fut, call_id = _call(client, mesh)
    client.on_reply(gathered(call_id, [(0, OK, seen), (1, OK, "fine")]))
    vm = fut.get(timeout=0)
    assert isinstance(vm.get(0), Failure) and vm.get(0).detail == "killed" and vm.get(1) == "fine"
    fut, call_id = _call(client, mesh)
    dead = Failure("m", {"hosts": 0, "gpus": 1}, "signal", "killed by SIGKILL", signal=9)
    client.on_reply(gathered(call_id, [(0, OK, 0), (1, BROKEN, dead)]))
    with pytest.raises(SupervisionError, match="SIGKILL"):
        fut.get(timeout=0)


def test_a_rank_answered_twice_counts_once():
    """A duplicate table (a repaired tree, a bug in an agent) must not end a rank's other calls."""
    client, state, mesh, _ = _mesh(hosts=1, per_host=2)
    fut1, id1 = _call(client, mesh)
    fut2, id2 = _call(client, mesh)
    client.on_reply(gathered(id1, [(0, OK, "a")]))
    client.on_reply(gathered(id1, [(0, OK, "again"), (1, OK, "b")]))
    client.on_reply(gathered(id1, [(1, OK, "b again")]))
    assert list(fut1.get(timeout=0).values()) == ["a", "b"]
    assert [r.inflight for r in state.snapshot("m-0").ranks] == [1, 1]  # call 2 still holds them
    client.on_reply(gathered(id2, [(0, OK, 0), (0, OK, 0), (1, OK, 1)]))
    assert list(fut2.get(timeout=0).values()) == [0, 1]
    assert [r.inflight for r in state.snapshot("m-0").ranks] == [0, 0]


def test_equal_results_share_only_immutable_values():
    client, _, mesh, _ = _mesh(hosts=1, per_host=3)
    fut, call_id = _call(client, mesh)
    client.on_reply(gathered(call_id, [(r, OK, [1, 2]) for r in range(3)]))
    lists = list(fut.get(timeout=0).values())
    lists[0].append(3)
    assert lists[1] == [1, 2] and lists[0] is not lists[1]
    fut, call_id = _call(client, mesh)
    client.on_reply(gathered(call_id, [(r, OK, "same") for r in range(3)]))
    assert list(fut.get(timeout=0).values()) == ["same"] * 3


def test_sequence_numbers_of_whole_mesh_and_sliced_casts():
    client, _, mesh, _ = _mesh(hosts=2, per_host=2)
    headers = client.transport.sent  # type: ignore[attr-defined]
    seqs = []

    def cast(m: Actors) -> None:
        before = len(headers)
        client.cast(m, "step", (), {}, "broadcast")  # type: ignore[arg-type]
        assert len(headers) > before
        seqs.append(client.calls.seq["a-0"][:])

    cast(mesh)
    cast(Actors(mesh._ref, mesh._ref.shape.select(hosts=1)))
    cast(mesh)
    assert seqs == [[1, 1, 1, 1], [1, 1, 2, 2], [2, 2, 3, 3]]
    client._unseq(mesh, [0, 1, 2, 3])  # type: ignore[arg-type]
    assert client.calls.seq["a-0"] == [1, 1, 2, 2]
