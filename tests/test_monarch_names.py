"""Monarch's public names that a ported program uses, each with its Monarch semantics, on real procs."""

from __future__ import annotations

import asyncio
import json
import operator
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from _procs import wait_dead, wait_for
from monarch_names_actors import (
    Adder,
    AsyncCleaner,
    BootProbe,
    Cleaner,
    Collector,
    Gate,
    Initialized,
    KilledInInit,
    Named,
    NamedOwner,
    Sized,
    Watcher,
    boot,
)

import jupyter_mesh
from jupyter_mesh import (
    Accumulator,
    ActorError,
    ActorMesh,
    Channel,
    LocalJob,
    MeshClosedError,
    MeshEndpoint,
    MeshFailure,
    MeshValueError,
    ProcessJob,
    SlurmJob,
    SupervisionError,
    ValueMesh,
    as_endpoint,
    concurrent_endpoint,
    config,
    context,
    current_actor_name,
    current_size,
    default_bootstrap_cmd,
    endpoint,
    get_or_spawn_controller,
    send,
    this_proc,
)
from jupyter_mesh._core.shape import Shape
from jupyter_mesh.jobs._monarch import mesh_slices, slurm_from_monarch
from jupyter_mesh.jobs.kept import Restored

pytestmark = pytest.mark.integration


@pytest.fixture
def two(host):
    pm = host.spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop(timeout=5)


def test_unhandled_fault_hook_gets_a_mesh_failure(host):
    pm = host.spawn_procs(per_host={"gpus": 1})
    seen: list[MeshFailure] = []
    jupyter_mesh.unhandled_fault_hook = seen.append
    try:
        a = pm.spawn("victim", Adder)
        pid = a.pid.call_one().get(timeout=30)
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: seen, 10)
        f = seen[0]
        assert isinstance(f, MeshFailure) and f.mesh_name == pm.name and f.failures[0].kind == "signal"
        assert "MeshFailure" in repr(f) and "SIGKILL" in f.report() and len(f.crashed_ranks) == 1
    finally:
        jupyter_mesh.unhandled_fault_hook = None
        pm.stop(timeout=5)
    assert jupyter_mesh.unhandled_fault_hook is jupyter_mesh._runtime.hooks.unhandled_fault_hook


def test_a_raising_unhandled_fault_hook_leaves_the_failure_unhandled(host, recorded_faults):
    pm = host.spawn_procs(per_host={"gpus": 1})

    def refuse(failure: MeshFailure) -> None:
        raise SystemExit(1)  # Monarch's default hook exits: here the failure goes on to our hook

    jupyter_mesh.unhandled_fault_hook = refuse
    before = len(recorded_faults)
    try:
        pid = pm.spawn("victim", Adder).pid.call_one().get(timeout=30)
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: len(recorded_faults) > before, 10)
    finally:
        jupyter_mesh.unhandled_fault_hook = None
        pm.stop(timeout=5)


def test_config_configured_restores_and_reaches_new_procs(host):
    assert config.get_global_config()["rdma_ibverbs_target"] is None
    with pytest.raises(ValueError, match="unknown setting"):
        config.configure(no_such_setting=1)
    with config.configured(rdma_ibverbs_target="nic:x", tail_log_lines=7) as cfg:
        assert cfg["tail_log_lines"] == 7 and config.get_runtime_config()["rdma_ibverbs_target"] == "nic:x"
        pm = host.spawn_procs(per_host={"gpus": 1})
        try:
            assert pm.spawn("cfg", Adder).setting.call_one("rdma_ibverbs_target").get(timeout=30) == "nic:x"
        finally:
            pm.stop(timeout=5)
    assert config.get_runtime_config() == {} and config.get_global_config()["tail_log_lines"] is None


@config.parametrize_config_pointwise(tail_log_lines=[1, 2], force_file_log=[True, False])
def test_parametrize_config_runs_each_point_under_its_settings():
    cfg = config.get_global_config()
    assert (cfg["tail_log_lines"], cfg["force_file_log"]) in {(1, True), (2, False)}


