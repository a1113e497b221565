"""The template (fork server) of a host: a quiet process that imports heavy modules once and forks procs.

The agent starts it with a fresh interpreter and talks to it over a private unix socket
(SOCK_SEQPACKET, one JSON message per packet, file descriptors attached with SCM_RIGHTS). It has no
threads and no ZeroMQ context, so forking it is safe; each child gets the agent's pipes as its
stdout/stderr and becomes a proc. The template reaps its children and reports every exit (code or
signal) to the agent, which is how a dead proc is noticed within milliseconds.

The warm list (torch & co., ``jobs.warm``) is imported by a child of the template while the template
forks on; once done, that warm child forks instead (``_Server``). In a ``LocalJob`` of several hosts the
warm child comes from the job's seed, which imported the list once for all hosts (``seed.py``; the
template's side of it: ``template_seed.py``). Messages go through ``packets.py``. Whichever forks
freezes its objects first (``gc.freeze``), so that a proc's collector leaves the pages it shares alone.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import traceback
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from .packets import recv, send_or_ignore
from .template_seed import SeedSide, seed_link, take_seed_link

if TYPE_CHECKING:
    import subprocess

_PR_SET_PDEATHSIG = 1
_FREEZE = os.environ.get("JUPYTER_MESH_GC_FREEZE") != "0"  # (``_Server._fork``)


def launch(lifeline_r: int) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start a template as a child of this process (its agent): the process, and the agent's end of
    their socket. The template reads the key before anything else on it (``ForkServer`` sends it)."""
    import subprocess

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    argv = [sys.executable, "-m", __spec__.name, str(theirs.fileno()), str(lifeline_r), str(os.getpid())]
    fds = [theirs.fileno(), lifeline_r]
    link = seed_link()
    if link:
        argv.append(link)
        fds.append(int(link.split(":")[0]))
    try:
        proc = subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return proc, ours


class EarlyStart(NamedTuple):
    """A template started before its agent loaded (``agent_main``), with the agent's lifeline pipe:
    the agent adopts both."""

    lifeline_r: int  # the template's and every proc's: EOF once the agent is gone
    lifeline_w: int  # the agent's, held until it exits
    proc: subprocess.Popen[bytes]
    sock: socket.socket


def start_early() -> EarlyStart:
    take_seed_link()
    r, w = os.pipe()
    proc, sock = launch(r)
    return EarlyStart(r, w, proc, sock)


def base_imports() -> None:
    """What every proc needs, imported before the first fork."""
    import cloudpickle  # noqa: F401
    import msgpack  # noqa: F401
    import zmq  # noqa: F401

    from . import client, proc  # noqa: F401


def preload(mods: list[str], if_installed: bool = False) -> list[str]:
    """Import ``mods``; the errors, as text. ``if_installed`` (the warm default): skip the names this
    host does not have, silently (asked with ``find_spec``, which imports nothing of a top-level name)."""
    errors = []
    for m in mods:
        try:
            if if_installed and m not in sys.modules and importlib.util.find_spec(m) is None:
                continue
            importlib.import_module(m)
        except BaseException as e:  # noqa: BLE001 - reported, the proc will raise it again
            errors.append(f"{m}: {type(e).__name__}: {e}")
    return errors


def _child(
    sock: socket.socket, close: list[int], fds: list[int], cfg: dict[str, Any], key: bytes, lifeline: int
) -> None:
    """Runs in the forked child; becomes a proc. A stopped proc leaves by ``SystemExit`` through the
    template's frames, so its interpreter finalizes as at any normal exit; everything else ends here."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCONT, signal.SIG_DFL)  # (the template's: ``_Server.die_with``)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (the template ignores it; a proc ends on it)
        try:  # die with the template (and so with the agent), even if never told
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except Exception:  # noqa: BLE001 - not Linux: the lifeline pipe still covers it
            pass
        if os.getppid() != cfg["template_pid"]:
            os._exit(71)
        # a process group of its own: what it starts (DataLoader workers, a server) ends with it
        # (``_end_group``), unless that started a session of its own
        os.setpgid(0, 0)
        sock.close()
        for fd in close:  # the template's own: its wake-up pipe, the socket to its warming child
            os.close(fd)
        out_fd, err_fd = fds
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.close(out_fd)
        os.close(err_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered: prints show promptly
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        _own_random_state()
        from . import proc

        code = proc.main(cfg, key, lifeline)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(3)
    raise SystemExit(code)


def _end_group(warm_pid: int) -> int:
    """A child that ended, not yet reaped (0 if none): if it was a proc, what is left of its process
    group is killed first. Its pid is the group's id, and an unreaped child's pid cannot be taken by
    another process, so this kills nobody else's group."""
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0
    if info is None:
        return 0
    if info.si_pid != warm_pid:  # (a warm child is in ours: it never made a group)
        try:
            os.killpg(info.si_pid, signal.SIGKILL)
        except OSError:  # no group left (or it never made one)
            pass
    return info.si_pid


