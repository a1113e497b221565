"""Faults of each process kind give a clear error within their timeout, and the mesh or job recovers.

Relays that fail (injected in the agent with ``JUPYTER_MESH_FAIL_RELAYS``: the real undelivered path,
nothing mocked), a stalled agent, a killed agent, a killed fork server (template), and stops of meshes
in those states.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from _procs import template_of, wait_dead, wait_for, wait_stopped
from actors import Counter, Faulty
from tree_actors import Caller as TreeCaller

from jupyter_mesh import DeliveryError, LocalJob, ProcState, SupervisionError

pytestmark = pytest.mark.integration


@pytest.fixture
def failing_relays():
    """A one-host job whose agent fails its next relay of a spawn and its next two relays of calls."""
    os.environ["JUPYTER_MESH_FAIL_RELAYS"] = "spawn:1,c:2"
    try:
        job = LocalJob(hosts=1)
        job.agents(30)
    finally:
        del os.environ["JUPYTER_MESH_FAIL_RELAYS"]
    yield job
    job.stop()
    assert not wait_dead(job.pids(), 5)


def test_failed_relay_is_a_delivery_error_and_leaves_no_gap(failing_relays):
    pm = failing_relays.host_mesh().spawn_procs(per_host={"gpus": 2})
    pids = set(pm.pids().values())
    c = pm.spawn("c", Counter, 0)  # the relay to rank 0 fails: its actor never comes to be
    with pytest.raises(DeliveryError, match=r"gpus=0\] the host agent could not relay the spawn") as ei:
        c.initialized.get(10)
    assert [f.kind for f in ei.value.failures] == ["delivery"] and "spawn the actor mesh again" in str(ei.value)
    one = c.slice(gpus=1)
    for _ in range(2):  # the next two relays of a call fail
        with pytest.raises(DeliveryError, match=r"could not relay the call of incr.*injected") as ei2:
            one.incr.call().get(10)
        assert "procs are alive" in str(ei2.value)
    # nothing ran, nothing is waited for: the next calls run at once, in order, on a live rank
    assert list(one.incr.call().get(10).values()) == [1]
    assert one.incr.call_one().get(10) == 2
    assert all(r.state != ProcState.FAILED for r in pm.state().ranks)
    # the actor whose spawn was lost says so to every later caller, on its rank only
    with pytest.raises(SupervisionError, match="never created on this proc"):
        c.slice(gpus=0).incr.call_one().get(10)
    pm.stop(timeout=5)
    assert not wait_dead(pids, 5)


def test_stalled_agent_is_given_up_and_replaced():
    job = LocalJob(hosts=1)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        pids = set(pm.pids().values())
        f = pm.spawn("f", Faulty)
        f.initialized.get(10)
        agent = job.pids()[0]
        os.kill(agent, signal.SIGSTOP)
        assert wait_stopped(agent)
        with pytest.raises(SupervisionError, match="is lost: it stopped answering heartbeats"):
            f.sleep.call(30).get(10)
        with contextlib.suppress(ProcessLookupError):  # it is killed when given up: SIGCONT may find nobody
            os.kill(agent, signal.SIGCONT)
        # given up for good: the stalled agent and its procs are gone, nothing is re-admitted silently
        assert not wait_dead(pids | {agent}, 5)
        assert wait_for(lambda: all(r.state == ProcState.FAILED for r in pm.state().ranks), 2)
        # refused for the lost agent (not a spawn that times out)
        with pytest.raises(SupervisionError, match=r"(?s)host agent failed during respawn.*is lost"):
            pm.respawn()
        with pytest.raises(SupervisionError, match="is lost"):
            f.ok.call().get(5)
        # the job starts a fresh agent for that host: a new mesh works
        pm2 = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        assert list(pm2.spawn("c", Counter, 0).incr.call().get(20).values()) == [1, 1]
        pm.stop(timeout=2)  # a mesh of a lost agent stops (nothing to wait for)
        pm2.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 5)


def test_killed_agent_fails_fast_and_is_replaced():
    job = LocalJob(hosts=1)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        f = pm.spawn("f", Faulty)
        f.initialized.get(10)
        fut = f.sleep.call(30)
        agent = job.pids()[0]
        os.kill(agent, signal.SIGKILL)
        # its exit is seen (the cause is the signal, not missed heartbeats)
        with pytest.raises(SupervisionError, match=rf"pid {agent}\) killed by SIGKILL"):
            fut.get(10)
        with pytest.raises(SupervisionError, match=r"(?s)host agent failed during respawn.*killed by SIGKILL"):
            pm.respawn()
        pm2 = job.host_mesh().spawn_procs(per_host={"gpus": 1})
        assert pm2.spawn("c", Counter, 0).incr.call_one().get(20) == 1
        pm.stop(timeout=2)
        pm2.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 5)


def test_killed_template_is_restarted_and_its_procs_reported():
    job = LocalJob(hosts=1)
    try:
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 2})
        f = pm.spawn("f", Faulty)
        f.initialized.get(10)
        pids = set(pm.pids().values())
        agent = job.pids()[0]
        template = template_of(agent, pids)
        fut = f.sleep.call(30)
        os.kill(template, signal.SIGKILL)
        with pytest.raises(SupervisionError, match=r"fork server .* killed by SIGKILL"):
            fut.get(10)
        assert not wait_dead(pids, 10)
        assert wait_for(lambda: all(r.state == ProcState.FAILED for r in pm.state().ranks), 10)
        # the host is still usable: new meshes, and respawn in place. The new fork server imports torch
        # first (7-14 s at load 16 on 2 cores): the default timeout, not a tight one
        pm2 = job.host_mesh().spawn_procs(per_host={"gpus": 1})
        assert pm2.spawn("c", Counter, 0).incr.call_one().get(20) == 1
        # a caller that has not heard of the deaths (an actor: the controller has) learns them from the
        # agent, cause included: it said "proc N is not running", which is all a caller learns when its
        # call overtakes the death's report (seen in test_warm under load)
        status, (failed, text) = pm2.spawn("caller", TreeCaller).try_call.call_one(f, "ok").get(30)
        assert status == "err" and failed == [("signal", 0), ("signal", 0)], text
        assert text.count("was killed by SIGKILL: its host's fork server (template, pid") == 2, text
        assert pm.respawn() == [0, 1]
        assert list(f.ok.call().get(10).values()) == ["fine", "fine"]
        pm.stop(timeout=5)
        pm2.stop(timeout=5)
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 5)


def test_a_fork_server_that_dies_at_every_start_is_restarted_ever_more_slowly(tmp_path, capfd):
    """A preload (or an environment) the template cannot start with kills every template at once: the
    agent restarted it as fast as it died (66 times in 8 s, a core, its error printed each time). After
    the second such death in a row it now waits (1 s, then twice as long each time), and a spawn
    meanwhile fails at once with the cause rather than at its timeout."""
    (tmp_path / "jm_dies_on_import.py").write_text("import os\nos._exit(3)\n")
    job = LocalJob(hosts=1, preload=["jm_dies_on_import"], env={"PYTHONPATH": str(tmp_path)})
    try:
        with pytest.raises(SupervisionError, match="fork server"):
            job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=30)
        time.sleep(2.5)
        with pytest.raises(SupervisionError, match="times in a row within 10 s of its start"):
            job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=30)  # (not its MeshTimeoutError)
        time.sleep(3)
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 5)
    deaths = capfd.readouterr().err.count("jupyter-mesh agent: its host's fork server")
    assert 3 <= deaths <= 7, deaths  # 0, 0, +1, +2, +4 s...: not one per ~0.1 s


def test_a_working_fork_server_killed_by_hand_again_and_again_is_restarted_at_once():
    """Only a template that never forked counts toward a crash loop: one killed by hand right after it
    forked (twice, quickly) is no crash loop, and the next spawn does not meet a pause."""
    job = LocalJob(hosts=1, preload=[])
    try:
        agent = job.pids()[0]
        for _ in range(3):
            pm = job.host_mesh().spawn_procs(per_host={"gpus": 1})
            template = template_of(agent, set(pm.pids().values()))
            os.kill(template, signal.SIGKILL)
            assert not wait_dead(set(pm.pids().values()), 10)
        pm = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=30)
        assert pm.spawn("c", Counter, 0).incr.call_one().get(20) == 1
    finally:
        job.stop()
    assert not wait_dead(job.pids(), 5)


def test_a_dead_procs_last_output_leaves_out_the_notebooks_markers(host):
    """The notebook's output markers (a `%%mesh` cell's end, OUT_SYNC) are protocol, not the user's
    output: the tail shown when a proc dies has the user's lines only."""
    from jupyter_mesh._wire.protocol import OUT_SYNC_PREFIX

    text = _error_after_last_words(host, f"user line\n{OUT_SYNC_PREFIX}abc123")
    assert "user line" in text and "jupyter-mesh-sync" not in text, text


