"""Actor classes shared by the integration tests (importable by procs: they get our sys.path)."""

from __future__ import annotations

import asyncio
import atexit
import os
import random
import time

from jupyter_mesh import Actor, concurrent_endpoint, context, current_rank, endpoint


class Counter(Actor):
    def __init__(self, start: int):
        self.n = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    async def whoami(self) -> dict:
        return dict(current_rank())

    @endpoint
    def value(self) -> int:
        return self.n


class Recorder(Actor):
    """Records the order in which messages arrive, to prove FIFO per sender."""

    def __init__(self):
        self.log: list[tuple[str, int]] = []

    @endpoint
    async def note(self, tag: str, n: int, jitter: float = 0.0) -> int:
        if jitter:
            await asyncio.sleep(random.random() * jitter)
        self.log.append((tag, n))
        return n

    @endpoint
    def note_sync(self, tag: str, n: int) -> int:
        self.log.append((tag, n))
        return n

    @endpoint
    def get_log(self) -> list:
        return self.log


class Faulty(Actor):
    @endpoint
    def fail_on(self, ranks: list[int]) -> int:
        r = context().actor_instance.rank.rank
        if r in ranks:
            raise ValueError(f"rank {r} refuses")
        return r

    @endpoint
    def fail_on_else_sleep(self, ranks: list[int], seconds: float) -> int:
        """Ranks in ``ranks`` raise at once; the others answer after ``seconds``."""
        r = context().actor_instance.rank.rank
        if r in ranks:
            raise ValueError(f"rank {r} refuses")
        time.sleep(seconds)
        return r

    @endpoint
    def ok(self) -> str:
        return "fine"

    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def shout(self, text: str) -> None:
        print(text, flush=True)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def unpicklable_result(self):
        import threading

        return threading.Lock()


class BadInit(Actor):
    def __init__(self, fail: bool):
        if fail:
            raise RuntimeError("constructor exploded")

    @endpoint
    def ok(self) -> str:
        return "fine"


class Caller(Actor):
    """Receives other actor meshes and calls them: actor -> actor."""

    @endpoint
    def sync_sum(self, counters) -> int:
        return sum(counters.incr.call(1).get(timeout=10).values())

    @endpoint
    async def async_one(self, counters) -> int:
        return await counters.slice(gpus=0).incr.call_one(10)

    @endpoint
    def choose(self, counters) -> int:
        return counters.value.choose().get(timeout=10)

    @endpoint
    def sleep_on(self, faulty, seconds: float) -> str:
        """Call one actor of another mesh directly and report how it ended."""
        t0 = time.monotonic()
        try:
            faulty.slice(gpus=0).sleep.call_one(seconds).get(timeout=30)
            return "finished"
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__} after {time.monotonic() - t0:.1f}s"

    @endpoint
    def ok_on(self, faulty) -> str:
        return faulty.slice(gpus=0).ok.call_one().get(timeout=10)


class Sleeper(Actor):
    """Counts its calls that finished and those cancelled while running. ``started``: a path prefix;
    each call creates ``{started}{rank}`` once it runs, so a test cancels a running call, not one
    still on its way (a cancel that comes first skips the call: neither count moves)."""

    def __init__(self):
        self.finished = 0
        self.cancelled = 0

    @endpoint
    def busy_loop(self, seconds: float, started: str = "") -> str:
        end = time.monotonic() + seconds
        try:
            # inside the try: a cancel that lands the instant the file exists is still counted
            if started:
                open(f"{started}{context().actor_instance.rank.rank}", "w").close()
            while time.monotonic() < end:
                pass
        except KeyboardInterrupt:
            self.cancelled += 1
            raise
        self.finished += 1
        return "finished"

    @endpoint
    async def nap(self, seconds: float, started: str = "") -> str:
        if started:
            open(f"{started}{context().actor_instance.rank.rank}", "w").close()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return "finished"

    @endpoint
    def counts(self) -> tuple:
        return (self.finished, self.cancelled)


class Lingering(Actor):
    """Slow to die: an ``atexit`` handler of ``exit_s`` seconds (a flush, a checkpoint) runs after a
    SIGTERM's stop; ``cnap`` is a concurrent endpoint."""

    def __init__(self, exit_s: float = 0.0):
        if exit_s:
            atexit.register(time.sleep, exit_s)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def nap(self, seconds: float, started: str = "") -> str:
        if started:
            open(f"{started}{context().actor_instance.rank.rank}", "w").close()
        time.sleep(seconds)
        return "finished"

    @concurrent_endpoint
    async def cnap(self, seconds: float, started: str = "") -> str:
        if started:
            open(f"{started}{context().actor_instance.rank.rank}", "w").close()
        await asyncio.sleep(seconds)
        return "finished"