@config.parametrize_config(tail_log_lines=[1, 2], force_file_log=[True])
def test_parametrize_config_crosses_settings(request):
    cfg = config.get_global_config()
    assert cfg["force_file_log"] is True and cfg["tail_log_lines"] in (1, 2)
    assert request.node.name.endswith(f"[tail_log_lines={cfg['tail_log_lines']}-force_file_log=True]")


def test_configure_refuses_a_value_of_the_wrong_type_as_monarch_does():
    for key, bad in [("enable_log_forwarding", "yes please"), ("enable_log_forwarding", 1), ("tail_log_lines", 2.5),
                     ("tail_log_lines", -1), ("message_delivery_timeout", 30), ("default_transport", 5)]:  # fmt: skip
        with pytest.raises(TypeError, match=f"configuration key `{key}`"):
            config.configure(**{key: bad})
    with pytest.raises(TypeError, match="enable_log_forwarding"), config.configured(enable_log_forwarding="no"):
        pass
    assert config.get_runtime_config() == {}  # nothing was stored
    with config.configured(enable_log_forwarding=False, tail_log_lines=3, message_delivery_timeout="30s",
                           message_latency_sampling_rate=1, default_transport=jupyter_mesh.ChannelTransport.Unix):  # fmt: skip
        assert config.get_global_config()["enable_log_forwarding"] is False
    with pytest.raises(TypeError, match="tail_log_lines"):  # Monarch's is a u64
        config.configure(tail_log_lines=2**64)
    # what Monarch takes from Python is taken too, stored as plain values (which reach procs as JSON)
    import numpy as np

    with config.configured(tail_log_lines=np.int64(3), enable_log_forwarding=np.bool_(True),
                           message_latency_sampling_rate=np.float32(0.5)):  # fmt: skip
        assert config.for_procs() and json.loads(config.for_procs()[config.ENV]) == {
            "tail_log_lines": 3, "enable_log_forwarding": True, "message_latency_sampling_rate": 0.5}  # fmt: skip
    with config.configured(message_latency_sampling_rate=True):
        assert config.get_global_config()["message_latency_sampling_rate"] == 1.0


def test_transports_are_accepted_and_stored_without_effect():
    from jupyter_mesh import ChannelTransport, enable_transport

    assert enable_transport("tcp") is None and enable_transport(ChannelTransport.TcpWithHostname) is None
    with pytest.raises(RuntimeError, match="Only one transport"):
        enable_transport("ipc")
    with pytest.raises(ValueError, match="not a transport"):
        enable_transport("nonsense")
    assert config.ChannelTransport is ChannelTransport


def test_is_ibverbs_available_needs_an_rdma_device():
    has_device = os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))
    assert jupyter_mesh.is_ibverbs_available() in ((False,) if not has_device else (True, False))
    with pytest.warns(DeprecationWarning, match="is_ibverbs_available"):
        assert jupyter_mesh.is_rdma_available() == jupyter_mesh.is_ibverbs_available()


def test_endpoint_takes_monarchs_instrument_switch():  # Monarch's telemetry: accepted, without effect
    assert isinstance(endpoint(instrument=False)(lambda self: 1), jupyter_mesh.Endpoint)
    assert callable(concurrent_endpoint(instrument=False))


def test_explicit_response_port_replies_now_later_or_with_an_error(two):
    a = two.spawn("adder", Adder, 10)
    assert a.slice(gpus=0).add.call_one(5).get(timeout=30) == 15
    assert list(a.add.call(1).get(timeout=30).values()) == [11, 11]
    assert a.slice(gpus=1).add_later.call_one(2).get(timeout=30) == 12  # from a timer thread
    with pytest.raises(ActorError, match="not today"):
        a.slice(gpus=0).refuse.call_one().get(timeout=30)
    a.add.broadcast(3)  # nobody waits: the port drops the value
    assert a.slice(gpus=0).value.call_one().get(timeout=30) == 10


def test_an_endpoint_that_raises_instead_of_answering_through_its_port_ends_the_actor(two):
    a = two.spawn("crasher", Adder, 1).slice(gpus=0)
    with pytest.raises(SupervisionError, match="raised instead of answering"):
        a.crash.call_one().get(timeout=30)
    with pytest.raises(SupervisionError):  # later calls too: the actor is gone (its proc is not)
        a.value.call_one().get(timeout=30)


