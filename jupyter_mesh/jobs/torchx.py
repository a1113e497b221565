"""``TorchXJob``: hosts from any TorchX scheduler (``local_cwd``, ``slurm``, Kubernetes, cloud batch, ...).

TorchX (``pip install 'jupyter_mesh[torchx]'``) places the hosts: we give it an app of one role with
``nodes`` replicas, each running our dial-back agent (``jupyter-mesh agent --key-file F --host-index
${replica_id}``), submit it through TorchX's runner, and follow it with TorchX's ``status``. The agents
read the job key like ``SlurmJob``'s (``_dialback``): keys are never on argv or in the environment,
which TorchX writes into scripts and pod specs. The replica's index reaches the agent as a flag
(TorchX's ``replica_id`` macro), since no scheduler-neutral variable carries it (``local_cwd`` sets no
``TORCHX_REPLICA_ID``; SLURM's ``SLURM_PROCID`` counts tasks across TorchX's het-job groups).

What follows from TorchX, not from us:

* ``local_cwd`` runs the replicas as children of this process: its runner (and so this job) is the
  only one that can follow or cancel them. Its scheduler installs its own SIGINT/SIGTERM handlers
  when made; we put ours back, so Ctrl-C stays a ``KeyboardInterrupt``.
* ``slurm`` submits one het-job group per replica and runs them with ``srun --kill-on-bad-exit=1``:
  one agent that dies ends the whole job (``SlurmJob`` loses only that host). Its ``status`` and
  ``cancel`` read ``sacct``, so they need SLURM accounting (``slurmdbd``); without it the agents still
  come up and serve, but the job cannot say what SLURM says, and stopping it falls back to our agents
  exiting (their ``srun`` ends, and the job with it).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .._api.host_mesh import HostMesh
from .._core.context import host_key
from .._core.future import Future
from .._core.shape import Shape
from .._runtime.hosts import AgentHandle, Job
from ..errors import MeshClosedError, MeshError, MeshValueError
from ._dialback import JobFiles, stop_agents, wait_agents

__all__ = ["TorchXJob", "agent_app"]

_LOCAL = ("local_cwd",)  # replicas are processes of this machine: the controller listens on loopback
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")  # a valid app name for every TorchX scheduler (RFC 1123 for k8s)


class TorchXJob(Job):
    """``nodes`` hosts from the TorchX scheduler ``scheduler``, one jupyter_mesh agent on each.

    ``scheduler_args``: TorchX's run options for that scheduler (``partition``, ``time``, ``queue``,
    ``namespace``, ...; ``torchx runopts SCHEDULER`` lists them). ``image``: the replicas' image
    (default: this directory, what ``local_cwd`` and ``slurm`` use); ``resource``: a
    ``torchx.specs.Resource`` per replica. ``bind``: this host's IP that the replicas reach (default:
    loopback for ``local_cwd``, the route to ``slurmctld`` for ``slurm``; other schedulers need it).
    ``python``: the interpreter on the hosts (default: this one). ``preload``: what each host's
    template imports; by default torch and the heavy libraries this program imported, those each host
    has, in the background (``jobs.warm``; ``[]``: nothing)."""

    def __init__(
        self,
        nodes: int = 1,
        scheduler: str = "local_cwd",
        scheduler_args: Mapping[str, Any] | None = None,
        preload: Sequence[str] | None = None,
        bind: str | None = None,
        python: str | None = None,
        image: str | None = None,
        resource: Any = None,
        name: str = "jupyter-mesh",
    ):
        from .._runtime.controller import Controller

        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise MeshValueError(f"TorchXJob needs nodes >= 1, got {nodes!r}")
        if not isinstance(scheduler, str) or not scheduler:
            raise MeshValueError(f"TorchXJob needs a TorchX scheduler name like 'local_cwd', got {scheduler!r}")
        if not _NAME.match(name):
            raise MeshValueError(f"name={name!r}: lower-case letters, digits and '-', starting with a letter")
        self.nodes = nodes
        self.scheduler = scheduler
        self.app_handle: str | None = None
        self._role = name
        self._lock = threading.Lock()  # agents() / stop()
        self._tx = threading.Lock()  # TorchX's runner is not thread-safe (explain_loss comes from the controller)
        self._agents: list[AgentHandle] | None = None
        self._stopped = False
        self._status_error = ""  # why TorchX cannot say the app's state (e.g. slurm without sacct)
        self._status_failed = 0.0  # when it last failed to
        try:
            from torchx.runner import get_runner
        except ImportError as e:
            raise MeshError(
                f"TorchXJob needs TorchX ({e}): pip install 'jupyter_mesh[torchx]' (or `pip install torchx`)"
            ) from None
        with _keep_signals():
            self._runner = get_runner()
        backends = self._runner.scheduler_backends()
        if scheduler not in backends:
            self._runner.close()
            raise MeshValueError(f"TorchX has no scheduler {scheduler!r}: installed are {', '.join(sorted(backends))}")
        cfg = dict(scheduler_args or {})
        try:
            with _keep_signals():  # TorchX makes the scheduler (and may install its signal handlers) here
                opts = self._runner.scheduler_run_opts(scheduler)
            cfg = _checked_cfg(scheduler, opts, cfg)
            ip = bind or _default_bind(scheduler)
            self._controller = Controller.reachable_from(ip)
        except BaseException:
            self._runner.close()
            raise
        self._controller.register_job(self)
        try:
            self._files = JobFiles(self._controller, f"torchx:{scheduler}", nodes, "TorchXJob")
            self._files.save_record(None)  # first: a controller killed from here on leaves a record to sweep
            if opts.get("log_dir") is not None and "log_dir" not in cfg:  # the replicas' output, kept
                cfg["log_dir"] = self._files.log_path[: -len(".log")] + ".logs"
            self._waiters: list[Future[dict[str, Any]]] = self._files.write_key(preload)
            app = agent_app(name, nodes, self._files.key_path, python, image, resource)
            try:
                with self._tx, _keep_signals():
                    info = self._runner.dryrun(app, scheduler, cfg=cfg)
                    self.app_handle = self._runner.schedule(info)
            except Exception as e:  # TorchX's errors (an option of the wrong type, sbatch failing): name them
                bad_input = isinstance(e, ValueError) or type(e).__name__ == "InvalidRunConfigException"
                raise (MeshValueError if bad_input else MeshError)(
                    f"TorchX could not submit the agents to {scheduler!r}: {type(e).__name__}: {e}"
                ) from e
        except BaseException:
            self._stopped = True
            if hasattr(self, "_files"):
                self._files.stop_expecting()
                self._files.cleanup()
            with _keep_signals():
                self._runner.close()
            raise
        self._files.save_record(self.app_handle)

    # -- the Job interface --------------------------------------------------------------------------
    def agents(self, timeout: float = 120.0) -> list[AgentHandle]:
        """Wait until every replica's agent reported in; fail at once if TorchX says the app ended."""
        with self._lock:
            if self._stopped:
                raise MeshClosedError(f"TorchX app {self.app_handle} was stopped; create a new TorchXJob")
            if self._agents is not None:
                return self._agents

            def check(i: int) -> None:
                state, msg = self.state()
                if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    raise MeshError(
                        f"TorchX app {self.app_handle} ended ({state}{f': {msg}' if msg else ''}) before the "
                        f"agent of replica {i} reported in; its output:\n{self._replica_log(i)}"
                    )

            def timed_out(i: int) -> str:
                state, msg = self.state()
                return (
                    f"TorchX app {self.app_handle} is {state}{f' ({msg})' if msg else ''}; {i} of "
                    f"{self.nodes} agents reported in. Its replicas' output is where {self.scheduler} "
                    f"keeps it (`torchx log {self.app_handle}`)"
                )

            out = wait_agents(self._waiters, timeout, check, timed_out)
            self._agents = out
            self._files.save_record(self.app_handle, out)
            self._files.key_read()  # every agent has read it: the session's keys leave the disk
            return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "id": self.app_handle}  # "local_cwd://torchx/app-xyz"

    def running(self) -> bool:
        return not self._stopped

    def explain_loss(self, addr: str) -> str | None:
        """What TorchX says about the app of a lost agent, and whether its process on this host is gone."""
        agent = next((a for a in self._agents or [] if a.addr == addr), None)
        if agent is None or not self._tx.acquire(timeout=2.0):  # stop() holds it while TorchX cancels
            return None
        try:
            with _keep_signals():
                st = self._runner.status(self.app_handle) if self.app_handle else None
        except Exception:  # noqa: BLE001 - the cause the controller has is enough
            st = None
        finally:
            self._tx.release()
        said = []
        if agent.host_key == host_key() and not _alive(agent.pid):  # status() above reaped a local replica
            said.append(f"its process (pid {agent.pid}) exited")
        replica = ""
        for role in st.roles if st is not None else []:
            for r in role.replicas:
                if role.role == self._role and r.id == agent.index:
                    replica = f", replica {agent.index} {r.state.name}"
        if st is not None:
            said.append(f"TorchX app {self.app_handle} is {st.state.name}{replica}")
        return "; ".join(said) or None

    def host_mesh(self) -> HostMesh:
        return HostMesh(self._controller, self, Shape.from_sizes({"hosts": self.nodes}))

    def stop(self, timeout: float = 15.0) -> None:
        """Our agents stop their procs and exit; the app is cancelled through TorchX if it still runs,
        and waited for, so no replica (no process of ours) is left."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._files.stop_expecting()
        stop_agents(self._controller, self._agents or [])
        deadline = time.monotonic() + timeout
        state = self._wait_ended(deadline - timeout / 2)  # agents told to stop exit on their own
        if state not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            try:
                with self._tx, _keep_signals():
                    self._runner.cancel(self.app_handle)
            except Exception as e:  # noqa: BLE001 - say it and what to do; the files still go
                print(
                    f"jupyter_mesh: TorchX could not cancel {self.app_handle} ({type(e).__name__}: {e}); our "
                    f"agents were told to exit. Check it with `torchx status {self.app_handle}`",
                    file=sys.stderr,
                )
            state = self._wait_ended(deadline)
        if state not in ("SUCCEEDED", "FAILED", "CANCELLED") and not self._status_error:
            print(f"jupyter_mesh: TorchX app {self.app_handle} is still {state} after cancel", file=sys.stderr)
        with self._tx, _keep_signals():
            self._runner.close()  # local_cwd: kills what is left of its replicas and ends its log threads
        self._files.cleanup()

    # -- TorchX's view ------------------------------------------------------------------------------
    def state(self) -> tuple[str, str]:
        """(state, message) as TorchX says (``RUNNING``, ``FAILED``, ...); ``UNKNOWN`` with why when
        TorchX cannot tell (``slurm`` without accounting: ``sacct`` fails)."""
        if self.app_handle is None:
            return "UNSUBMITTED", ""
        if self._status_error and time.monotonic() - self._status_failed < 10.0:
            return "UNKNOWN", self._status_error  # asked again later, not every poll (sacct prints each time)
        try:
            with self._tx, _keep_signals():
                st = self._runner.status(self.app_handle)
        except Exception as e:  # noqa: BLE001 - e.g. sacct without slurmdbd (CalledProcessError)
            self._status_error = f"TorchX cannot tell the app's state: {type(e).__name__}: {e}"
            self._status_failed = time.monotonic()
            return "UNKNOWN", self._status_error
        self._status_error = ""
        if st is None:
            return "GONE", "the scheduler no longer knows the app"
        msg = st.msg if st.msg and st.msg != "<NONE>" else ""
        return st.state.name, msg

    def _wait_ended(self, deadline: float) -> str:
        state, _ = self.state()
        while state not in ("SUCCEEDED", "FAILED", "CANCELLED", "GONE") and time.monotonic() < deadline:
            if self._status_error:
                return state  # nothing to wait on
            time.sleep(0.1)
            state, _ = self.state()
        return state

    def _replica_log(self, index: int, n: int = 15) -> str:
        """The last lines of an ended app's replica (TorchX's ``log_lines``; only once the app ended,
        where it does not wait for more)."""
        try:
            with self._tx, _keep_signals():
                lines = list(self._runner.log_lines(self.app_handle, self._role, index))  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - a scheduler without logs: say so
            return f"(TorchX has no output for it: {type(e).__name__}: {e})"
        return "".join(lines[-n:]) or "(empty)"

    def __repr__(self) -> str:
        return f"<TorchXJob {self.app_handle or self.scheduler} nodes={self.nodes}>"


def agent_app(
    name: str, nodes: int, key_path: str, python: str | None = None, image: str | None = None, resource: Any = None
) -> Any:
    """The TorchX app: one role of ``nodes`` replicas, each our dial-back agent with its replica's index
    as ``--host-index`` (a macro TorchX fills in per replica). The key file's path is on argv, the
    key never is."""
    from torchx import specs

    role = specs.Role(
        name=name,
        image=image or os.getcwd(),
        entrypoint=python or sys.executable,
        args=[
            *("-m", "jupyter_mesh.cli", "agent", "--key-file", key_path),
            *("--host-index", specs.macros.replica_id),
        ],
        num_replicas=nodes,
        **({"resource": resource} if resource is not None else {}),
    )
    return specs.AppDef(name=name, roles=[role])


@contextlib.contextmanager
def _keep_signals() -> Iterator[None]:
    """TorchX's local scheduler installs SIGINT/SIGTERM handlers when made in the main thread (they
    raise its own exception): Ctrl-C must stay a KeyboardInterrupt, and a kernel's handlers stay its."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in saved.items():
            if h is not None and signal.getsignal(s) is not h:
                signal.signal(s, h)


