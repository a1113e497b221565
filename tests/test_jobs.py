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