def test_abort_ends_the_actor_and_the_fault_hook_hears_why(two):
    seen: list[MeshFailure] = []
    jupyter_mesh.unhandled_fault_hook = seen.append
    try:
        a = two.spawn("quitter", Adder).slice(gpus=1)
        a.give_up.call_one("enough").get(timeout=30)
        assert wait_for(lambda: seen, 10)
        assert "Adder quitter aborted: enough" in seen[0].report()
        with pytest.raises(SupervisionError, match="aborted"):
            a.value.call_one().get(timeout=30)
        # Monarch's Instance.kill() is abort(); stop() ends the actor with no failure (the hook hears nothing)
        k, s = two.spawn("killed", Adder).slice(gpus=0), two.spawn("stopped", Adder).slice(gpus=0)
        assert k.quit.call_one("kill").get(timeout=30) == "kill"
        assert wait_for(lambda: len(seen) == 2, 10) and "Adder killed aborted: done" in seen[1].report()
        assert s.quit.call_one("stop").get(timeout=30) == "stop"
        with pytest.raises(SupervisionError, match="stopped itself") as ei:
            s.value.call_one().get(timeout=30)
        assert ei.value.failures[0].kind == "stopped" and len(seen) == 2
        assert two.spawn("after", Adder, 2).slice(gpus=0).value.call_one().get(timeout=30) == 2  # its proc lives on
        # kill() in __init__: the spawn fails with it, as an __init__ that raised (it said it was constructed)
        with pytest.raises(SupervisionError, match="killed_in_init: __init__ aborted: no reason provided"):
            two.spawn("killed_in_init", KilledInInit).initialized.get(timeout=30)
    finally:
        jupyter_mesh.unhandled_fault_hook = None


def test_supervise_runs_while_an_endpoint_awaits(host):
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        heard = pm.spawn("watcher", Watcher).kill_child_and_wait.call_one().get(timeout=60)
        assert len(heard) == 1 and heard[0].startswith("MeshFailure(") and "SIGKILL" in heard[0]
    finally:
        pm.stop(timeout=5)


def test_channel_from_actors_to_the_program_and_between_actors(two, host):
    a = two.spawn("producers", Adder)
    port, receiver = Channel[int].open()
    a.produce.broadcast(port, 3)
    assert sorted(receiver.recv().get(timeout=30) for _ in range(6)) == [0, 1, 2, 100, 101, 102]
    port.exception(KeyError("stop"))  # an exception sent to a port is raised by recv
    with pytest.raises(KeyError):
        receiver.recv().get(timeout=10)
    other = host.spawn_procs(per_host={"gpus": 1})
    try:
        c = other.spawn("collector", Collector)  # a channel opened in an actor, fed by another mesh
        assert c.collect.call_one(a, 2).get(timeout=30) == [0, 1, 100, 101]
    finally:
        other.stop(timeout=5)


def test_once_ports_and_sends_within_the_program_as_monarchs(host):
    once, receiver = Channel.open(once=True)
    once.send(1)
    with pytest.raises(RuntimeError, match="OncePortRef already used"):
        once.send(2)
    assert receiver.recv().get(timeout=10) == 1
    with pytest.raises(ValueError, match="OncePort is already used"):  # not a wait until the timeout
        receiver.recv().get(timeout=5)
    port, inbox = Channel.open()  # sent from the program to its own port: pickled, as from anywhere
    with pytest.raises(TypeError, match="does not pickle"):
        port.send(threading.Lock())
    sent = {"n": [1]}
    port.send(sent)
    got = inbox.recv().get(timeout=10)
    assert got == sent and got is not sent and got["n"] is not sent["n"]


def test_concurrent_endpoint_runs_beside_the_next_message(two):
    g = two.spawn("gate", Gate).slice(gpus=0)
    waiting = g.wait.call_one()
    assert g.release.call_one().get(timeout=30) == "released"
    assert waiting.get(timeout=30) == "through"
    with pytest.raises(ValueError, match="async"):
        concurrent_endpoint(lambda self: None)
    with pytest.raises(ValueError, match="does not wrap @endpoint"):
        concurrent_endpoint(endpoint(lambda self: None))


