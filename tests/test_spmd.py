"""torchrun scripts on a mesh (``jupyter_mesh.spmd``): Monarch's environment, scripts run unmodified
through the API and through ``%mesh torchrun`` in a real kernel, failures, interrupts, Lightning."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from _procs import reaped_procs, wait_dead, wait_for

from jupyter_mesh import Actor, ActorError, LocalJob, MeshValueError, SupervisionError, endpoint
from jupyter_mesh._core.shape import Shape
from jupyter_mesh.spmd import (
    ScriptExit,
    SPMDActor,
    root_causes_first,
    run_script,
    setup_torch_elastic_env,
    torch_elastic_env,
)
from jupyter_mesh.spmd.env import ENV_KEYS, view_point

SCRIPTS = Path(__file__).resolve().parent / "spmd_scripts"
ALLREDUCE = str(SCRIPTS / "allreduce.py")
FOREVER = ["--steps", "1000000000", "--step-time", "0.001", "--announce"]

# Monarch's rules, written out per rank: (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
# WORLD_SIZE) by rank. The last dim is the node-local one; GROUP_RANK = RANK // LOCAL_WORLD_SIZE.
EXPECTED = {
    "1x4": ({"hosts": 1, "gpus": 4}, {g: (g, g, 4, 0, 1, 4) for g in range(4)}),
    "2x2": ({"hosts": 2, "gpus": 2}, {2 * h + g: (2 * h + g, g, 2, h, 2, 4) for h in range(2) for g in range(2)}),
    "4": ({"gpus": 4}, {g: (g, g, 4, 0, 1, 4) for g in range(4)}),  # this_host(): no hosts dim
}


def _check(env: dict[str, str], expected: tuple[int, ...]) -> None:
    rank, local, local_world, group, groups, world = expected
    assert env["RANK"] == str(rank) and env["ROLE_RANK"] == str(rank)
    assert env["LOCAL_RANK"] == str(local) and env["LOCAL_WORLD_SIZE"] == str(local_world)
    assert env["GROUP_RANK"] == str(group) and env["GROUP_WORLD_SIZE"] == str(groups)
    assert env["WORLD_SIZE"] == str(world) and env["ROLE_WORLD_SIZE"] == str(world)
    assert env["ROLE_NAME"] == "rank"


class EnvReader(Actor):
    @endpoint
    def env(self) -> dict[str, str]:
        return {k: os.environ.get(k, "") for k in ENV_KEYS}


# -- the rules, without procs ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", sorted(EXPECTED))
def test_env_follows_monarchs_rules(layout):
    sizes, table = EXPECTED[layout]
    shape = Shape.from_sizes(sizes)
    for i in range(len(shape)):
        point = shape.point(i)
        env = torch_elastic_env(point, "node0", 29500)
        _check(env, table[point.rank])
        assert env["MASTER_ADDR"] == "node0" and env["MASTER_PORT"] == "29500"


def test_the_last_dim_is_the_local_one_whatever_its_name():
    shape = Shape.from_sizes({"hosts": 2, "racks": 3, "cpus": 2})
    env = torch_elastic_env(shape.point(9), "a", 1)  # hosts=1, racks=1, cpus=1
    assert (env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("9", "1", "2")
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["WORLD_SIZE"]) == ("4", "6", "12")


def test_a_slice_counts_its_ranks_from_zero():
    whole = Shape.from_sizes({"hosts": 1, "gpus": 4})
    part = whole.select(gpus=slice(2, 4))
    point = view_point(whole.point(3), part)
    assert point.rank == 1 and dict(point) == {"hosts": 0, "gpus": 1}
    with pytest.raises(ValueError, match="rank 0 is not in the slice"):
        view_point(whole.point(0), part)


# -- the environment on real meshes ---------------------------------------------------------------


@pytest.fixture(scope="module")
def procs(host):
    """4 procs for the module, torch imported once in their template (not in each test's procs):
    every test leaves them usable for the next, which is part of what they check."""
    with reaped_procs(host, 4, preload=["torch"]) as pm:
        yield pm


def _read_env(pm) -> dict[int, dict[str, str]]:
    got = pm.spawn("env_reader", EnvReader).env.call().get(30)
    return {point.rank: env for point, env in got.items()}


def test_setup_torch_elastic_env_on_this_hosts_4_procs(procs):
    setup_torch_elastic_env(procs)
    envs = _read_env(procs)
    _, table = EXPECTED["4"]
    assert set(envs) == set(table)
    for rank, env in envs.items():
        _check(env, table[rank])
    # every rank meets at the first proc's host, on one port
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs.values()}) == 1
    assert int(envs[0]["MASTER_PORT"]) > 0 and envs[0]["MASTER_ADDR"]


@pytest.mark.parametrize(("layout", "hosts", "master"), [("1x4", 1, None), ("2x2", 2, ("10.9.8.7", 4321))])
def test_setup_torch_elastic_env_on_host_meshes(host, layout, hosts, master):
    sizes, table = EXPECTED[layout]
    job = LocalJob(hosts=hosts)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": sizes["gpus"]})
        assert pm.sizes == sizes
        pids = set(pm.pids().values())
        setup_torch_elastic_env(pm, *(master or ()))
        envs = _read_env(pm)
        assert set(envs) == set(table)
        for rank, env in envs.items():
            _check(env, table[rank])
        assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs.values()}) == 1
        if master:  # given: used as is
            assert (envs[0]["MASTER_ADDR"], envs[0]["MASTER_PORT"]) == (master[0], str(master[1]))
        pm.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(pids | set(job.pids()), 5.0)


def test_master_addr_and_port_come_together(procs):
    with pytest.raises(MeshValueError, match="both master_addr and master_port"):
        setup_torch_elastic_env(procs, master_addr="10.0.0.1")


def test_a_slice_of_the_mesh_is_a_job_of_its_own(procs):
    part = procs.slice(gpus=slice(2, 4))
    setup_torch_elastic_env(part)
    got = part.spawn("env_reader", EnvReader).env.call().get(30)
    envs = {dict(point)["gpus"]: env for point, env in got.items()}
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for _, e in sorted(envs.items())] == [
        ("0", "0", "2"),
        ("1", "1", "2"),
    ]


# -- scripts through the API ----------------------------------------------------------------------


def test_monarchs_way_spawn_spmd_actor_and_call_main(procs, tmp_path):
    """As Monarch's docs do it: spawn SPMDActor, ask the first rank for the rendezvous, call main."""
    actors = procs.spawn("spmd_by_hand", SPMDActor)
    addr, port = actors.slice(gpus=0).get_host_port.call_one(None).get(30)
    args = [ALLREDUCE, "--steps", "2", "--out", str(tmp_path)]
    done = actors.main.call(addr, port, args).get(60)
    assert list(done.values()) == [True] * 4
    for rank in range(4):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["sum"] == 2 * (1 + 2 + 3 + 4)  # all_reduce of rank+1 over 4 ranks, twice
        assert out["argv"] == args  # sys.argv as python would set it
        assert out["env"]["RANK"] == str(rank) and out["env"]["WORLD_SIZE"] == "4"
        assert (out["env"]["MASTER_ADDR"], out["env"]["MASTER_PORT"]) == (addr, str(port))


def test_run_script_twice_on_the_same_procs(procs):
    """The process group of a run never outlives it: the next init_process_group in the proc works
    (even for a script that forgets destroy_process_group: the allreduce script calls it, the second
    run leaves it to us)."""
    for extra in ([], ["--steps", "3"]):
        assert list(run_script(procs, [ALLREDUCE, *extra]).get(60).values()) == [True] * 4
    lines = [ln for ln in procs.logs(tail=None) if "sum" in ln]
    assert any("rank 3/4: sum 30" in ln for ln in lines), lines


def test_a_rank_that_raises_is_named_first_and_the_mesh_runs_again(procs):
    with pytest.raises(ActorError) as caught:
        run_script(procs, [ALLREDUCE, "--steps", "5", "--fail-rank", "1"]).get(60)
    err = root_causes_first(caught.value)
    assert err.coords == {"gpus": 1}
    assert str(err).startswith("ValueError: rank 1 fails on purpose at step 0\n  Actor call spmd.main failed on")
    first = err.failures[0].traceback
    # the remote traceback starts at the script: no frames of ours or runpy's
    assert re.search(r'Traceback \(most recent call last\):\n  File ".*allreduce\.py"', first), first
    assert "jupyter_mesh" not in first and "runpy" not in first
    # the others only lost rank 1 in their all_reduce: after it, and they did not wait out a timeout
    assert all("Check the logs of the remote worker" in f.message for f in err.failures[1:]), "\n".join(
        f.message[:300] for f in err.failures
    )
    assert list(run_script(procs, [ALLREDUCE]).get(60).values()) == [True] * 4


def test_a_rank_whose_init_process_group_failed_joins_the_next_run(procs):
    """torch names each new default group by a count ("0", "1", ...) that only a destroy resets: a rank
    whose init raised (here it timed out alone; in CI a peer closed while it connected) kept "1" and
    met the next run's ranks under another name in the store, all of them waiting for gloo's 30 minutes."""
    with pytest.raises(ActorError) as caught:
        run_script(procs, [ALLREDUCE, "--alone-rank", "0"]).get(60)
    assert [f.coords for f in caught.value.failures] == [{"gpus": 0}], str(caught.value)
    assert list(run_script(procs, [ALLREDUCE]).get(60).values()) == [True] * 4


def test_no_rank_leaves_init_process_group_before_every_rank_has_its_group(procs, tmp_path):
    """A rank that raised at once after init (step 0) tore down its connections while a slower peer was
    still connecting: that peer's connectFullMesh failed, or waited for a rank that never came. Runs
    meet at the end of init (torch's store barrier): rank 2's group comes up a second late, and every
    rank's init returns only after it."""
    args = [ALLREDUCE, "--slow-group-rank", "2", "--out", str(tmp_path)]
    assert list(run_script(procs, args).get(60).values()) == [True] * 4
    saw = {r: json.loads((tmp_path / f"saw{r}.json").read_text()) for r in range(4)}
    assert saw == dict.fromkeys(range(4), True)


def test_bad_scripts_say_what_went_wrong(procs, tmp_path):
    with pytest.raises(ActorError, match=r"no script 'no_such_train\.py' here"):
        run_script(procs.slice(gpus=0), ["no_such_train.py"]).get(30)
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ActorError) as caught:
        run_script(procs.slice(gpus=0), [str(exits)]).get(30)
    assert caught.value.failures[0].exc_type == ScriptExit.__name__
    assert "exited with status 3 (sys.exit)" in str(caught.value)
    ok = tmp_path / "ok.py"
    ok.write_text("import sys\nsys.exit(0)\n")
    assert run_script(procs.slice(gpus=0), [str(ok)]).get(30) is not None
    assert list(run_script(procs.slice(gpus=0), ["-m", "platform"]).get(30).values()) == [True]
    with pytest.raises(MeshValueError, match="needs a script"):
        run_script(procs, [])


