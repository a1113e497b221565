"""``LocalJob``: agents on this machine.

``LocalJob`` starts agents as children of this program (the embedded default behind ``this_host()``).
A job never manages a cluster itself: a scheduler places hosts, our agent only starts procs on the
host it runs on.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from .._api.host_mesh import HostMesh
from .._core.future import Future, time_left
from .._core.shape import Shape
from .._runtime import interrupts, seed
from .._runtime.hosts import AgentHandle, Job
from .._wire.protocol import VERSION, Kind
from ..errors import MeshClosedError, MeshError, MeshTimeoutError, MeshValueError
from ._monarch import JobState, host_names
from .warm import default_preload, is_module_name

__all__ = ["BootstrapCommand", "LocalJob", "default_bootstrap_cmd", "this_host"]


class LocalJob(Job):
    """``hosts`` agents on this machine. One host is what ``this_host()`` gives; more is for testing
    the multi-host paths (fan-out, per-host gathering) without a cluster.

    Monarch's form, ``LocalJob(hosts=("trainers", "loaders"))``, names host meshes, each this machine:
    one agent, and ``state().trainers`` is its host mesh with no dims, as Monarch's ``this_host()``
    (``LocalJob().state().hosts`` too)."""

    def __init__(
        self,
        hosts: int | Sequence[str] = 1,
        preload: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ):
        """``preload``: what each host's template imports once, for every proc it forks; by default
        torch when installed and the heavy libraries already imported here (``jobs.warm``; opt out with
        ``JUPYTER_MESH_WARM=0``), ``[]`` for nothing."""
        from .._runtime.controller import Controller

        self._names: tuple[str, ...] = ("hosts",)
        if not isinstance(hosts, (int, str)) and isinstance(hosts, Sequence):  # Monarch's: names of host meshes
            self._names, hosts = host_names(hosts), 1
        if not isinstance(hosts, int) or hosts < 1:
            raise MeshValueError(f"LocalJob needs hosts >= 1, got {hosts!r}")
        if preload is not None:  # checked before any agent starts: a bad name fails here, not in each agent
            names = None if isinstance(preload, (str, bytes)) else list(preload)
            if names is None or not all(isinstance(m, str) and is_module_name(m) for m in names):
                raise MeshValueError(
                    f"LocalJob(preload=...) takes module names, a list of str (e.g. ['torch']), got {preload!r}"
                )
            preload = names
        self._env = {**os.environ, **env} if env else None  # the agents' (and so their procs') environment
        self._n = hosts
        # named: every fork waits for it; the default is warm: forks need not wait (``_runtime.template``)
        self._preload, self._warm = ([], default_preload()) if preload is None else (list(preload), [])
        self._seed: seed.Seed | None = None  # imports the warm list once for all hosts (``_runtime.seed``)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._waiters: list[Future[dict[str, Any]]] = []
        self._agents: list[AgentHandle] | None = None
        self._lost: set[int] = set()  # host indices whose agent is gone: replaced on next use
        self._stopped = False
        # the agents' interpreters (and their templates) start first, while this process starts its
        # controller; each reads its configuration from stdin once it has loaded (the templates then
        # warm up while the user writes code). Whatever fails on the way takes every one of them along.
        early: list[subprocess.Popen[bytes]] = []
        held = interrupts.hold()  # Ctrl-C waits until every agent runs configured, or all are ended
        try:
            try:
                if hosts > 1 and self._warm and seed.enabled():
                    # the agents' environment as it is now; one added later in another is refused by the
                    # seed (``seed.mismatch``) and warms up alone, as without a seed
                    self._seed = seed.Seed(self._warm, dict(os.environ) if self._env is None else self._env)
                for _ in range(hosts):
                    early.append(self._popen_agent())
                self._controller = Controller.get()
                for i, p in enumerate(early):
                    self._start_agent(i, p)
                self._controller.register_job(self)
                if held and interrupts.take():  # came meanwhile: the job goes, as if it never started
                    raise KeyboardInterrupt
            except BaseException:
                self._stopped = True  # (their exit watchers report nothing)
                _drop(early)
                if self._seed is not None:
                    self._seed.stop()
                raise
        finally:
            if held:
                interrupts.release()

    def _popen_agent(self) -> subprocess.Popen[bytes]:
        env, fds, link = self._env, [], None
        if self._seed is not None:  # its end of a link to the seed, a file descriptor only (``_runtime.seed``)
            link = self._seed.link()
            env, fds = {**(env or os.environ), seed.LINK_ENV: f"{link.fileno()}:{self._seed.pid}"}, [link.fileno()]
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "jupyter_mesh._runtime.agent_main"],
                stdin=subprocess.PIPE,
                env=env,
                pass_fds=fds,
                start_new_session=True,  # a notebook interrupt (SIGINT to the kernel's group) must not reach it
            )
        finally:
            if link is not None:
                link.close()

    @property
    def seed_pid(self) -> int | None:
        """The pid of the process that imports the warm list once for all this job's hosts (a job of
        several hosts, warm; ``JUPYTER_MESH_SEED=0`` opts out), else None."""
        return self._seed.pid if self._seed is not None else None

    def _start_agent(self, index: int, p: subprocess.Popen[bytes] | None = None) -> None:
        """Configure agent ``index`` (started now, unless ``p`` is one started already)."""
        nonce = secrets.token_hex(8)
        waiter = self._controller.expect_agent(nonce)
        curve = self._controller.transport.curve
        cfg = {
            "v": VERSION,  # the agent refuses a controller of another wire protocol
            "key": self._controller.key.hex(),
            "bind": self._controller.transport.bind,  # its private socket directory (same host)
            "curve": curve.to_wire() if curve else None,  # TCP: the session's CURVE keys, like the key
            "controller": self._controller.address,
            "host_index": index,
            "preload": self._preload,
            "warm": self._warm,
            "nonce": nonce,
            "hb_timeout": self._controller.hb_timeout,
            "nested": self._controller.embedded,  # started by an actor inside a proc
            "stdin_lifeline": True,  # our death closes its stdin: a silent (busy) controller is alive
        }
        if p is None:
            p = self._popen_agent()
        stdin: IO[bytes] = p.stdin  # type: ignore[assignment]
        try:
            stdin.write(json.dumps(cfg).encode() + b"\n")  # the key travels over this private pipe only
            stdin.flush()  # stdin stays open: its EOF is the agent's signal that we are gone
        except BrokenPipeError:  # it died while it loaded: _watch reports its exit to whoever waits
            pass
        if index < len(self._procs):  # a replacement for a lost agent
            self._procs[index], self._waiters[index] = p, waiter
        else:
            self._procs.append(p)
            self._waiters.append(waiter)
        threading.Thread(target=self._watch, args=(index, p, waiter), name=f"agent-{index}-exit", daemon=True).start()

    def _watch(self, index: int, p: subprocess.Popen[bytes], up: Future[dict[str, Any]]) -> None:
        """An agent that exits while its job runs is lost at once (ms), not after a heartbeat timeout."""
        code = p.wait()
        if self._stopped or self._controller.is_closed:
            return
        if not up._done():  # it exited before its hello: whoever waits for it learns now, not at a timeout
            up._wait(1.0)  # a refusal (another protocol version) says why in a hello of its own
            how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            up._set_exception(
                MeshError(f"the agent of host {index} (pid {p.pid}) {how} before it reported in; its stderr says why")
            )
            return
        if up.exception() is None:
            how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            self._controller.agent_lost(up.result()["addr"], f"its process (pid {p.pid}) {how}")

    def agent_lost(self, addr: str) -> None:
        """From the controller: the agent at ``addr`` is gone for good. Make sure its process is (a stalled
        one must not wake up), and start a fresh agent for that host when the job is next used."""
        for a in self._agents or []:
            if a.addr == addr:
                self._lost.add(a.index)
                try:
                    self._procs[a.index].kill()
                except OSError:
                    pass

    def agents(self, timeout: float = 60.0) -> list[AgentHandle]:
        if self._stopped:
            raise MeshClosedError("this job was stopped; create a new one")
        for i in sorted(self._lost):  # a lost host gets a fresh agent: new meshes work, old ones stay failed
            self._lost.discard(i)
            print(f"jupyter_mesh: the agent of host {i} was lost; starting a new one", file=sys.stderr)
            old = self._procs[i]
            old.wait()
            if old.stdin is not None:
                old.stdin.close()
            self._start_agent(i)
            self._agents = None
        if self._agents is None:
            out = []
            deadline = time.monotonic() + timeout  # the agents start together: one bound for all
            for i, (w, p) in enumerate(zip(self._waiters, self._procs)):
                try:
                    h = w.get(time_left(deadline))
                except MeshTimeoutError:
                    code = p.poll()
                    why = f"it exited with code {code}" if code is not None else "it did not report in"
                    raise MeshTimeoutError("spawn", timeout, f"agent {i} on this host did not start: {why}") from None
                out.append(AgentHandle(i, h["addr"], h["pid"], h["hk"]))
            self._agents = out
        return self._agents

    def add_hosts(self, n: int, timeout: float = 60.0) -> list[AgentHandle]:
        """Start ``n`` more agents (hosts); used when a proc mesh grows along ``hosts``."""
        if self._stopped:
            raise MeshClosedError("this job was stopped; create a new one")
        have = self.agents(timeout)
        for i in range(self._n, self._n + n):
            self._start_agent(i)
        self._n += n
        self._agents = None
        return self.agents(timeout)[len(have) :]

    def host_mesh(self) -> HostMesh:
        return HostMesh(self._controller, self, Shape.from_sizes({"hosts": self._n}))

    def state(self, cached_path: Any = None) -> JobState:
        """Monarch's: the job's host meshes by name (``hosts`` unless named): one host has no dims, as
        Monarch's (``this_host()``'s); ``LocalJob(n)`` with n > 1 keeps its ``hosts`` dim. ``cached_path``
        is accepted and unused: nothing outlives this program here."""
        if self._stopped:
            raise MeshClosedError("this LocalJob was stopped; create a new one")
        hosts = self.host_mesh() if self._n > 1 else self.host_mesh().slice(hosts=0)
        return JobState(dict.fromkeys(self._names, hosts))

    def kill(self) -> None:
        """Monarch's name for :meth:`stop`."""
        self.stop()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        from .._runtime.controller import Controller
        from .._wire.transport import Message

        ctl = Controller._instance
        if ctl is not None and not ctl.is_closed:
            ctl.agents_stopping([a.addr for a in self._agents or []])
        for a in self._agents or []:  # "stop, we are still here" (closing stdin alone means we died)
            try:
                if ctl is not None and not ctl.is_closed:
                    ctl.transport.send(a.addr, Message({"k": Kind.SHUTDOWN}))
            except Exception:  # noqa: BLE001 - the pipe below stops it anyway
                pass
        for p in self._procs:
            try:
                if p.stdin:
                    p.stdin.close()
            except OSError:
                pass
        for p in self._procs:
            try:
                p.wait(3.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(3.0)
        if ctl is not None and not ctl.is_closed:
            ctl.forget_agents([a.addr for a in self._agents or []])
        if self._seed is not None:
            self._seed.stop()

    def running(self) -> bool:
        return not self._stopped

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __repr__(self) -> str:
        return f"<LocalJob hosts={self._n}>"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@dataclass
class BootstrapCommand:
    """How a host's agent starts (what ``default_bootstrap_cmd()`` gives, as in Monarch): run
    ``program *args`` with ``env`` added; the agent then forks every proc of its host."""

    program: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def with_env(self, env: Mapping[str, str]) -> BootstrapCommand:
        """A copy with ``env`` added (Monarch's; this one is unchanged): ``spawn_procs(bootstrap_command=)``
        gives the new procs that environment."""
        return BootstrapCommand(self.program, list(self.args), {**self.env, **env})

    def proc_env(self) -> dict[str, str]:
        """What ``spawn_procs(bootstrap_command=self)`` applies: the environment. Procs fork from their host's
        agent, so another program or arguments cannot apply, and say so."""
        default = default_bootstrap_cmd()
        agent = [["-m", m] for m in ("jupyter_mesh._runtime.agent_main", "jupyter_mesh._runtime.agent_boot")]
        if os.path.realpath(self.program) != os.path.realpath(default.program) or self.args not in agent:
            raise MeshValueError(
                f"procs fork from their host's agent ({default.program} {' '.join(default.args)}), so only the "
                f"environment of a bootstrap command applies, not {self.program} {' '.join(self.args)}; use "
                "default_bootstrap_cmd().with_env({...})"
            )
        return dict(self.env)


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command that starts a host agent with this program's interpreter."""
    return BootstrapCommand(sys.executable, ["-m", "jupyter_mesh._runtime.agent_main"])


_this_host: HostMesh | None = None
_this_host_lock = threading.Lock()  # the mesh kernel warms it from a thread while a cell may ask for it


def this_host(preload: Sequence[str] | None = None) -> HostMesh:
    """The host mesh of this machine: one host and no dims, as in Monarch, so
    ``this_host().spawn_procs(per_host={"gpus": 4})`` has dims ``{"gpus": 4}`` (and
    ``per_host={"hosts": 1, "gpus": 4}`` names a ``hosts`` dim itself). Its agent starts on first use;
    ``LocalJob(n).host_mesh()`` is the one with a ``hosts`` dim (what ``%mesh up`` uses).

    ``preload`` (default: ``$JUPYTER_MESH_PRELOAD``, comma separated, or else ``jobs.warm``'s default:
    torch when installed) names modules that the host's template process imports once, so procs forked
    from it start with them loaded. The agent and template start now, in the background: only a spawn
    waits for them.
    """
    global _this_host
    from .._runtime.controller import Controller

    ctl = Controller.get()
    with _this_host_lock:
        if _this_host is None or _this_host._controller is not ctl or not _this_host._job.running():
            if preload is None:
                named = [m.strip() for m in os.environ.get("JUPYTER_MESH_PRELOAD", "").split(",") if m.strip()]
                preload = named or None
            _this_host = LocalJob(1, preload).host_mesh().slice(hosts=0)
        return _this_host


def _drop(agents: list[subprocess.Popen[bytes]]) -> None:
    """The agents of a job that failed to start: SIGTERM ends each at once and silently before its
    configuration (a clean shutdown after), EOF on its stdin too; SIGKILL if it lingers; each waited
    for, so no zombie. Their templates follow (their lifeline pipes close). All are signalled before
    any is waited for."""
    for p in agents:
        try:
            p.terminate()
            if p.stdin is not None:
                p.stdin.close()
        except OSError:
            pass
    deadline = time.monotonic() + 10.0
    for p in agents:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