def test_context_names_the_running_actor(two):
    a = two.spawn("named", Adder)
    out = list(a.whoami.call().get(timeout=30).values())
    assert len({name for name, _, _, _ in out}) == 2  # unique per rank
    assert all(size == {"gpus": 2} and inst == "named" for _, size, inst, _ in out)
    assert out[1][3] == "<monarch_names_actors.Adder named{'gpus': 1/2}>"
    assert repr(context().actor_instance) == "<root>" and current_actor_name() == "root" and current_size() == {}


def test_as_endpoint_calls_a_method_that_is_not_an_endpoint(two):
    a = two.spawn("plain", Adder, 2)
    with pytest.raises(RuntimeError, match=r"not annotated as an endpoint.*as_endpoint\(mesh\.plus\)"):
        a.plus(1)
    assert list(as_endpoint(a.plus).call(3).get(timeout=30).values()) == [5, 5]
    assert as_endpoint(a.slice(gpus=1).plus_later).call_one(1).get(timeout=30) == 3  # an async def
    assert as_endpoint(a.plus_through, explicit_response_port=True).choose(4).get(timeout=30) == 6
    with pytest.raises(ActorError, match="has no endpoint 'plus'"):  # by name alone it still needs @endpoint
        MeshEndpoint(a, "plus").call(1).get(timeout=30)
    with pytest.raises(ValueError, match="not an @endpoint"):
        as_endpoint(a.value)
    with pytest.raises(AttributeError, match="has no endpoint 'nothing'"):
        _ = a.nothing


def test_accumulator_and_send(two):
    a = two.spawn("acc", Adder, 4)
    assert Accumulator(a.value, 1, operator.add).accumulate().get(timeout=30) == 9

    async def as_asyncio():  # Monarch's Future.as_asyncio: an asyncio.Future of a pending call
        f = a.slice(gpus=0).add_later.call_one(1).as_asyncio()
        return isinstance(f, asyncio.Future), await asyncio.wait_for(f, 30)

    assert asyncio.run(as_asyncio()) == (True, 5)
    with pytest.raises(RuntimeError, match="needs a running asyncio event loop"):
        a.value.call().as_asyncio()
    port, receiver = Channel.open()
    send(a.add, (1,), {}, port=port)  # every rank's result goes to the port
    assert sorted(receiver.recv().get(timeout=30) for _ in range(2)) == [5, 5]
    send(a.add, (2,), {}, port=port, selection="choose")  # one rank's
    assert receiver.recv().get(timeout=30) == 6
    ranked_port, ranked = Channel.open_ranked()
    send(a.value, (), {}, port=ranked_port)
    assert sorted(ranked.recv().get(timeout=30) for _ in range(2)) == [(0, 4), (1, 4)]
    with pytest.raises(MeshValueError):
        send(a.value, (), {}, selection="some")  # type: ignore[arg-type]


def test_actor_mesh_stop_runs_cleanup_and_fails_later_calls(two, tmp_path):
    path = str(tmp_path / "log")
    sync, other = two.spawn("cleaner", Cleaner, path), two.spawn("other", Adder, 3)
    assert list(sync.ping.call().get(timeout=30).values()) == ["pong", "pong"]
    sync.stop().get(timeout=30)
    assert pathlib.Path(path).read_text().splitlines() == ["cleanup None", "cleanup None"]
    with pytest.raises(SupervisionError, match="was stopped"):
        sync.ping.call().get(timeout=30)
    assert list(other.value.call().get(timeout=30).values()) == [3, 3]  # the procs go on
    sync.stop().get(timeout=30)  # again: nothing more happens
    assert len(pathlib.Path(path).read_text().splitlines()) == 2
    a = two.spawn("async_cleaner", AsyncCleaner, path).slice(gpus=0)
    a.start.call_one().get(timeout=30)
    a.stop().get(timeout=30)
    assert pathlib.Path(path).read_text().splitlines()[2:] == ["task cancelled", "async cleanup"]