class Supervisor(Actor):
    """Owns a mesh of its own (spawned from inside this actor) and supervises it."""

    def __init__(self, handle: bool):
        self.handle = handle
        self.seen: list[str] = []
        self.children = None

    @endpoint
    def start_children(self, n: int, on_first: bool = False) -> list:
        """``on_first``: also an actor mesh on the first proc alone, and one stopped (a later death of
        another proc is neither's failure)."""
        from jupyter_mesh import this_host

        self.procs = this_host().spawn_procs(per_host={"workers": n})
        self.children = self.procs.spawn("kids", Faulty)
        if on_first:
            self.procs.slice(workers=0).spawn("first", Faulty).ok.call_one().get(timeout=20)
            gone = self.procs.spawn("gone", Faulty)  # stopped: a later death is not its failure
            gone.ok.call().get(timeout=20)
            gone.stop().get(timeout=20)
        return list(self.children.pid.call().get(timeout=20).values())

    @endpoint
    def call_children(self) -> list:
        return list(self.children.ok.call().get(timeout=10).values())

    @endpoint
    def respawn_children(self) -> list:
        return self.procs.respawn()

    @endpoint
    def seen_failures(self) -> list:
        return self.seen

    def __supervise__(self, failure) -> bool:
        self.seen.append(f"{failure.kind}:{failure.mesh_name}:{dict(failure.coords)}")
        return self.handle


class EnvReader(Actor):
    @endpoint
    def env(self, *names: str) -> dict:
        return {n: os.environ.get(n) for n in names}


class Ticker(Actor):
    """Starts a background task from an async endpoint: it must keep running while the actor idles."""

    def __init__(self):
        self.ticks = 0
        self._task = None

    @endpoint
    async def start(self) -> None:
        async def tick():
            while True:
                self.ticks += 1
                await asyncio.sleep(0.01)

        self._task = asyncio.get_running_loop().create_task(tick())

    @endpoint
    def ticks_now(self) -> int:
        return self.ticks

    @endpoint
    async def ticks_async(self) -> int:
        return self.ticks


class BadStr(Exception):
    def __str__(self):
        raise ValueError("no str for you")


class Tricky(Actor):
    @endpoint
    def raise_bad_str(self) -> None:
        raise BadStr()

    @endpoint
    def first(self, a) -> float:
        return float(a[0])

    @endpoint
    def ok(self) -> str:
        return "fine"

    @endpoint
    def call_other(self, other, seconds: float) -> str:
        try:
            other.slice(gpus=0).ok.call_one().get(timeout=seconds)
            return "answered"
        except Exception as e:  # noqa: BLE001
            return type(e).__name__


class Introspect(Actor):
    """Reads its own host's bookkeeping (tests of the runtime's internals)."""

    @endpoint
    def cancelled_entries(self) -> int:
        from jupyter_mesh._core.context import context

        return len(context().actor.host._cancelled)

    @endpoint
    def ok(self) -> str:
        return "ok"


class FailureReporter(Actor):
    """Returns failures as plain values (as a supervisor reporting what it saw would)."""

    @endpoint
    def failure(self):
        from jupyter_mesh import Failure

        return Failure("kids", {"w": 1}, "signal", "proc 123 was killed by SIGKILL", signal=9)

    @endpoint
    def remote_failure(self):
        from jupyter_mesh import RemoteFailure

        return RemoteFailure({"w": 1}, "kid", "step", "ValueError", "bad input", "Traceback ...")


class Starter(Actor):
    """Starts processes of its own, as a rank's DataLoader workers or a server it runs would be."""

    def __init__(self) -> None:
        self.children: list = []

    @endpoint
    def start(self, own_session: bool = False) -> int:
        import subprocess

        p = subprocess.Popen(["sleep", "300"], start_new_session=own_session)
        self.children.append(p)
        return p.pid

    @endpoint
    def fork_and_leave(self) -> int:
        """A grandchild whose parent (a child of ours) already exited: orphaned to init, still ours."""
        import subprocess

        out = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
        return int(out.stdout.strip())

    @endpoint
    def exit_now(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def ignore_sigterm(self) -> None:
        """As a proc busy in its exit handlers: only a SIGKILL ends it (its agent's, 1 s after its SIGTERM).
        Runs on the proc's main thread (its first actor's sync endpoint), where a handler can be set."""
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
