"""The fan-out tree of host agents: past the fan-out, the caller sends a cast to that many agents and
they relay it to the others, gather the replies on the way up, and fold them for ``reduce``.

Real processes: ``LocalJob(hosts=7)`` with fan-out 2 is a tree three agents deep (0 -> 2 -> 6); one
proc per host, so rank r lives on host r."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from jupyter_mesh import (
    ActorError,
    DeliveryError,
    LocalJob,
    MeshCancelledError,
    MeshError,
    MeshTimeoutError,
    MeshValueError,
    ReduceError,
    SupervisionError,
)
from jupyter_mesh._runtime import tree
from jupyter_mesh._runtime.client import current_client
from jupyter_mesh.config import configured

pytestmark = pytest.mark.integration

HOSTS, FANOUT = 7, 2
MID = 2  # host 2's agent: below agent 0, above agent 6
AGENT_FOLDS = 3  # folds of reduce functions at once per agent (JUPYTER_MESH_MAX_REDUCE_FN_FOLDS)


def _payload(kind: str):
    if kind == "none":
        return None
    if kind == "small":
        return 42
    if kind == "bytes":
        return bytes(range(256)) * 8
    import torch

    t = torch.arange(16 * 1024, dtype=torch.float32)  # 64 KiB
    if kind == "tensor":
        return t
    if kind == "large":  # 2 MiB: results this large go straight to the caller, not up the tree
        return torch.arange(512 * 1024, dtype=torch.float32)
    return {"a": [1, (2, b"x")], "t": t[:10], "s": {"deep": [None, 3.5]}}


def _same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def tree_mesh():
    from tree_actors import Echo

    with configured(fanout=FANOUT):  # handed to the procs too: their casts go through the tree
        job = LocalJob(hosts=HOSTS, env={"JUPYTER_MESH_MAX_REDUCE_FN_FOLDS": str(AGENT_FOLDS)})
        try:
            pm = job.host_mesh().spawn_procs(per_host={"gpus": 1})
            echo = pm.spawn("echo", Echo)
            echo.initialized.get(timeout=60)
            yield job, pm, echo
            pm.stop(timeout=5)
        finally:
            job.stop()


@pytest.fixture(autouse=True)
def no_rank_left_busy(request):
    """Every call through the tree ends its ranks' busy counts (progress and the views rely on them)."""
    yield
    if "tree_mesh" in request.fixturenames:
        from _procs import wait_for

        pm = request.getfixturevalue("tree_mesh")[1]
        assert wait_for(lambda: all(r.inflight == 0 for r in pm.state().ranks), 10), [
            r.inflight for r in pm.state().ranks
        ]


def _sends(fn):
    client = current_client()
    before = client.cast_sends
    out = fn()
    return out, client.cast_sends - before


def test_layout_is_a_complete_tree_of_the_fanout():
    assert tree.parents(HOSTS, 0) is None and tree.parents(HOSTS, 16) is None  # direct
    tp = tree.parents(HOSTS, FANOUT)
    assert tp == [-1, -1, 0, 0, 1, 1, 2]
    assert tree.children(tp, 0) == [2, 3] and tree.children(tp, MID) == [6]
    assert sorted(tree.subtree(tp, 0)) == [0, 2, 3, 6]
    assert all(len(tree.children(tp, i)) <= FANOUT for i in range(HOSTS))


def test_fanout_setting_is_checked():
    with configured(fanout="x"), pytest.raises(MeshValueError, match="fanout must be an integer"):
        tree.fanout()
    with configured(fanout=1), pytest.raises(MeshValueError, match=r"0 \(always direct\) or >= 2"):
        tree.fanout()
    with configured(fanout=0):
        assert tree.fanout() == 0