def _checked_cfg(scheduler: str, opts: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """TorchX ignores run options it does not know (a typo would be lost silently): refuse them, naming
    the scheduler's. A value given as text (``%mesh up --scheduler-arg prepend_cwd=true``) is read as
    TorchX's CLI reads it, into the option's type."""
    names = sorted(name for name, _ in opts)
    unknown = sorted(k for k in cfg if opts.get(k) is None)
    if unknown:
        raise MeshValueError(
            f"TorchX's {scheduler} scheduler has no option {', '.join(map(repr, unknown))}: its options are "
            f"{', '.join(names) or 'none'}"
        )
    out = {}
    for key, value in cfg.items():
        if isinstance(value, str) and opts.get(key).opt_type is not str:
            value = opts.cfg_from_str(f"{key}={value}").get(key, value)
        out[key] = value
    return out


def _default_bind(scheduler: str) -> str:
    if scheduler in _LOCAL:
        return "127.0.0.1"
    if scheduler == "slurm":
        from .slurm import _slurmctld_ip

        return _slurmctld_ip()
    raise MeshValueError(
        f"TorchXJob(scheduler={scheduler!r}) needs bind='<this host's IP that its hosts reach>' (or "
        f"JUPYTER_MESH_BIND=tcp://<IP>): jupyter_mesh cannot guess where {scheduler} places them"
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