def _own_random_state() -> None:
    """Every proc forks from this template's random state; a separately started process seeds
    Python's ``random``, numpy's global generator and torch's CPU generator from the OS's entropy, so
    each proc must too (``random`` reseeds itself at fork; numpy and torch do not: every rank drew the
    same dropout masks). CUDA's generators are made by each proc when it first uses CUDA, as anywhere."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    try:
        if torch is not None:
            torch.random.default_generator.seed()
    except Exception:  # noqa: BLE001 - not the torch we know (a stub): nothing of it to reseed
        pass


def wake_pipe() -> tuple[int, int]:
    """A pipe that SIGCHLD writes to (``set_wakeup_fd``), so ``select`` sees a child's exit."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, False)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return r, w


class _Server(SeedSide):
    """One template's loop: read the agent's requests, fork, reap and report.

    The warm list (``if_installed``: torch and co.) is imported by a child of this template, the *warm
    child*, so that a spawn that asked not to wait (``spawn_procs(warm=False)``: ``warm_wait`` false)
    forks at once meanwhile, cold. The other forks are held until the warm child is ready; then this
    template hands it what it holds and the agent's socket: the warm child forks everything from then
    on, and this one only reaps its own children. It exits when the warm child dies, so the agent sees
    its fork server gone and starts a new one, as for any template.

    In a ``LocalJob`` of several hosts the warm child comes from the job's seed (``seed.py``), already
    warm, instead of from this template: it says hello, this template gives it the agent's socket, the
    lifeline and the key (``adopt``), and the handover goes on as above. Not being its parent, this
    template learns of its death by their socket's EOF and of how from the seed.
    """

    def __init__(self, sock: socket.socket, lifeline: int) -> None:
        self.sock, self.lifeline = sock, lifeline
        self.key = b""
        self.r, self.w = wake_pipe()
        self.reading = True  # False once a warm child serves the agent's socket
        self.warming: socket.socket | None = None  # to the warm child, until it takes over
        self.warm_pid = 0
        self.held: list[tuple[dict[str, Any], list[int]]] = []  # forks that wait for the warm child
        self.later: list[tuple[list[str], bool]] = []  # preloads asked for after it forked: it imports them too
        self.hand: socket.socket | None = None  # in the warm child: to the template, until it takes over
        self.seed: socket.socket | None = None  # the link to the job's seed (``seed.py``), if any
        self.seed_pid = 0
        self.seeded = False  # the warm child (``warming``) comes from the seed
        self.warm_modules: list[str] = []  # what it was asked to import (a seeded one: what to check)
        self.handed: socket.socket | None = None  # to a seeded warm child once it took over: EOF, it died
        self.seed_exits: dict[int, int] = {}  # the seed's children's exit statuses, as it reported them
        self.keep_hand = False  # in a seeded warm child: the template's death (``hand``'s EOF) ends it
        self.procs: set[int] = set()  # the procs this process forked and has not reaped (``end_procs``)

    # -- its life -----------------------------------------------------------------------------------
    def tell(self, obj: dict[str, Any], sock: socket.socket | None = None) -> None:
        """Send to the agent (or to ``sock``, the template of a warm child): if it is gone, so are we."""
        if not send_or_ignore(self.sock if sock is None else sock, obj):
            self.leave()

    def leave(self, code: int = 0) -> NoReturn:
        """Exit, ending our procs' process groups first: they die with us (PR_SET_PDEATHSIG) and what
        they started would otherwise live on, with nobody left to end it."""
        self.end_procs()
        os._exit(code)

    def end_procs(self) -> None:
        """Kill each proc this process forked and has not reaped, and what is left of its process
        group. An unreaped child's pid, its group's id, cannot be anyone else's: no other group is hit."""
        for pid in list(self.procs):
            for kill in (os.killpg, os.kill):  # its group; itself, should it not have made one yet
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def die_with(self, parent: int) -> None:
        """Leave when ``parent`` dies (the agent; a warm child's template), even while busy in a long
        preload, when nobody reads the socket whose EOF would say so.

        The parent-death signal (PR_SET_PDEATHSIG) is SIGCONT, caught: a SIGKILL left no time to end
        our procs' groups, and nobody else can (the agent is gone). SIGCONT, unlike any other signal,
        also resumes a stopped process, so a stopped one ends as before. A resume by hand sends it too:
        then our parent is still there."""
        me = os.getpid()

        def on_sigcont(signum: int, frame: Any) -> None:
            if os.getpid() == me and os.getppid() != parent:  # (a fresh fork runs this until it resets it)
                self.leave()

        signal.signal(signal.SIGCONT, on_sigcont)
        signal.siginterrupt(signal.SIGCONT, False)  # a resume by hand fails no system call (an import's)
        try:
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGCONT)
        except Exception:  # noqa: BLE001 - not Linux: the socket's EOF still ends us, once read
            pass
        if os.getppid() != parent:
            self.leave()  # it died before the line above took effect

    # -- the loop -----------------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            # this round's sockets, each with its handler: a handler may replace or close another's
            # socket (a takeover, a fallback), which must then not be read as if it were still the one
            # that select saw ready
            watch: list[tuple[str, Any]] = [("warming", self._from_warm_child), ("seed", self._from_seed)]
            if self.reading:  # (held forks do not stop it: a warm=False spawn behind them forks at once)
                watch.append(("sock", self._from_agent))
            watch.append(("handed", self._seeded_child_died))
            if self.keep_hand:
                watch.append(("hand", self._template_gone))
            round_ = [(name, getattr(self, name), handler) for name, handler in watch]
            round_ = [(name, s, handler) for name, s, handler in round_ if s is not None]
            try:
                ready, _, _ = select.select([self.r, *(s for _, s, _ in round_)], [], [])
            except InterruptedError:
                continue
            if self.r in ready:
                self._reap()
            for name, s, handler in round_:
                if s in ready and getattr(self, name) is s and (name != "sock" or self.reading):
                    handler()

    def _from_agent(self) -> None:
        msg, fds = recv(self.sock)
        if msg is None:
            self.leave()  # the agent is gone
        op = msg["op"]
        if op == "key":
            self.key = bytes.fromhex(msg["key"])
        elif op == "preload":
            if_installed = bool(msg.get("if_installed"))
            if if_installed and self.warming is None and not self.warm_pid:
                self.warm_modules = list(msg["modules"])
                if not self._ask_seed():
                    self._start_warm_child(self.warm_modules)
                return
            if self.warming is not None:  # the warm child imports it too, before it takes over
                self.later.append((msg["modules"], if_installed))
                if if_installed:
                    return
            errors = preload(msg["modules"], if_installed)
            self.tell({"op": "preloaded", "token": msg["token"], "errors": errors})
        elif op == "fork":
            if self.warming is not None and msg["cfg"].get("warm_wait", True):
                self.held.append((msg, fds))
            else:
                self._fork(msg, fds)

    def _fork(self, msg: dict[str, Any], fds: list[int]) -> None:
        cfg = msg["cfg"]
        cfg["template_pid"] = os.getpid()
        # a proc's collector must not walk what it inherits: it writes to every object it walks, and with
        # torch a first full collection took ~80 ms and made ~42 MiB of shared pages private in each proc
        # (``benchmarks/bench_fork_memory.py``); frozen objects are never walked. (No collection first:
        # after torch's import it costs ~50 ms, on the path of a script's first spawn, and finds ~20.)
        # The price: cycles among those objects are never collected in a proc (README, "warm");
        # ``JUPYTER_MESH_GC_FREEZE=0`` where the agent runs opts out.
        if _FREEZE:
            gc.freeze()
        pid = os.fork()
        if pid > 0:
            self.procs.add(pid)
        if pid == 0:
            for private in (self.warming, self.hand, self.seed, self.handed):  # ours: not the proc's
                if private is not None:
                    private.close()
            for _, other in self.held:  # other spawns' pipes, held for the warm child: a proc holding
                for fd in other:  # them would keep their output open after they die
                    os.close(fd)
            _child(self.sock, [self.r, self.w], fds, cfg, self.key, self.lifeline)
        for fd in fds:
            os.close(fd)
        self.tell({"op": "forked", "token": msg["token"], "pid": pid})

    def _reap(self) -> None:
        try:
            while os.read(self.r, 512):
                pass
        except BlockingIOError:
            pass
        while True:
            pid = _end_group(self.warm_pid)
            if pid <= 0:
                return
            self.procs.discard(pid)  # before it is reaped: ``end_procs`` signals unreaped pids only
            try:
                _, status = os.waitpid(pid, 0)  # (it has ended: no wait)
            except ChildProcessError:
                continue
            code = os.waitstatus_to_exitcode(status)
            if pid == self.warm_pid:
                self._warm_child_died(code)
                continue
            self.tell(
                {"op": "exit", "pid": pid, "code": code if code >= 0 else None, "signal": -code if code < 0 else None},
            )

    # -- the warm child -------------------------------------------------------------------------------
    def _start_warm_child(self, modules: list[str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            self._become_warm_child(theirs, modules, parent)
        theirs.close()
        self.warming, self.warm_pid = ours, pid
        self.tell({"op": "warming", "pid": pid})  # the agent watches it for a stop while forks wait

    def _from_warm_child(self) -> None:
        assert self.warming is not None
        msg, _ = recv(self.warming)
        if msg is None:  # it died before taking over; its exit, reaped, says how (``_warm_child_died``)
            self.warming.close()
            self.warming = None
            if self.seeded:  # or the seed refused, or is gone: this host warms up alone
                self.seeded, self.warm_pid = False, 0
                self._start_warm_child(self.warm_modules)
            return
        if msg["op"] == "hello" and self.seeded:  # the seed's child: give it what a forked one inherits
            self.warm_pid = int(msg["pid"])
            self.tell({"op": "warming", "pid": self.warm_pid})
            adopt = {"op": "adopt", "key": self.key.hex(), "modules": self.warm_modules}
            send_or_ignore(self.warming, adopt, [self.sock.fileno(), self.lifeline])  # (gone: EOF next)
        elif msg["op"] == "ready":  # it imported the warm list: hand it what waits, then the socket
            try:
                self.warming.send(json.dumps({"op": "later", "preloads": self.later}).encode())
                for held, fds in self.held:
                    socket.send_fds(self.warming, [json.dumps(held).encode()], fds)
                self.warming.send(json.dumps({"op": "yours"}).encode())
            except OSError as e:  # it died in the handover: which of the forks it got did it make?
                self._handover_failed(e)  # Unknown, so the host's fork server ends, and says why
            for _, fds in self.held:
                for fd in fds:
                    os.close(fd)
            if self.seeded:  # its EOF from now on: it died (``_seeded_child_died``)
                self.handed = self.warming
            else:
                self.warming.close()
            self.warming, self.held, self.later, self.reading = None, [], [], False

    def _handover_failed(self, e: OSError) -> None:
        try:
            os.kill(self.warm_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.seeded:
            code = self._seed_exit(self.warm_pid)
        else:
            _, status = os.waitpid(self.warm_pid, 0)
            code = os.waitstatus_to_exitcode(status)
        why = os.strerror(e.errno) if e.errno else str(e)
        self._ending(code, f"while it took over from the template ({why})")
        self.leave(1)

    def _ending(self, code: int | None, when: str = "") -> None:
        """Tell the agent why this fork server ends: its warm child (``pid``) died. Without it the
        agent would only see this template's own exit (code 0 or 1), not the warm child's signal.
        ``code`` None: a seeded warm child whose seed did not say (gone, or stopped)."""
        if code is None:
            why = "is gone" if self.seed is None else "did not say (is it stopped?)"
            when = ", ".join(w for w in (when, f"how is unknown: the job's seed, its parent, {why}") if w)
        self.tell({"op": "ending", "pid": self.warm_pid, "code": code, "when": when})

    def _warm_child_died(self, code: int) -> None:
        if not self.reading:
            self._ending(code)
            self.leave()  # it served the agent: its procs died with it; our exit tells the agent
        # it died warming: this template serves on, without the warm list
        self.warm_pid = -1  # (not 0: no second warm child)
        self.tell({"op": "serving", "pid": os.getpid()})  # we fork on: nobody else to watch
        if self.warming is not None:
            self.warming.close()
            self.warming = None
        how = f"exit code {code}" if code >= 0 else f"signal {-code}"
        self.tell({"op": "preloaded", "token": 0, "errors": [f"the warm-up import died ({how})"]})
        self.later = []
        while self.held:  # (each taken out first: the next fork closes the pipes still held, not its own)
            m, fds = self.held.pop(0)
            self._fork(m, fds)

    def _become_warm_child(self, hand: socket.socket, modules: list[str], parent: int) -> None:
        """Runs in the forked warm child: import the warm list, then take the agent's socket over."""
        self.procs = set()  # the template's
        self.die_with(parent)
        os.close(self.r)
        os.close(self.w)
        self.r, self.w = wake_pipe()  # our own: the template's pipe would hear its children, not ours
        self._drop_seed()
        self.warming, self.warm_pid, self.held, self.later, self.reading = None, 0, [], [], False
        self._take_over(hand, preload(modules, True))

    def _take_over(self, hand: socket.socket, errors: list[str]) -> None:
        """In a warm child, its imports done: take what the template holds, then the agent's socket."""
        self.hand = hand
        self.tell({"op": "ready"}, hand)
        while True:
            msg, fds = recv(hand)
            if msg is None:
                self.leave()  # the template died
            if msg["op"] == "later":  # preloads the template was asked for while we imported
                for mods, if_installed in msg["preloads"]:
                    errors += preload(mods, if_installed)
                # the agent watches us from now on (a stopped fork server is one that forks)
                self.tell({"op": "serving", "pid": os.getpid()})
                if errors:
                    self.tell({"op": "preloaded", "token": 0, "errors": errors})
            elif msg["op"] == "fork":
                self._fork(msg, fds)
            elif msg["op"] == "yours":
                break
        if not self.keep_hand:
            hand.close()
            self.hand = None
        self.reading = True
        self.serve()
        os._exit(0)


def serve_from_seed(hand: socket.socket) -> None:
    """Runs in a warm child the job's seed forked for a template (``seed.py``), with everything
    imported: get the agent's socket, the lifeline and the key from the template, then serve as its
    warm child. Procs forked here leave through these frames (``_child``)."""
    # a session of its own, as each host's agent has: the scheduler shares the CPU among sessions
    # (autogroups), and a host's procs must not share one slice with every other host's (the seed's)
    os.setsid()
    if not send_or_ignore(hand, {"op": "hello", "pid": os.getpid()}):
        os._exit(0)
    msg, fds = recv(hand)
    if msg is None or msg.get("op") != "adopt" or len(fds) != 2:
        os._exit(0)  # the template died, or is not one
    server = _Server(socket.socket(fileno=fds[0]), fds[1])
    server.key = bytes.fromhex(msg["key"])
    server.keep_hand = True
    server._take_over(hand, preload(list(msg["modules"]), True))


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    lifeline = int(sys.argv[2])
    os.set_inheritable(lifeline, True)
    server = _Server(sock, lifeline)
    # the agent starts us from its main thread (a new one from its I/O thread): each lives as long as it
    server.die_with(int(sys.argv[3]) if len(sys.argv) > 3 else os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for procs, delivered by the agent
    # and so is a termination: a scancel (or a kill of the process group) sends SIGTERM to the agent
    # and to us at once; dead first, we made the agent report every proc as killed with its fork
    # server, not with the agent's own "got SIGTERM". The agent ends us (SIGKILL) as it exits
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if len(sys.argv) > 4:  # a link to the job's seed, FD:PID (``seed.py``)
        fd, pid = sys.argv[4].split(":")
        server.seed, server.seed_pid = socket.socket(fileno=int(fd)), int(pid)
    base_imports()
    server.tell({"op": "ready", "pid": os.getpid()})
    server.serve()


if __name__ == "__main__":
    main()