@pytest.mark.parametrize("payload", ["none", "small", "tensor", "bytes", "nested", "large"])
@pytest.mark.parametrize("adverb", ["call", "broadcast", "stream", "spawn", "actor"])
def test_adverbs_through_the_tree(tree_mesh, adverb, payload):
    """Every adverb reaches every rank through the tree with its payload intact, and the caller sends
    at most fan-out messages for it."""
    from tree_actors import Caller, Echo

    _, pm, echo = tree_mesh
    x = _payload(payload)
    with configured(fanout=FANOUT):
        if adverb == "call":
            vm, n = _sends(lambda: echo.echo.call(x).get(60))
            values = list(vm.values())
        elif adverb == "broadcast":
            _, n = _sends(lambda: echo.store.broadcast(x))
            values = list(echo.get_stored.call().get(60).values())  # in order after the broadcast
        elif adverb == "stream":
            futs, n = _sends(lambda: list(echo.echo.stream(x)))
            values = [f.get(60) for f in futs]
        elif adverb == "spawn":
            held, n = _sends(lambda: pm.spawn(f"held_{payload}", Echo, x))
            held.initialized.get(timeout=60)
            values = list(held.get_held.call().get(60).values())
            held.stop().get(timeout=30)
        else:  # an actor casts to the mesh: its own client sends through the tree
            caller = pm.slice(hosts=HOSTS - 1).spawn(f"caller_{payload}", Caller)
            values, n = caller.cast.call_one(echo, "call", x).get(60)
            caller.stop().get(timeout=30)
    assert len(values) == HOSTS
    assert all(_same(v, x) for v in values), values
    assert n <= FANOUT


def test_actor_streams_and_reduces_through_the_tree(tree_mesh):
    from tree_actors import Caller

    _, pm, echo = tree_mesh
    caller = pm.slice(hosts=0).spawn("caller_sr", Caller)
    streamed, n = caller.cast.call_one(echo, "stream", "hi").get(60)
    assert streamed == ["hi"] * HOSTS and n <= FANOUT
    total, n = caller.cast.call_one(echo, "sum", None).get(60)
    assert total == sum(range(HOSTS)) and n <= FANOUT
    caller.stop().get(timeout=30)


def test_direct_below_the_fanout(tree_mesh):
    echo = tree_mesh[2]
    with configured(fanout=0):
        vm, n = _sends(lambda: echo.rank.call().get(60))
    assert list(vm.values()) == list(range(HOSTS)) and n == HOSTS
    with configured(fanout=16):
        _, n = _sends(lambda: echo.rank.broadcast())
    assert n == HOSTS