def test_endpoints_named_like_mesh_attributes_win_or_are_refused_at_spawn(two):
    """Where Monarch lets an endpoint have an ActorMesh attribute's name, it wins (``name``; ``stop`` is
    our own choice); where Monarch refuses it (``size``, ``initialized``, ...), spawn refuses it with a
    ValueError naming both. Before: ``mesh.name`` was the name string, ``mesh.size`` the method."""
    n = two.spawn("named", Named)
    assert n.slice(gpus=0).name.call_one().get(timeout=20) == "my-name"
    assert list(n.stop.call().get(timeout=20).values()) == ["my-stop"] * 2
    assert n.slice(gpus=1)._private.call_one().get(timeout=20) == "private"
    assert n.slice(gpus=1).__call__.call_one().get(timeout=20) == "my-call"
    assert ActorMesh.name.__get__(n) == "named"  # ours, where an endpoint hides it
    assert Restored(actors=[("two", n)]).actor_meshes() == {"named": n}  # a reattach names it by its name
    ActorMesh.stop(n).get(timeout=20)
    with pytest.raises(SupervisionError):
        n.slice(gpus=0).name.call_one().get(timeout=20)
    owner = two.spawn("named_owner", NamedOwner, two)
    child = owner.slice(gpus=0).owned.call_one().get(timeout=20)
    assert child.slice(gpus=1).name.call_one().get(timeout=20) == "my-name"
    ActorMesh.stop(owner).get(timeout=20)  # what it owns stops with it, its ``stop`` endpoint notwithstanding

    def child_stopped():
        try:
            child.slice(gpus=1).name.call_one().get(timeout=20)
        except SupervisionError:
            return True
        return False

    assert wait_for(child_stopped, 20)
    for cls, attr in ((Sized, "size"), (Initialized, "initialized")):
        with pytest.raises(ValueError, match=rf"endpoint named '{attr}'.*ActorMesh attribute '{attr}'.*rename"):
            two.spawn(cls.__name__.lower(), cls)


def test_a_stopping_proc_stops_its_actors_too(host, tmp_path):
    path = str(tmp_path / "log")
    pm = host.spawn_procs(per_host={"gpus": 1})
    a = pm.spawn("async_cleaner", AsyncCleaner, path)
    b = pm.spawn("cleaner", Cleaner, path)  # on a thread of its own: the proc waits for it
    a.start.call_one().get(timeout=30)
    assert b.ping.call_one().get(timeout=30) == "pong"
    pm.stop(timeout=10)
    assert sorted(pathlib.Path(path).read_text().splitlines()) == ["async cleanup", "cleanup None", "task cancelled"]


def test_the_package_pickles_by_name():  # cloudpickle sends functions that use ``jupyter_mesh.x`` globals
    import pickle

    assert pickle.loads(pickle.dumps(jupyter_mesh)) is jupyter_mesh


def test_value_mesh_get_slice_flatten():
    vm = ValueMesh(Shape.from_sizes({"hosts": 2, "gpus": 3}), list(range(6)))
    assert vm.get(4) == 4
    assert vm.slice(hosts=1, gpus=2).item() == 5
    assert list(vm.slice(gpus=1).values()) == [1, 4]
    assert vm.flatten("r").item(r=3) == 3


def test_this_proc_and_get_or_spawn_controller(two):
    # in an actor, as in Monarch: its own proc, one proc with no dims (what it spawns there shares its pid)
    placed = two.spawn("placed", Adder).slice(gpus=1)
    for via in ("proc", "this_proc"):  # context().actor_instance.proc (Monarch's actors.md), this_proc()
        assert placed.own_proc.call_one(via).get(timeout=60) == ({}, {"gpus": 2}, two.pids()[1], two.pids()[1]), via
    # in the program: a proc of its own, spawned once (actors never run in the controller)
    assert this_proc() is this_proc()
    assert this_proc().spawn("here", Adder, 7).value.call_one().get(timeout=30) == 7
    first = get_or_spawn_controller("registry", Adder, 1).get(timeout=30)
    again = get_or_spawn_controller("registry", Adder, 2).get(timeout=30)
    assert again.value.call_one().get(timeout=30) == 1 and first._actor_id == again._actor_id
    c = two.spawn("asker", Collector).slice(gpus=0)  # asked from an actor: the program's one
    assert c.singleton_value.call_one("from_actor").get(timeout=60) == 40
    assert get_or_spawn_controller("from_actor", Adder, 0).get(timeout=30).value.call_one().get(timeout=30) == 40