def test_cancel_stops_every_rank_and_the_procs_take_the_next_run(procs):
    fut = run_script(procs, [ALLREDUCE, *FOREVER])
    assert wait_for(lambda: sum("joined" in ln for ln in procs.logs(tail=None)) >= 4, 60), procs.logs()
    assert fut.cancel()
    # every rank left its loop: the next run (queued behind the cancelled one on each actor) runs
    assert list(run_script(procs, [ALLREDUCE, "--steps", "2"]).get(60).values()) == [True] * 4


def test_ranks_a_failed_run_left_in_the_rendezvous_get_new_procs_before_the_next_run(procs, capfd):
    """Rank 2 dies before it joins: the others wait for it in init_process_group (native code, for
    gloo's 30 minutes). The next run finds them busy and restarts their procs, as torchrun restarts a
    worker group, instead of queueing behind them."""
    before = procs.pids()
    fut = run_script(procs, [ALLREDUCE, "--stall-rank", "2"])
    assert wait_for(lambda: sum("about to join" in ln for ln in procs.logs(tail=None)) >= 4, 60), procs.logs()
    procs.kill(2, 9)
    with pytest.raises(SupervisionError):
        fut.get(30)
    assert procs.respawn() == [2]
    capfd.readouterr()
    assert list(run_script(procs, [ALLREDUCE, "--steps", "2"]).get(60).values()) == [True] * 4
    assert "ranks gpus 0-1,3 were still in the run that failed" in capfd.readouterr().err
    after = procs.pids()
    assert all(after[r] != before[r] for r in range(4))