@pytest.mark.parametrize("kind", ["number", "tensor", "array", "scalar", "large"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_reduce_named_ops(tree_mesh, op, kind):
    """Named ops fold as torch or numpy would, shape included (agents sent a 0-dim tensor back as 1-dim)."""
    import numpy
    import torch

    echo = tree_mesh[2]
    each = list(echo.value.call(kind).get(60).values())
    with configured(fanout=FANOUT):
        got, n = _sends(lambda: echo.value.reduce(op, kind).get(60))
    assert n <= FANOUT
    if kind == "number":
        want = {"sum": sum, "prod": lambda v: numpy.prod(v).item(), "min": min, "max": max}[op](each)
        assert got == want
        return
    lib = numpy if kind == "array" else torch
    stack = lib.stack(each)
    want = {
        "sum": stack.sum(0),
        "prod": stack.prod(0),
        "min": stack.min(0) if kind == "array" else stack.min(0)[0],
        "max": stack.max(0) if kind == "array" else stack.max(0)[0],
    }[op]
    assert type(got) is type(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got, want)
    assert lib.allclose(got, want), (got, want)


def test_reduce_with_a_function_and_its_errors(tree_mesh):
    echo = tree_mesh[2]
    with configured(fanout=FANOUT):
        assert echo.rank.reduce(lambda a, b: a if a > b else b).get(60) == HOSTS - 1

        def boom(a, b):
            raise RuntimeError("no folding today")

        with pytest.raises(ReduceError, match=r"reduce op .*boom failed in the host agent at .*no folding today") as e:
            echo.rank.reduce(boom).get(60)
        assert "boom" in e.value.op
        with pytest.raises(MeshValueError, match="unknown reduce op 'mean'"):
            echo.rank.reduce("mean")
        # the agents survived the op's error: the tree still works
        assert list(echo.rank.call().get(60).values()) == list(range(HOSTS))
        assert echo.rank.reduce("sum").get(60) == sum(range(HOSTS))


@pytest.mark.parametrize("fanout", [0, FANOUT])
@pytest.mark.parametrize(
    ("others", "odd", "named"),
    [
        ("int64", "float64", ["int64", "float64"]),  # same item size: the agents relabelled the bytes (garbage)
        ("int32", "float32", ["int32", "float32"]),
        ("float32", "numpy", ["float32 tensor", "numpy float32 array"]),
        ("int64", 1.5, ["int64 tensor", "Python float"]),
    ],
)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_refuses_values_torch_and_numpy_fold_differently(tree_mesh, op, others, odd, named, fanout):
    """Agents fold tensors with numpy, the caller with torch, and the two promote differently: tensors
    of two dtypes, a tensor with an array, or an int tensor with a float fail the reduce naming both,
    wherever it is folded (fan-out 0: the caller; 2: the agents), never a wrong number."""
    import numpy
    import torch

    echo = tree_mesh[2]
    if odd == "numpy":
        value: object = numpy.ones(4, dtype=numpy.float32)
    elif isinstance(odd, str):
        value = torch.ones(4, dtype=getattr(torch, odd))
    else:
        value = odd
    with configured(fanout=fanout), pytest.raises(ReduceError, match=r"cast|same kind") as e:
        echo.odd_one.reduce(op, HOSTS - 1, value, others).get(60)
    assert all(n in str(e.value) for n in named), str(e.value)
    assert ("the caller" in e.value.where) == (fanout == 0), e.value.where
    assert echo.rank.reduce(op).get(60) == (sum(range(HOSTS)) if op == "sum" else HOSTS - 1)


@pytest.mark.parametrize("fanout", [0, FANOUT])
@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_reduce_of_tensors_and_a_number_is_the_same_wherever_folded(tree_mesh, op, fanout):
    """A number with float tensors folds as torch would (min/max elementwise), in the agents as at the
    caller: min/max of a tensor and an int failed in the agents only."""
    import torch

    echo = tree_mesh[2]
    each = list(echo.odd_one.call(0, 3).get(60).values())  # rank 0 (the top agent's own): the int 3
    want = {"sum": lambda a, b: a + b, "min": torch.minimum, "max": torch.maximum}[op]
    expected = torch.full((4,), 3.0)
    for t in each[1:]:
        expected = want(expected, t)
    with configured(fanout=fanout):
        got = echo.odd_one.reduce(op, 0, 3).get(60)
    assert got.dtype == torch.float32 and torch.equal(got, expected), (got, expected)


def test_a_partial_the_caller_cannot_read_is_named_as_the_callers(tree_mesh):
    """A partial value that does not unpickle at the caller fails the reduce "in the caller", not in
    "the host agent at the caller"."""
    echo = tree_mesh[2]
    caller = os.getpid()

    def rebuild(v):
        if os.getpid() == caller:
            raise RuntimeError("only the agents can read this")
        return v

    class Odd:
        def __init__(self, v):
            self.v = v

        def __reduce__(self):
            return (rebuild, (self.v,))

    with configured(fanout=FANOUT), pytest.raises(ReduceError, match="failed in the caller folding") as e:
        echo.rank.reduce(lambda a, b: Odd(getattr(a, "v", a) + getattr(b, "v", b))).get(60)
    assert e.value.where == "the caller" and "does not unpickle here" in str(e.value), str(e.value)
    assert "host agent" not in str(e.value)


@pytest.mark.parametrize("fanout", [0, FANOUT])
@pytest.mark.parametrize("exc", [SystemExit, KeyboardInterrupt])
def test_reduce_function_raising_a_base_exception(tree_mesh, exc, fanout):
    """SystemExit or KeyboardInterrupt from a reduce function is its error like any other: it ended
    the agent's only fold thread (fan-out 2; every later reduce there hung) or the caller's receive
    thread (fan-out 0)."""
    echo = tree_mesh[2]

    def quit_(a, b):
        raise exc(3)

    with configured(fanout=fanout):
        with pytest.raises(ReduceError, match=rf"quit_ failed in .*{exc.__name__}"):
            echo.rank.reduce(quit_).get(30)
        assert echo.rank.reduce("sum").get(30) == sum(range(HOSTS))
        assert echo.rank.reduce(lambda a, b: a + b).get(30) == sum(range(HOSTS))


@pytest.mark.parametrize("fanout", [0, FANOUT])
def test_a_slow_reduce_function_holds_up_only_its_own_reduce(tree_mesh, tmp_path, fanout):
    """Agents folded every reduce on one thread (the caller on its receive thread): a function that
    took a minute held up every later reduce, named ops included. Now it holds up only its own."""
    echo = tree_mesh[2]
    gate = str(tmp_path / "go")

    def slow(a, b):
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return a + b

    with configured(fanout=fanout):
        held = echo.rank.reduce(slow)
        try:
            assert echo.rank.reduce("sum").get(10) == sum(range(HOSTS))
            assert echo.rank.reduce("max").get(10) == HOSTS - 1
            assert echo.rank.reduce(lambda a, b: a + b).get(10) == sum(range(HOSTS))
            assert list(echo.rank.call().get(10).values()) == list(range(HOSTS))
            assert not held.done()
        finally:
            open(gate, "w").close()
        assert held.get(30) == sum(range(HOSTS))


@pytest.mark.parametrize("fanout", [0, FANOUT])
def test_reduce_functions_that_never_return_are_bounded(tree_mesh, tmp_path, fanout):
    """Each fold of a reduce function kept a thread of its own for as long as it ran, with no bound: a
    function that never returns left one more thread in every agent (fan-out 2: agents 1 and 2 fold
    their subtrees) or in the caller (fan-out 0) per reduce, for ever. Now, past the bound, a reduce
    with a function fails at once saying where the folds still run and what to do; named ops go on;
    a timed-out, cancelled or interrupted reduce frees its caller; a fold that returns frees its slot."""
    from _procs import wait_for

    echo = tree_mesh[2]
    gate = str(tmp_path / "go")
    cap = 2 if fanout == 0 else AGENT_FOLDS

    def hang(a, b):
        deadline = time.monotonic() + 120  # (the threads end even if this test fails)
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return a + b

    def plus(a, b):
        return a + b

    with configured(fanout=fanout, max_reduce_fn_folds=cap):
        held = [echo.rank.reduce(hang) for _ in range(cap)]
        try:
            with pytest.raises(ReduceError, match=r"plus failed in ") as e:
                echo.rank.reduce(plus).get(30)
            text = str(e.value)
            where = "the caller" if fanout == 0 else "this host agent"
            assert f"{cap} folds of reduce functions are still running in {where} on host" in text, text
            assert f"max_reduce_fn_folds={cap}" in text and "never returned" in text, text
            assert "cannot be killed" in text and "JUPYTER_MESH_MAX_REDUCE_FN_FOLDS" in text, text
            if fanout == 0:
                assert e.value.where == "the caller"
            else:
                assert e.value.where.startswith("the host agent at "), e.value.where
            assert echo.rank.reduce("sum").get(30) == sum(range(HOSTS))
            # the caller of a reduce that hangs is never stuck with it
            with pytest.raises(MeshTimeoutError):
                held[0].get(timeout=0.5)
            assert held[0].cancel()
            with pytest.raises(MeshCancelledError):
                held[0].get(timeout=5)
            report: list[BaseException | None] = []
            t = threading.Thread(target=lambda: report.append(held[1]._cancel_reported()), daemon=True)
            t.start()  # as Ctrl-C in get(): cancel, and wait a moment for the ranks
            t.join(30)
            assert not t.is_alive() and held[1].cancelled(), report
            if fanout == 0:  # it said "cancelled echo.rank on 0 ranks (rank 0); all stopped"
                assert "every rank had answered already; folding their results" in str(report[0]), report
        finally:
            open(gate, "w").close()
        assert all(f.get(30) == sum(range(HOSTS)) for f in held[2:])

        def plus_works() -> bool:  # once the folds return (each in its own time), their slots are free
            try:
                return echo.rank.reduce(plus).get(30) == sum(range(HOSTS))
            except ReduceError as e:
                assert "still running" in str(e), str(e)
                return False

        assert wait_for(plus_works, 30)


def test_configure_from_the_package_as_the_readme_shows():
    """README's "Many hosts" example calls ``jupyter_mesh.configure``: it raised AttributeError."""
    import jupyter_mesh

    with configured():
        jupyter_mesh.configure(fanout=32)  # as README "### Many hosts" shows
        assert tree.fanout() == 32


def test_reduce_carries_rank_errors(tree_mesh):
    """A rank's error fails the reduce as it fails a call (naming the rank); values the op cannot
    fold fail it as a ReduceError."""
    echo = tree_mesh[2]
    with configured(fanout=FANOUT):
        with pytest.raises(ActorError, match="rank 6 refuses") as e:
            echo.fail_on.reduce("sum", 6).get(60)  # host 6: the bottom of the tree
        assert [f.coords["hosts"] for f in e.value.failures] == [6]
        with pytest.raises(ReduceError, match=r"TypeError"):
            echo.echo.reduce("sum", object).get(60)  # classes do not add up
        assert echo.fail_on.reduce("sum", -1).get(60) == HOSTS


def test_progress_cancel_and_reuse_through_the_tree(tree_mesh, tmp_path):
    """Ranks that answered show as done while the gather is still open, deep ones included; a
    cancelled call through the tree stops its ranks and the next call runs."""
    from _procs import wait_for
    from gate_actors import Gate

    _, pm, _ = tree_mesh
    gate = pm.spawn("gate", Gate)
    gate.initialized.get(timeout=60)
    opened = tmp_path / "open"
    with configured(fanout=FANOUT):
        fut = gate.wait.call(str(opened), [0, 6])  # host 0 (the top), host 6 (three agents deep)
        try:
            assert wait_for(lambda: (p := pm.state().progress) is not None and p.done == (0, 6), 30), (
                pm.state().progress
            )
        finally:
            opened.touch()
        assert list(fut.get(timeout=60).values()) == list(range(HOSTS))
        running = gate.wait.call(str(tmp_path / "never"), [])
        time.sleep(0.3)
        assert running.cancel()
        with pytest.raises(MeshCancelledError):
            running.get(timeout=5)
        assert list(gate.wait.call(str(opened), []).get(timeout=30).values()) == list(range(HOSTS))
    gate.stop().get(timeout=30)


def test_proc_dies_mid_call_at_the_bottom_of_the_tree(tmp_path):
    from _procs import descendants, wait_dead

    before = descendants(os.getpid())
    with configured(fanout=FANOUT):
        job, _, echo = _fault_mesh(tmp_path)
        try:
            pids = echo.pid.call().get(30)
            fut = echo.wait.call(str(tmp_path / "open"))
            time.sleep(0.3)
            os.kill(pids.item(hosts=HOSTS - 1, gpus=0), signal.SIGKILL)
            with pytest.raises(SupervisionError, match="SIGKILL") as e:
                fut.get(30)
            assert [f.coords["hosts"] for f in e.value.failures] == [HOSTS - 1]
            (tmp_path / "open").touch()
            assert list(echo.slice(hosts=slice(0, HOSTS - 1)).rank.call().get(30).values()) == list(range(HOSTS - 1))
        finally:
            job.stop()
    assert not wait_dead(descendants(os.getpid()) - before, 15), "the job's agents or procs outlived it"


def _fault_mesh(tmp_path, env=None):
    from tree_actors import Echo

    job = LocalJob(hosts=HOSTS, env=env)
    pm = job.host_mesh().spawn_procs(per_host={"gpus": 1})
    echo = pm.spawn("echo", Echo)
    echo.initialized.get(timeout=60)
    return job, pm, echo


@pytest.mark.parametrize("sig", ["kill", "stop"])
def test_mid_tree_agent_lost_mid_call(tmp_path, sig):
    """An agent in the middle of the tree dies (kill -9) or stalls (SIGSTOP) while a call waits: the
    call ends (no hang) naming the lost host and the ranks cut off below it, and the ranks below it
    still answer later calls (no sequence gap)."""
    from _procs import descendants, wait_dead, wait_stopped

    before = descendants(os.getpid())
    with configured(fanout=FANOUT):
        job, _, echo = _fault_mesh(tmp_path)
        try:
            gate = tmp_path / "open"
            fut = echo.wait.call(str(gate))
            time.sleep(0.3)
            agent = job.pids()[MID]
            os.kill(agent, signal.SIGKILL if sig == "kill" else signal.SIGSTOP)
            assert sig == "kill" or wait_stopped(agent, 30)
            with pytest.raises(SupervisionError) as e:
                fut.get(30)
            gate.touch()
            text = str(e.value)
            assert "host agent" in text, text
            lost = {f.kind for f in e.value.failures}
            assert "agent" in lost and "relay" in lost, text  # host 2's rank, and host 6's below it
            # the ranks below the lost agent (host 6) answer again, through a new tree without it
            below = echo.slice(hosts=slice(3, HOSTS))
            assert list(below.rank.call().get(30).values()) == [3, 4, 5, 6]
            assert below.rank.reduce("sum").get(30) == 18
        finally:
            if sig == "stop":
                try:
                    os.kill(agent, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            job.stop()
    assert not wait_dead(descendants(os.getpid()) - before, 15), "the job's agents or procs outlived it"


def test_cast_stuck_in_a_stopped_agent_leaves_no_gap(tmp_path):
    """A cast that a stopped mid-tree agent never forwards: once that agent is lost, the ranks below it
    are told (a skip of that sequence number), so their next calls run, and a stream's ranks there
    answer that the call was lost."""
    from _procs import descendants, wait_dead, wait_stopped

    before = descendants(os.getpid())
    with configured(fanout=FANOUT):
        job, _, echo = _fault_mesh(tmp_path)
        agent = job.pids()[MID]
        try:
            os.kill(agent, signal.SIGSTOP)
            # kill() returns before the stop: the thread the signal woke starts it when it next runs, and
            # meanwhile the agent's receive thread still relays (under load every rank answered)
            assert wait_stopped(agent, 30)
            echo.store.broadcast("lost?")  # stuck in agent 2 for hosts 2 and 6
            answered, errors = [], []
            for f in echo.rank.stream():
                try:
                    answered.append(f.get(30))
                except MeshError as e:
                    errors.append(str(e))
            assert sorted(answered) == [0, 1, 3, 4, 5], errors
            assert len(errors) == 2  # host 2's rank (its agent is lost), host 6's (the cast never got there)
            assert any("in the middle of the call's fan-out tree" in e for e in errors), errors
        finally:
            try:
                os.kill(agent, signal.SIGCONT)
            except ProcessLookupError:
                pass
        try:
            below = echo.slice(hosts=slice(3, HOSTS))
            assert list(below.rank.call().get(30).values()) == [3, 4, 5, 6]
        finally:
            job.stop()
    assert not wait_dead(descendants(os.getpid()) - before, 15), "the job's agents or procs outlived it"


def test_forward_that_fails_fails_its_subtree_at_once(tmp_path):
    """An agent that cannot forward a cast to an agent below it says so at once: that subtree's ranks
    fail as undelivered (naming the agent), the rest answer, and no sequence number stays held (the
    next calls run everywhere). Calls, streams and an actor's casts alike."""
    from _procs import descendants, wait_dead
    from tree_actors import Caller

    before = descendants(os.getpid())
    # agent 0 fails its next forward of a call to agent 2; agent 2 its next three to agent 6
    env = {"JUPYTER_MESH_FAIL_RELAYS": "c>2:1,c>6:3"}
    with configured(fanout=FANOUT):
        job, pm, echo = _fault_mesh(tmp_path, env)
        try:
            with pytest.raises(DeliveryError, match="could not forward it to the host agent at") as e:
                echo.rank.call().get(30)  # agent 2 never gets it: hosts 2 and 6
            assert sorted((f.kind, f.coords["hosts"]) for f in e.value.failures) == [("delivery", 2), ("delivery", 6)]
            assert str(e.value).count("could not forward") == 2, str(e.value)
            with pytest.raises(DeliveryError) as e:
                echo.rank.call().get(30)  # agent 2 got it, agent 6 did not
            assert [(f.kind, f.coords["hosts"]) for f in e.value.failures] == [("delivery", 6)]
            answered, errors = [], []
            for f in echo.rank.stream():
                try:
                    answered.append(f.get(30))
                except MeshError as err:
                    errors.append(str(err))
            assert sorted(answered) == list(range(HOSTS - 1)) and len(errors) == 1, errors
            caller = pm.slice(hosts=0).spawn("caller", Caller)
            status, (failed, text) = caller.try_call.call_one(echo, "rank").get(60)
            assert status == "err" and failed == [("delivery", 6)], text
            assert caller.try_call.call_one(echo, "rank").get(60) == ("ok", list(range(HOSTS)))
            assert list(echo.rank.call().get(30).values()) == list(range(HOSTS))
            assert echo.rank.reduce("sum").get(30) == sum(range(HOSTS))
            assert str(pm.state().ranks[HOSTS - 1].state) != "failed"  # undelivered, never a death
        finally:
            job.stop()
    assert not wait_dead(descendants(os.getpid()) - before, 15), "the job's agents or procs outlived it"


@pytest.mark.parametrize(
    ("sig", "first", "mid", "below"),
    [
        ("kill", 0, MID, [HOSTS - 1]),  # hosts 0..6: agent 2 above agent 6
        ("stop", 0, MID, [HOSTS - 1]),
        ("stop", 3, 3, [5, 6]),  # hosts 3..6: agent 3 above agents 5 and 6
    ],
)
def test_actor_cast_loses_a_mid_tree_agent(tmp_path, sig, first, mid, below):
    """An actor's call through the tree whose mid-tree agent is killed while it runs, or was stopped
    before it was sent (the cast sits there): it ends (no hang), the lost host's rank as ``agent``,
    the ranks below it as ``relay``, and the actor's next casts to the ranks below run (no sequence
    number stays held)."""
    from _procs import descendants, wait_dead
    from tree_actors import Caller

    before = descendants(os.getpid())
    with configured(fanout=FANOUT):
        job, pm, echo = _fault_mesh(tmp_path)
        agent = job.pids()[mid]
        try:
            caller = pm.slice(hosts=1).spawn("caller", Caller)  # host 1: never below the lost agent
            caller.initialized.get(timeout=60)
            target = echo.slice(hosts=slice(first, HOSTS))
            gate = tmp_path / "open"
            if sig == "stop":
                os.kill(agent, signal.SIGSTOP)
            fut = caller.try_call.call_one(target, "wait", str(gate))
            time.sleep(0.5)
            if sig == "kill":
                os.kill(agent, signal.SIGKILL)
            status, (failed, text) = fut.get(60)
            gate.touch()
            assert status == "err", text
            assert ("agent", mid) in failed and all(("relay", h) in failed for h in below), text
            assert "in the middle of the call's fan-out tree" in text, text
            rest = echo.slice(hosts=slice(mid + 1, HOSTS))
            want = list(range(mid + 1, HOSTS))
            assert caller.try_call.call_one(rest, "rank").get(60) == ("ok", want)
            assert caller.try_call.call_one(rest, "wait", str(gate)).get(60) == ("ok", want)
        finally:
            if sig == "stop":
                try:
                    os.kill(agent, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            job.stop()
    assert not wait_dead(descendants(os.getpid()) - before, 15), "the job's agents or procs outlived it"


def test_cancel_and_ctrl_c_with_a_stalled_mid_tree_agent(tmp_path, monkeypatch):
    """A call stuck in a SIGSTOPped mid-tree agent can be cancelled, and Ctrl-C in ``get`` returns at
    once; after SIGCONT the stuck casts arrive and are skipped, and the next call runs everywhere."""
    import threading

    from _procs import descendants, wait_dead

    from jupyter_mesh._runtime.controller import Controller

    # the stall must not be judged a loss here: that path is test_mid_tree_agent_lost_mid_call's
    monkeypatch.setattr(Controller.get().links, "hb_timeout", 120.0)
    before = descendants(os.getpid())
    with configured(fanout=FANOUT):
        job, _, echo = _fault_mesh(tmp_path)
        agent = job.pids()[MID]
        never = str(tmp_path / "never")
        try:
            os.kill(agent, signal.SIGSTOP)
            running = echo.wait.call(never)  # hosts 2 and 6 never get it while agent 2 is stopped
            time.sleep(0.3)
            assert running.cancel()
            with pytest.raises(MeshCancelledError):
                running.get(timeout=10)
            interrupted = echo.wait.call(never)
            timer = threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT))
            timer.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    interrupted.get(timeout=30)
            finally:
                timer.cancel()
            assert interrupted.cancelled()
        finally:
            os.kill(agent, signal.SIGCONT)
        try:
            assert list(echo.rank.call().get(30).values()) == list(range(HOSTS))
            assert echo.rank.reduce("sum").get(30) == sum(range(HOSTS))
        finally:
            job.stop()
    assert not wait_dead(descendants(os.getpid()) - before, 15), "the job's agents or procs outlived it"