def test_process_job_host_meshes_and_their_lifecycle():
    job = ProcessJob({"trainers": 2}, env={"MONARCH_NAMES_PROBE": "1"})
    state = job.state(cached_path=None)
    hosts = state.trainers
    assert hosts.sizes == {"hosts": 2} and hosts.initialized.get(timeout=60) is True
    with pytest.raises(AttributeError, match="trainers"):
        _ = state.loaders
    pm = hosts.spawn_procs({"gpus": 1}, bootstrap=boot)
    assert pm.initialized.get(timeout=5) is True and pm.host_mesh is hosts
    assert list(pm.spawn("probe", BootProbe).booted.call().get(timeout=30).values()) == [["yes"], ["yes"]]
    pids = set(pm.pids().values())
    hosts.stop().get(timeout=30)  # the procs go, the hosts stay
    assert not wait_dead(pids, 10) and pm.stopped
    again = hosts.spawn_procs({"gpus": 1})
    assert list(again.spawn("probe", Adder).env.call("MONARCH_NAMES_PROBE").get(timeout=30).values()) == ["1", "1"]
    other = job.state().trainers.spawn_procs({"gpus": 1})  # another HostMesh of the same hosts
    hosts.stop().get(timeout=30)
    assert again.stopped and not other.stopped  # each stops what it spawned
    hosts.shutdown().get(timeout=30)
    assert other.stopped  # its hosts are gone: calls to it fail at once instead of waiting for ever
    with pytest.raises(MeshClosedError, match="already been shut down"):
        hosts.spawn_procs({"gpus": 1})
    job.kill()
    assert hosts.with_python_executable(sys.executable) is hosts
    with pytest.raises(MeshValueError, match="fork from"):
        hosts.with_python_executable("/usr/bin/other-python")


def test_local_job_state_gives_monarchs_host_meshes():
    job = LocalJob(preload=[])  # Monarch's presentation notebook: LocalJob().state().hosts
    try:
        hosts = job.state().hosts
        assert hosts.sizes == {}  # as Monarch's: this machine, no dims
        pm = hosts.spawn_procs(per_host={"gpus": 2}, bootstrap=boot)
        assert pm.sizes == {"gpus": 2}
        assert list(pm.spawn("probe", BootProbe).booted.call().get(timeout=30).values()) == [["yes"], ["yes"]]
    finally:
        job.kill()
    with pytest.raises(MeshClosedError, match="stopped"):
        job.state()
    named = LocalJob(hosts=("trainers", "loaders"), preload=[])  # Monarch's names: each this machine
    try:
        state = named.state(cached_path=None)
        assert state.trainers.sizes == {} and state.loaders.sizes == {}
        with pytest.raises(AttributeError, match="'hosts' is not a host mesh of this job"):
            _ = state.hosts
    finally:
        named.kill()
    with pytest.raises(MeshValueError, match="names of host meshes"):
        LocalJob(hosts=("not a name",))


