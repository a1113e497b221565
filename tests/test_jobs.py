"""The Job base class: what a scheduler must give, and clear errors for what a job cannot do."""

from __future__ import annotations

import pytest

from jupyter_mesh import LocalJob, MeshValueError
from jupyter_mesh.jobs import Job


class FixedJob(Job):
    """A job that cannot grow: only the two required methods."""

    def agents(self, timeout: float):
        return []

    def stop(self) -> None:
        pass

    def __repr__(self) -> str:
        return "<FixedJob>"


def test_a_job_must_give_agents_and_stop():
    class Incomplete(Job):
        def stop(self) -> None:
            pass

    with pytest.raises(TypeError, match="agents"):
        Incomplete()  # type: ignore[abstract]


def test_optional_methods_say_what_a_job_cannot_do():
    job = FixedJob()
    with pytest.raises(MeshValueError, match="<FixedJob> cannot add hosts; spawn a new proc mesh"):
        job.add_hosts(1, 10.0)
    assert job.agent_lost("tcp://10.0.0.1:1") is None  # nothing to replace: the default


def test_local_job_is_a_job():
    assert issubclass(LocalJob, Job)


# -- a job stopped on purpose stops every mesh on its hosts ---------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("second_host_mesh", [False, True])
def test_stopping_a_job_stops_its_meshes_so_calls_fail_at_once(second_host_mesh):
    """Nobody watches the agents of a stopped job: a mesh left on them (by another HostMesh of the same
    hosts too, as Monarch's ProcessJob gives out) must be stopped with them, or a call waits for ever.
    A call in flight fails as stopped, later ones at once; the procs' exits are no failures."""
    import time

    from _procs import wait_dead
    from actors import Faulty

    from jupyter_mesh import ProcState, SupervisionError

    job = LocalJob(hosts=2)
    try:
        host_mesh = job.host_mesh() if not second_host_mesh else None
        pm = (host_mesh or job.host_mesh()).spawn_procs(per_host={"gpus": 1})
        w = pm.spawn("w", Faulty)
        pids = set(w.pid.call().get(timeout=30).values())
        in_flight = w.sleep.call(30)
        time.sleep(0.2)
    finally:
        job.stop()
    assert pm.stopped and {r.state for r in pm.state().ranks} == {ProcState.STOPPED}
    with pytest.raises(SupervisionError, match="stopped"):
        in_flight.get(timeout=5)
    # known stopped: refused with that cause (waiting on the dead agents would end in MeshTimeoutError)
    with pytest.raises(SupervisionError, match="stopped"):
        w.pid.call().get(timeout=20)
    assert not wait_dead(pids, 5)


# -- a LocalJob starts its agents before its controller ---------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("failing", ["controller", "second_popen", "second_config"])
def test_a_local_job_that_fails_to_start_leaves_no_agent_and_says_nothing_of_them(monkeypatch, capfd, failing):
    """The agents' interpreters start before the controller (they load while it starts, and read their
    configuration once it is up): whatever fails next (the controller, starting the next agent,
    configuring one) must take every one of them, and their templates, along. Silently: an agent
    ended before its configuration used to print "expected a JSON configuration line" each."""
    import os
    import time

    from _procs import descendants, templates_of

    from jupyter_mesh._runtime.controller import Controller

    def refuse(*_a, **_k):
        raise RuntimeError("no controller today")

    started = []
    popen, configure = LocalJob._popen_agent, LocalJob._start_agent

    def record(self):
        if failing == "second_popen" and started:
            raise OSError("no second agent today")
        p = popen(self)
        started.append(p.pid)
        time.sleep(0.5)  # loaded far enough to have started its template
        return p

    def configure_one(self, index, p=None):
        if index == 1:
            raise RuntimeError("no second configuration today")
        configure(self, index, p)

    before = descendants(os.getpid())
    monkeypatch.setattr(LocalJob, "_popen_agent", record)
    if failing == "controller":
        monkeypatch.setattr(Controller, "get", classmethod(refuse))
    elif failing == "second_config":
        monkeypatch.setattr(LocalJob, "_start_agent", configure_one)
    with pytest.raises((RuntimeError, OSError), match="today"):
        LocalJob(hosts=2)
    assert len(started) == (1 if failing == "second_popen" else 2)

    def left() -> set[int]:  # the agents, and their templates (reparented once an agent exits)
        return (descendants(os.getpid()) - before) | {t for a in started for t in templates_of(a)}

    deadline = time.monotonic() + 15
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == set()
    assert "expected a JSON configuration line" not in capfd.readouterr().err


@pytest.mark.integration
def test_a_ctrl_c_while_a_local_job_starts_ends_every_agent_it_started(monkeypatch):
    """Ctrl-C (SIGINT to the main thread) lands while the agents start: held until they all are (a
    KeyboardInterrupt between two Popens, or inside one, left agents and zombies), then the job
    ends every one of them and the KeyboardInterrupt goes on."""
    import os
    import signal
    import time

    from _procs import descendants, templates_of

    started = []
    popen = LocalJob._popen_agent

    def interrupted(self):
        p = popen(self)
        started.append(p.pid)
        if len(started) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # between the second agent and the third
            time.sleep(0.2)
        return p

    before = descendants(os.getpid())
    monkeypatch.setattr(LocalJob, "_popen_agent", interrupted)
    with pytest.raises(KeyboardInterrupt):
        LocalJob(hosts=4)
    assert len(started) == 4  # the interrupt waited for the loop

    def left() -> set[int]:
        return (descendants(os.getpid()) - before) | {t for a in started for t in templates_of(a)}

    deadline = time.monotonic() + 15
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == set()


@pytest.mark.parametrize("preload", [[b"torch"], "torch", [None], [""], ["os; import sys"], ["a/b"]])
def test_a_local_job_refuses_a_preload_that_is_not_module_names_before_starting_anything(monkeypatch, preload):
    def never(self):
        raise AssertionError("an agent was started for a job whose arguments are wrong")

    monkeypatch.setattr(LocalJob, "_popen_agent", never)
    with pytest.raises(MeshValueError, match=r"preload=\.\.\.\) takes module names"):
        LocalJob(1, preload)
