"""What a ported Monarch program relies on beyond the names (issue #17): stop() is a Future, a ProcMesh
travels to actors, this_host() has no dims, an actor is numbered in the slice a call went to and in the
view of the procs it was spawned on, actor failures reach the fault hook, an error no caller
receives ends the actor, remote exception chains survive, stopped meshes raise SupervisionError, and
a stopped proc finalizes. Real procs throughout; the kernel's own defaults are in test_kernel.py."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import textwrap

import pytest
from _procs import wait_dead, wait_for
from monarch_actors import Args, Boom, CleansUp, Finalizes, Loader, Nested, Owner, Parent, Ranks, Trainer, Where

from jupyter_mesh import ActorError, Future, LocalJob, MeshClosedError, ProcState, SupervisionError, lowlevel, send
from jupyter_mesh._core.signatures import Signatures
from jupyter_mesh._runtime.hooks import drain_fault_hooks
from jupyter_mesh.errors import MeshFailure

pytestmark = pytest.mark.integration
HERE = os.path.dirname(os.path.abspath(__file__))


def _new_faults(recorded_faults, start):
    return [f for f in recorded_faults[start:] if isinstance(f, MeshFailure)]


# -- 1. stop() is a Future ----------------------------------------------------------------------------
def test_stop_returns_a_future_for_every_mesh(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    pids = set(pm.pids().values())
    stopping = pm.stop()
    assert isinstance(stopping, Future) and stopping.get(timeout=1) is None  # Monarch's last line
    assert not wait_dead(pids, 5)

    async def monarch_main():
        pm = host.spawn_procs(per_host={"gpus": 1})
        await pm.stop()  # Monarch's other last line
        async with host.spawn_procs(per_host={"gpus": 1}) as pm2:
            assert pm2.spawn("b", Boom).ok.call_one().get(timeout=20) == "ok"
        return pm, pm2

    pm, pm2 = asyncio.run(monarch_main())
    assert pm.stopped and pm2.stopped

    # ActorMesh.stop(): those actors answer as stopped; the procs and their other actors live on
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        a, b = pm.spawn("a", Boom), pm.spawn("b", Boom)
        assert a.stop().get(timeout=10) is None
        with pytest.raises(SupervisionError, match="actor mesh 'a' was stopped") as ei:
            a.ok.call().get(timeout=10)
        assert {f.kind for f in ei.value.failures} == {"stopped"}
        assert list(b.ok.call().get(timeout=10).values()) == ["ok", "ok"]
    finally:
        pm.stop()


def test_host_mesh_stop_and_shutdown_are_futures():
    job = LocalJob(1)
    hm = job.host_mesh()
    pm = hm.spawn_procs(per_host={"gpus": 1})
    a = pm.spawn("a", Boom)
    assert a.ok.call_one().get(timeout=20) == "ok"
    assert hm.stop().get(timeout=1) is None  # its proc meshes stop; its agent stays for new ones
    assert pm.stopped
    pm2 = hm.spawn_procs(per_host={"gpus": 1})
    assert pm2.spawn("a", Boom).ok.call_one().get(timeout=20) == "ok"
    assert hm.shutdown().get(timeout=1) is None  # and now the agent goes too
    assert pm2.stopped and not job.running()
    assert not wait_dead(job.pids(), 5)


# -- 2. a ProcMesh travels to actors ------------------------------------------------------------------
def test_an_actor_given_a_proc_mesh_spawns_on_it_and_supervises_it(host, recorded_faults):
    """Monarch's __supervise__ pattern: the owner spawns its own actors on a proc mesh it was given;
    their failures reach its __supervise__, not this program's fault hook."""
    start = len(recorded_faults)
    pm, pm2 = host.spawn_procs(per_host={"gpus": 1}), host.spawn_procs(per_host={"gpus": 1})
    try:
        assert pickle.loads(pickle.dumps(pm2)).sizes == {"gpus": 1}  # no "cannot pickle '_hashlib.HMAC'"
        owner = pm.spawn("owner", Owner, pm2).slice(gpus=0)
        assert owner.child_ok.call_one().get(timeout=30) == ["ok"]
        # stopping or killing the procs stays with the program that spawned them
        refused = owner.try_to.call_one("stop").get(timeout=10)
        assert refused.startswith("MeshValueError: cannot stop proc mesh") and "passed in" in refused
        # the child actor dies (an error under broadcast): its owner hears of it
        owner.break_child.call_one().get(timeout=10)
        seen = wait_for(lambda: owner.seen_failures.call_one().get(timeout=5), 10)
        assert seen == ["died:child:[gpus=0] The actor monarch_actors.Boom child{'gpus': 0/1} and all its "
                        "descendants have failed: child.fail raised ValueError: this is a test exception under "
                        "broadcast(), where no caller can receive it, so the actor died"]  # fmt: skip
        # the child's proc dies: its owner hears of that too
        os.kill(pm2.pids()[0], signal.SIGKILL)
        seen = wait_for(lambda: len(owner.seen_failures.call_one().get(timeout=5)) == 2, 10)
        assert seen and owner.seen_failures.call_one().get(timeout=5)[1].startswith("signal:child:")  # its actor mesh
        assert drain_fault_hooks() and _new_faults(recorded_faults, start) == []  # handled where it belongs
    finally:
        pm.stop()
        pm2.stop()