def test_a_dead_procs_last_output_is_cut_per_line(host):
    """Its last 30 lines of 100 KB each made a 3.8 MB error, repeated by every later call to the rank:
    each kept line is cut as the kept logs cut one (``LINE_MAX``, with a marker), and the whole at
    ``TAIL_MAX`` (its end, with a marker): the last words stay."""
    from jupyter_mesh._runtime.agent import TAIL_MAX

    text = _error_after_last_words(host, "\n".join(["y" * 100_000] * 30 + ["last words"]))
    assert "last words" in text and "… [cut " in text, text[-2000:]
    assert "characters before these cut" in text and len(text) < TAIL_MAX + 4096, len(text)


def _error_after_last_words(host, words: str) -> str:
    """A proc prints ``words``, is killed: the error a later call to it raises, as text."""
    procs = host.spawn_procs(per_host={"gpus": 1})
    try:
        a = procs.spawn("loud", Faulty)
        a.shout.call(words).get(timeout=30)
        pid = a.pid.call_one().get(timeout=30)
        time.sleep(0.5)  # the lines reach the agent before the proc dies
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SupervisionError) as e:
            for _ in range(100):
                a.ok.call().get(timeout=30)
                time.sleep(0.05)
        return str(e.value)
    finally:
        procs.stop()


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_spawn_whose_procs_die_while_starting_fails_once(recorded_faults, hosts):
    """Procs that die before they are up (a mesh preload that does not import) fail the spawn, with
    their traceback; that failure is not reported again as an unhandled one, or raised from the next,
    unrelated spawn, about a mesh the user never got."""
    seen = len(recorded_faults)  # (the session's fault hook: a kernel's, where fail-fast would raise)
    job = LocalJob(hosts)
    try:
        with pytest.raises(SupervisionError, match="failed while starting its procs") as info:
            job.host_mesh().spawn_procs(per_host={"gpus": 2}, preload=["no_such_module_for_a_test"], timeout=60)
        assert "No module named 'no_such_module_for_a_test'" in str(info.value)
        time.sleep(1.0)  # the agents' exit reports, if any, reach the controller
        procs = job.host_mesh().spawn_procs(per_host={"gpus": 1}, timeout=60)
        c = procs.spawn("c", Counter, 3)
        assert set(c.value.call().get(30).values()) == {3}
        procs.stop()
    finally:
        job.stop()
    assert recorded_faults[seen:] == []