def test_slurm_job_takes_monarchs_constructor():
    """Monarch's slurm notebooks' keywords become ours (sbatch options, name, time); what we cannot honour
    is refused before anything is submitted (the job itself runs in tests/cluster)."""
    m = slurm_from_monarch({"mesh0": 2}, job_name="monarch_example", gpus_per_node=8, time_limit="06:00:00")
    assert (m.nodes, m.meshes, m.sbatch, m.name, m.time) == (2, {"mesh0": 2}, ["--gpus-per-node=8"], "monarch_example", "06:00:00")  # fmt: skip
    m = slurm_from_monarch({"a": 2, "b": 1}, cpus_per_task=4, mem="64G", qos="high", exclusive=True)
    assert m.nodes == 3 and m.sbatch == ["--cpus-per-task=4", "--mem=64G", "--qos=high", "--exclusive"]
    assert mesh_slices(m.meshes) == {"a": slice(0, 2), "b": slice(2, 3)}
    for kwargs, msg in [
        ({"ntasks_per_node": 2}, "one agent per node"),
        ({"out_of_cluster": True}, "dial back"),
        ({"bind_to": "10.0.0.1"}, "open no port"),
        ({"job_start_timeout": 60}, "spawn_procs"),
        ({"gpus_per_node": 0}, "int >= 1"),
    ]:
        with pytest.raises(MeshValueError, match=msg):
            SlurmJob(meshes={"mesh0": 2}, job_name="monarch_example", **kwargs)
    with pytest.raises(TypeError, match="gpus_per_nod"):
        SlurmJob(meshes={"mesh0": 2}, gpus_per_nod=8)
    with pytest.raises(MeshValueError, match="identifier names"):
        SlurmJob({"mesh 0": 2})
    # Monarch's positional order after the meshes (python_exe, slurm_args, monarch_port, job_name,
    # ntasks_per_node, ..., mem 12th): "python3" second is not taken for a partition
    with pytest.raises(MeshValueError, match="ntasks_per_node=2"):
        SlurmJob({"mesh0": 2}, "python3", ["--comment=x"], 22222, "job", 2)
    with pytest.raises(MeshValueError, match="mem='lots'"):
        SlurmJob({"mesh0": 2}, "python3", [], 22222, "job", 1, "01:00:00", "debug", None, True, 8, 4, "lots")
    with pytest.raises(TypeError, match=r"multiple values for argument\(s\) \['python_exe'\]"):
        SlurmJob({"mesh0": 2}, "python3", python_exe="python3")


def test_proc_bind_pins_each_proc_of_a_host(host):
    with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host \(2\)"):
        host.spawn_procs({"gpus": 2}, proc_bind=[{"cpus": "0"}])
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    pm = host.spawn_procs({"gpus": 2}, proc_bind=[{"cpus": str(cpus[0])}, {"cpus": str(cpus[1])}])
    try:
        assert list(pm.spawn("pinned", Adder).cpus.call().get(timeout=30).values()) == [[cpus[0]], [cpus[1]]]
    finally:
        pm.stop(timeout=5)


def test_default_bootstrap_cmd_and_point_str():
    cmd = default_bootstrap_cmd()
    assert cmd.program == sys.executable and cmd.args[-1] == "jupyter_mesh._runtime.agent_main"
    point = Shape.from_sizes({"hosts": 1, "gpus": 2}).point(1)
    assert str(point) == "{'hosts': 0/1, 'gpus': 1/2}"


def test_bootstrap_command_with_env_gives_the_procs_that_environment(host):
    base = default_bootstrap_cmd()
    cmd = base.with_env({"JM_TEST_MARK": "3"})
    assert base.env == {} and cmd.env == {"JM_TEST_MARK": "3"}  # a copy: the default is unchanged
    pm = host.spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
    plain = host.spawn_procs(per_host={"gpus": 1})
    try:
        assert pm.spawn("p", BootProbe).env.call_one("JM_TEST_MARK").get(timeout=30) == "3"
        assert plain.spawn("p", BootProbe).env.call_one("JM_TEST_MARK").get(timeout=30) is None
    finally:
        pm.stop()
        plain.stop()
    # the module agents started as before agent_main (a script may have written it out) still works
    old_module = type(base)(sys.executable, ["-m", "jupyter_mesh._runtime.agent_boot"], {"JM_TEST_MARK": "4"})
    assert old_module.proc_env() == {"JM_TEST_MARK": "4"}
    other = type(base)("/usr/bin/env", ["python3"])  # procs fork from the agent: another program cannot apply
    with pytest.raises(ValueError, match="only the environment of a bootstrap command applies"):
        host.spawn_procs(per_host={"gpus": 1}, bootstrap_command=other)


def test_shutdown_context_stops_everything_and_is_idempotent(tmp_path):
    script = textwrap.dedent(
        """
        import os, sys
        sys.path.insert(0, sys.argv[1])
        from jupyter_mesh import this_host, shutdown_context
        from monarch_names_actors import Adder
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        print(*pm.spawn("a", Adder).pid.call().get(timeout=30).values(), flush=True)
        assert shutdown_context().get() is None and shutdown_context().get() is None
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, os.path.dirname(__file__)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    pids = {int(p) for p in out.stdout.split()}
    assert len(pids) == 2 and not wait_dead(pids, 10)