# -- 3. this_host() has no dims; ranks print as Monarch's ---------------------------------------------
def test_this_host_has_no_dims_and_ranks_print_as_in_monarch(host):
    assert host.sizes == {}
    pm = host.spawn_procs(per_host={"gpus": 2})
    try:
        assert pm.sizes == {"gpus": 2}
        vm = pm.spawn("r", Ranks).rank.call().get(timeout=20)
        assert vm.item(gpus=1) == ("{'gpus': 1/2}", {"gpus": 1}, "1", "2")
    finally:
        pm.stop()
    pm = host.spawn_procs(per_host={"hosts": 1, "gpus": 2})  # Monarch's test_rank_string
    try:
        vm = pm.spawn("r", Ranks).rank.call().get(timeout=20)
        assert vm.item(hosts=0, gpus=0)[0] == "{'hosts': 0/1, 'gpus': 0/2}"
        assert vm.item(hosts=0, gpus=1)[0] == "{'hosts': 0/1, 'gpus': 1/2}"
        assert vm.item(hosts=0, gpus=1)[2:] == ("1", "2")  # a dim of per_host: local ranks count it
    finally:
        pm.stop()


# -- 3b. an actor is numbered as in Monarch: during a call, in the view the call was sent to -------------
def _seen(vm, *keys):
    return [tuple(v[k] for k in keys) for v in vm.values()]


def test_a_call_to_a_slice_numbers_its_actors_in_the_slice(host):
    """Monarch's current_rank(), current_size() and message_rank are the actor's point in the mesh or
    slice a call went to; actor_instance.rank stays its own point. So getting_started's
    ``loaders.slice(**actor_instance.rank)`` reaches the trainer's own loader. Our output prefixes and
    errors still name the proc by its coordinates in the whole proc mesh."""
    pm = host.spawn_procs(per_host={"hosts": 2, "gpus": 2})
    try:
        w = pm.spawn("w", Where)
        full = w.where.call().get(timeout=30)
        both = {"hosts": 1, "gpus": 0}
        assert full.item(**both) == {"rank": both, "index": 2, "size": {"hosts": 2, "gpus": 2}, "message": both,
                                     "own": both}  # fmt: skip
        assert _seen(w.slice(gpus=1).where.call().get(timeout=30), "rank", "index", "size", "message", "own") == [
            ({"hosts": 0}, 0, {"hosts": 2}, {"hosts": 0}, {"hosts": 0, "gpus": 1}),
            ({"hosts": 1}, 1, {"hosts": 2}, {"hosts": 1}, {"hosts": 1, "gpus": 1}),
        ]
        assert _seen(w.slice(hosts=slice(1, 2)).awhere.call().get(timeout=30), "rank", "index", "size", "own") == [
            ({"hosts": 0, "gpus": 0}, 0, {"hosts": 1, "gpus": 2}, {"hosts": 1, "gpus": 0}),
            ({"hosts": 0, "gpus": 1}, 1, {"hosts": 1, "gpus": 2}, {"hosts": 1, "gpus": 1}),
        ]
        one = w.slice(hosts=1, gpus=0).where.call_one().get(timeout=30)  # a point: no dims
        assert (one["rank"], one["index"], one["size"], one["message"], one["own"]) == ({}, 0, {}, {}, both)
        kept = w.slice(hosts=slice(1, 2), gpus=slice(0, 1)).where.call_one().get(timeout=30)
        assert (kept["rank"], kept["size"], kept["own"]) == ({"hosts": 0, "gpus": 0}, {"hosts": 1, "gpus": 1}, both)
        for _ in range(2):  # choose: the chosen actor's point in the slice
            chosen = w.slice(gpus=1).where.choose().get(timeout=30)
            assert chosen["rank"] == {"hosts": chosen["own"]["hosts"]} and chosen["size"] == {"hosts": 2}
        assert sorted(f.get(timeout=30)["index"] for f in w.slice(gpus=1).where.stream()) == [0, 1]
        assert w.rename(gpus="g").where.call().get(timeout=30).item(hosts=1, g=1)["rank"] == {"hosts": 1, "g": 1}
        assert _seen(w.flatten("x").where.call().get(timeout=30), "rank") == [({"x": i},) for i in range(4)]
        # Monarch's getting_started: each trainer slices the loaders by its own rank and gets its own
        trainers = pm.spawn("trainers", Trainer, pm.spawn("loaders", Loader))
        for own, data in trainers.step.call().get(timeout=60).values():
            assert data == f"data of {own}"
        # ours: output prefixes and errors still say which proc, in the whole mesh
        marker = f"[{pm.name} hosts=1,gpus=1] where 1"
        assert wait_for(lambda: marker in pm.logs(), 10), pm.logs()
        with pytest.raises(ActorError) as ei:
            w.slice(gpus=1).fail.call().get(timeout=30)
        text = str(ei.value)
        assert "failed on 2 of 2 ranks [hosts=0,gpus=1; hosts=1,gpus=1]" in text and "at {'hosts': 0}" in text, text
    finally:
        pm.stop()