# -- PyTorch Lightning, unmodified ----------------------------------------------------------------


def test_an_unmodified_lightning_script_trains_with_ddp_on_two_procs(host, tmp_path):
    pytest.importorskip("pytorch_lightning", reason="the Lightning test needs the `test` extra (pytorch-lightning)")
    pm = host.spawn_procs(per_host={"gpus": 2}, preload=["pytorch_lightning"])  # imported once, before the fork
    pids = set(pm.pids().values())
    try:
        script = [str(SCRIPTS / "lightning_tiny.py"), "--devices", "2", "--epochs", "2", "--root", str(tmp_path)]
        assert list(run_script(pm, script).get(110).values()) == [True, True]
        lines = pm.logs(tail=None)
        # Lightning read the torchrun variables: two members of one gloo group, nothing spawned by it
        assert any("Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in ln for ln in lines), lines
        done = sorted(ln.split("] ", 1)[1] for ln in lines if "lightning rank" in ln)
        assert [d.split(":")[0] for d in done] == ["lightning rank 0 of 2", "lightning rank 1 of 2"]
        assert all("2 epochs, 8 steps" in d for d in done)  # 64 samples / 2 ranks / batches of 8, twice
        assert len({d.split("loss ")[1] for d in done}) == 1  # one model, synchronised
    finally:
        pm.stop(timeout=5)
    assert not wait_dead(pids, 5.0)