def test_actors_spawned_on_a_view_of_the_procs_are_numbered_in_it(host):
    """Monarch's: actors spawned on a sliced, flattened or renamed proc mesh are numbered in that view,
    from __init__ on (``current_rank()["rank"]`` after ``flatten("rank")``), and a proc respawned under
    them gets its actor back at the same point."""
    pm = host.spawn_procs(per_host={"hosts": 2, "gpus": 2})
    try:
        flat = pm.flatten("rank").spawn("flat", Where)
        assert _seen(flat.init.call().get(timeout=30), "rank", "size", "own", "message") == [
            ({"rank": i}, {"rank": 4}, {"rank": i}, {"rank": i}) for i in range(4)
        ]
        assert _seen(flat.slice(rank=slice(2, 4)).where.call().get(timeout=30), "rank", "size", "own") == [
            ({"rank": 0}, {"rank": 2}, {"rank": 2}),
            ({"rank": 1}, {"rank": 2}, {"rank": 3}),
        ]
        part = pm.slice(gpus=1).spawn("part", Where)
        assert _seen(part.init.call().get(timeout=30), "rank", "size") == [
            ({"hosts": 0}, {"hosts": 2}),
            ({"hosts": 1}, {"hosts": 2}),
        ]
        assert _seen(part.where.call().get(timeout=30), "rank") == [({"hosts": 0},), ({"hosts": 1},)]
        renamed = pm.slice(hosts=slice(1, 2)).rename(gpus="g").spawn("renamed", Where)
        assert _seen(renamed.where.call().get(timeout=30), "rank", "size") == [
            ({"hosts": 0, "g": 0}, {"hosts": 1, "g": 2}),
            ({"hosts": 0, "g": 1}, {"hosts": 1, "g": 2}),
        ]
        pm.kill({"hosts": 1, "gpus": 1}, signal.SIGKILL)
        assert wait_for(lambda: pm.state().ranks[3].state == ProcState.FAILED, 10)
        assert pm.respawn() == [3]
        assert flat.init.call().get(timeout=60).item(rank=3)["rank"] == {"rank": 3}
        assert part.init.call().get(timeout=60).item(hosts=1)["rank"] == {"hosts": 1}
        assert renamed.where.call().get(timeout=60).item(hosts=0, g=1)["own"] == {"hosts": 0, "g": 1}
    finally:
        pm.stop()


# -- 4. a failed __init__ reaches the fault hook -------------------------------------------------------
def test_init_failure_reaches_the_fault_hook(procs, recorded_faults):
    start = len(recorded_faults)
    bad = procs.spawn("exception_actor", Boom, True)
    bad.ok.broadcast()  # no call waits: only the hook can tell
    faults = wait_for(lambda: len(_new_faults(recorded_faults, start)) >= 4, 10) and _new_faults(recorded_faults, start)
    assert len(faults) == 4 and all(isinstance(f, SupervisionError) for f in faults)  # Monarch: one per rank
    for f in faults:
        assert f.mesh_name == "exception_actor" and "this is an exception from __init__" in str(f)
        assert f.failures[0].kind == "init" and len(f.crashed_ranks) == 1 == len(f.crashed_coords)
    assert (
        sorted(f.crashed_coords[0]["gpus"] for f in faults)
        == [0, 1, 2, 3]
        == sorted(f.crashed_ranks[0] for f in faults)
    )


_FAILED_INIT_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from monarch_actors import Boom
    from jupyter_mesh import this_host

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    actors = procs.spawn("exception_actor", Boom, True)
    actors.ok.broadcast()
    procs.stop().get()
    print("REACHED THE END", flush=True)
    """
)


def test_a_failed_init_with_only_broadcasts_fails_the_script(tmp_path):
    """The README promises: an unhandled failure makes a script exit 1 (Monarch's hook: sys.exit(1))."""
    script = tmp_path / "failed_init.py"
    script.write_text(_FAILED_INIT_SCRIPT)
    out = subprocess.run([sys.executable, str(script), HERE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, (out.stdout, out.stderr[-3000:])
    assert "this is an exception from __init__" in out.stderr


# -- 5. an exception under broadcast() ends the actor, and is reported -----------------------------------
def test_broadcast_exception_ends_the_actor_and_reaches_the_hook(procs, recorded_faults, tmp_path):
    start = len(recorded_faults)
    a, other = procs.spawn("exception_actor", Boom), procs.spawn("other", Boom)
    a.fail.broadcast()
    faults = wait_for(lambda: len(_new_faults(recorded_faults, start)) >= 4, 10) and _new_faults(recorded_faults, start)
    assert len(faults) == 4
    assert all(f.failures[0].kind == "died" and "this is a test exception" in str(f) for f in faults)
    assert "raise ValueError" in faults[0].report()  # the remote traceback comes with it
    with pytest.raises(SupervisionError, match="this is a test exception"):
        a.ok.call().get(timeout=10)  # the actor is gone
    assert list(other.ok.call().get(timeout=10).values()) == ["ok"] * 4  # its procs are not
    # an actor that dies runs __cleanup__ with an Exception saying why (Monarch's), its error the cause
    path = tmp_path / "cleanup.log"
    c = procs.spawn("cleans_up", CleansUp, str(path))
    c.slice(gpus=0).fail.broadcast()
    with pytest.raises(SupervisionError, match="simulated actor failure"):
        c.slice(gpus=1).die.call_one().get(timeout=10)  # from an async endpoint: after its loop ends
    assert c.slice(gpus=2).abort.call_one().get(timeout=10) == "aborted"
    assert wait_for(lambda: path.exists() and len(path.read_text().splitlines()) == 3, 10), path.read_text()
    lines = sorted(path.read_text().splitlines())
    assert lines[0].startswith("0 Exception(ValueError): [gpus=0] The actor monarch_actors.CleansUp cleans_up")
    assert lines[0].endswith("cleans_up.fail raised ValueError: this is a test exception under broadcast(), "
                             "where no caller can receive it, so the actor died")  # fmt: skip
    assert lines[1].startswith("1 Exception(Dies): ") and "Dies: simulated actor failure" in lines[1]
    assert lines[2].startswith("2 Exception(NoneType): ") and lines[2].endswith("aborted: enough")


def test_broadcast_exception_leaves_the_actor_alive_where_asked(procs, recorded_faults):
    """The kernel's way (``survive``): reported, and the actor lives on."""
    prev = lowlevel.set_actor_errors("survive")
    try:
        a = procs.spawn("survivor", Boom)
    finally:
        lowlevel.set_actor_errors(prev)
    start = len(recorded_faults)
    a.fail.broadcast()
    faults = wait_for(lambda: len(_new_faults(recorded_faults, start)) >= 4, 10) and _new_faults(recorded_faults, start)
    assert {f.failures[0].kind for f in faults} == {"broadcast"} and len(faults) == 4
    assert list(a.ok.call().get(timeout=10).values()) == ["ok"] * 4


def test_wrong_arguments_raise_type_error_at_the_call_site_and_the_actors_live(procs, recorded_faults):
    """Monarch binds a call's arguments in the caller: a wrong call raises ``TypeError`` where it was
    written, by every adverb. Sent, it failed on every rank, and under broadcast() killed the mesh."""
    start = len(recorded_faults)
    a = procs.spawn("args", Args)
    one = a.slice(gpus=0)
    wrong = {
        "call": lambda: a.f.call(),
        "call_one": lambda: one.f.call_one(1, z=2),
        "choose": lambda: a.f.choose(1, 2),
        "stream": lambda: a.f.stream(y=1),
        "broadcast": lambda: a.f.broadcast(1, 2, 3),
        "reduce": lambda: a.f.reduce("sum", 1, 2),
        "send": lambda: send(a.f, (1, 2, 3)),
        "send choose": lambda: send(a.f, (), selection="choose"),
    }
    for adverb, bad in wrong.items():
        with pytest.raises(TypeError) as e:
            bad()
        assert str(e.value).startswith("Args.f(x: int, *, y: int = 0): "), (adverb, str(e.value))
        assert "nothing was sent" in str(e.value), adverb
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        a.f.call()
    # what each endpoint accepts is not refused: *args, the port the runtime passes, a decorator's wrapper
    assert one.f.call_one(1, y=2).get(timeout=20) == 3
    assert one.anything.call_one(1, 2, k=3).get(timeout=20) == 3
    assert one.via_port.call_one(7).get(timeout=20) == 7
    assert one.wrapped.call_one(5).get(timeout=20) == 6
    with pytest.raises(TypeError, match=r"Args.via_port\(x: int\): too many positional"):
        one.via_port.call_one(1, 2)
    # an actor calling a mesh passed to it checks there too; a good call still goes through
    caller = procs.spawn("caller", Args).slice(gpus=1)
    said = caller.call_other.call_one(a, (1,), {"z": 1}).get(timeout=20)
    assert said.startswith("TypeError: Args.f(x: int, *, y: int = 0): got an unexpected keyword argument 'z'"), said
    assert caller.call_other.call_one(a, (1,), {}).get(timeout=20) == "[1, 1, 1, 1]"
    assert list(a.f.call(1, y=1).get(timeout=20).values()) == [2] * 4  # every actor lives
    assert drain_fault_hooks() and _new_faults(recorded_faults, start) == []
    # parameter lists arrive pickled with a mesh: one that is not a list of identifiers is not used
    forged = Signatures("X", {"f": ("()", (("x):\n    import os  #", 1, False),)), "g": ("()", (("x", 9, False),))})
    assert forged.checker("f") is None and forged.checker("g") is None
    # nor one of another shape (another version's, or forged): the calls go out unchecked, not failing here
    malformed = [("()", 5), 7, ("()",), ("()", ((b"x", 1, False),)), ("()", ((3, 1, False),)), ("()", (("x", 1.0, 0),))]
    odd = Signatures("X", {f"m{i}": spec for i, spec in enumerate(malformed)})
    assert [odd.checker(f"m{i}") for i in range(len(malformed))] == [None] * len(malformed)


# -- 6. a BaseException ends the actor ---------------------------------------------------------------
def test_base_exception_ends_the_actor_with_a_supervision_error(procs, recorded_faults):
    start = len(recorded_faults)
    a = procs.spawn("error", Boom).slice(gpus=0)
    with pytest.raises(SupervisionError, match="Dies: simulated actor failure"):
        a.die.call_one().get(timeout=10)
    with pytest.raises(RuntimeError, match="simulated actor failure"):  # Monarch's tests catch it so
        a.ok.call_one().get(timeout=10)
    b = procs.spawn("exits", Boom).slice(gpus=1)
    with pytest.raises(SupervisionError, match="SystemExit"):
        b.exit.call_one().get(timeout=10)
    assert drain_fault_hooks() and _new_faults(recorded_faults, start) == []  # the callers were told
    # our own cancellation is no BaseException of the user's: the actor lives on
    c = procs.spawn("cancelled", Boom).slice(gpus=2)
    fut = c.nap.call_one(60)
    assert wait_for(lambda: procs.state().ranks[2].state == "busy", 10)
    fut.cancel()
    assert c.ok.call_one().get(timeout=10) == "ok"
    # and where the spawn asked to survive (the kernel), a BaseException is the caller's ActorError
    prev = lowlevel.set_actor_errors("survive")
    try:
        d = procs.spawn("survives", Boom).slice(gpus=3)
    finally:
        lowlevel.set_actor_errors(prev)
    with pytest.raises(ActorError, match="simulated actor failure"):
        d.die.call_one().get(timeout=10)
    assert d.ok.call_one().get(timeout=10) == "ok"


def test_supervision_errors_use_monarchs_phrases_and_still_say_where_and_what_to_do(host, recorded_faults):
    """Monarch programs match its wording ("Endpoint call a.b() failed, The actor ... and all its
    descendants have failed"); ours leads with it, then the ranks, the cause and what to do."""
    pm = host.spawn_procs(per_host={"gpus": 2})
    a = pm.spawn("error", Boom)
    first = r"Endpoint call error\.die\(\) failed, The actor Boom 'error' and all its descendants have failed: "
    with pytest.raises(SupervisionError, match=first + r"1 rank\(s\) of mesh '.*':\n  \[gpus=0\] .*Dies") as ei:
        a.slice(gpus=0).die.call_one().get(timeout=10)
    assert "What to do:" in str(ei.value) and "simulated actor failure" in str(ei.value)
    with pytest.raises(ActorError, match=r"this is a test exception\n  Actor call error\.fail failed on \[gpus=1\]"):
        a.slice(gpus=1).fail.call_one().get(timeout=10)  # an endpoint's error: Monarch's "Actor call a.b failed"
    with pytest.raises(RuntimeError, match=r"Endpoint call error\.ok\(\) failed, The actor .* and all its descendants"):
        a.ok.call().get(timeout=10)  # later calls: the same, naming the call they are
    # the fault hook names the ended actor as Monarch does: module.Class name{point}
    start = len(recorded_faults)
    b = pm.spawn("quiet", Boom).slice(gpus=1)
    b.die.broadcast()
    faults = wait_for(lambda: _new_faults(recorded_faults, start), 10)
    assert "The actor monarch_actors.Boom quiet{'gpus': 1/2} and all its descendants have failed:" in faults[0].report()
    os.kill(pm.pids()[1], signal.SIGKILL)  # a proc's death: the call still names the actor it reached
    with pytest.raises(
        SupervisionError, match=r"Endpoint call error\.ok\(\) failed, The actor Boom 'error' .*\n.*SIGKILL"
    ):
        wait_for(lambda: pm.state().ranks[1].state == "failed", 10)
        a.slice(gpus=1).ok.call_one().get(timeout=10)
    pm.stop().get()
    with pytest.raises(
        RuntimeError, match=r"`ProcMesh` has already been stopped: proc mesh '.*' was stopped; spawn a new"
    ):
        pm.spawn("late", Boom)


def test_an_actor_that_stops_or_dies_takes_what_it_spawned_with_it(host, tmp_path):
    """Monarch's hierarchy: an actor's actor meshes (also on proc meshes it was given) and its own proc
    meshes stop when it is stopped or dies: their __cleanup__ runs, their procs exit."""
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        for how in ("stop", "die"):
            path = tmp_path / f"{how}.log"
            parent = pm.spawn(f"parent_{how}", Parent, pm, str(path))
            assert parent.children_ok.call_one().get(timeout=30) == ["ok", "ok"]
            pids = parent.own_pids.call_one().get(timeout=10)
            if how == "stop":
                parent.stop().get(timeout=60)
            else:
                with pytest.raises(SupervisionError, match="the parent dies"):
                    parent.die.call_one().get(timeout=60)
            assert wait_for(lambda p=path: p.exists() and sorted(p.read_text().split()) == ["on_given", "on_own"], 30)
            assert not wait_dead(pids, 10)  # its own proc mesh is stopped
    finally:
        pm.stop()


# -- 7. the remote exception chain survives ------------------------------------------------------------
def test_actor_error_keeps_the_remote_exception_chain(procs):
    n = procs.spawn("nested", Nested)
    with pytest.raises(ActorError) as ei:
        n.with_cause.call().get(timeout=10)
    text = str(ei.value)
    assert "inner exception" in text and "outer exception" in text
    assert "The above exception was the direct cause of the following exception" in text
    assert text.index("inner exception") < text.index("direct cause") < text.rindex("outer exception")
    assert isinstance(ei.value.exception, ValueError) and isinstance(ei.value.exception.__cause__, KeyError)
    with pytest.raises(ActorError) as ei:
        n.with_context.call().get(timeout=10)
    assert "During handling of the above exception, another exception occurred" in str(ei.value)
    assert ei.value.exception.__cause__ is None and isinstance(ei.value.exception.__context__, KeyError)


# -- 8. errors as Monarch's: stopped meshes, RuntimeError, MeshFailure ------------------------------------
def test_error_types_as_in_monarch(host, recorded_faults):
    assert issubclass(SupervisionError, RuntimeError) and issubclass(MeshClosedError, RuntimeError)
    assert issubclass(MeshFailure, SupervisionError)
    pm = host.spawn_procs(per_host={"gpus": 2})
    a = pm.spawn("a", Boom)
    start = len(recorded_faults)
    os.kill(pm.pids()[1], signal.SIGKILL)  # nothing waits on it: the hook gets a MeshFailure
    faults = wait_for(lambda: _new_faults(recorded_faults, start), 10)
    assert faults and faults[0].mesh_name == pm.name and faults[0].crashed_coords == [{"gpus": 1}]
    assert faults[0].crashed_ranks == [1] and "crashed_ranks=[1]" in str(faults[0])  # Monarch's: rank indices
    assert "SIGKILL" in faults[0].report() and repr(faults[0]).startswith("MeshFailure(mesh_name=")
    pm.stop()
    with pytest.raises(SupervisionError, match="stopped"):  # not MeshClosedError: Monarch's type
        a.ok.call().get(timeout=10)


# -- 9. a stopped proc finalizes -----------------------------------------------------------------------
def test_stopped_procs_run_atexit_handlers_and_finalizers(host, tmp_path):
    pm = host.spawn_procs(per_host={"gpus": 3})
    f = pm.spawn("f", Finalizes)
    pids = list(f.arm.call(str(tmp_path / "p")).get(timeout=20).values())
    busy = f.slice(gpus=1).busy.call_one(60)  # blocking, on the proc's main thread: the stop interrupts it
    napping = f.slice(gpus=2).busy_async.call_one(60)
    assert wait_for(lambda: [r.state for r in pm.state().ranks][1:] == ["busy", "busy"], 10)
    pm.stop(timeout=30)
    assert not wait_dead(set(pids), 5)
    for pid in pids:
        assert (tmp_path / f"p.{pid}.atexit").read_text() == str(pid)
        assert (tmp_path / f"p.{pid}.finalizer").read_text() == str(pid)
        assert (tmp_path / f"p.{pid}.del").read_text() == "finalized"  # a module global's __del__, at exit
    for fut in (busy, napping):
        with pytest.raises(SupervisionError, match="stopped"):
            fut.get(timeout=5)


def test_a_proc_that_does_not_finalize_in_time_is_killed(host, tmp_path):
    pm = host.spawn_procs(per_host={"gpus": 1})
    f = pm.spawn("f", Finalizes)
    pid = f.arm.call_one(str(tmp_path / "p"), 600).get(timeout=20)  # its atexit handler hangs
    pm.stop(timeout=1)
    assert not wait_dead({pid}, 5)  # killed once the stop's timeout ran out
    assert (tmp_path / f"p.{pid}.atexit").read_text() == str(pid)  # it did start finalizing


_UNSTOPPED_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from monarch_actors import Finalizes
    from jupyter_mesh import this_host

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    print(*procs.spawn("f", Finalizes).arm.call(sys.argv[2]).get(timeout=30).values())
    """
)


def test_procs_of_a_script_that_never_stops_them_finalize_too(tmp_path):
    """At the end of a script the agents stop their procs (SIGTERM): they finalize as on stop()."""
    script = tmp_path / "unstopped.py"
    script.write_text(_UNSTOPPED_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), HERE, str(tmp_path / "p")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    pids = [int(p) for p in out.stdout.split()]
    assert not wait_dead(set(pids), 5)
    for pid in pids:
        assert (tmp_path / f"p.{pid}.atexit").read_text() == str(pid)
