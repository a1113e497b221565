"""A controller program for tests/test_pid_namespace.py (python pidns_driver.py KEY_FILE): one agent
started in a pid namespace of its own (``unshare --pid``), on this machine's network, as in a container
run with ``--network=host``; the controller attaches to it over TCP. One JSON line per step; a failure
exits 1. Its own process because such a controller listens on TCP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))


def say(step: str, **kw) -> None:
    print(json.dumps({"step": step, **kw}), flush=True)


def main() -> None:
    key = sys.argv[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    unshare = [] if mode == "mismatch" else ["unshare", "--pid", "--fork", "--mount-proc"]
    env = {**os.environ, "JUPYTER_MESH_MAX_FRAME": str(2 << 20)} if mode == "mismatch" else None
    agent = subprocess.Popen(
        [*unshare, sys.executable, "-m", "jupyter_mesh.cli", "agent", "--listen", addr, "--key-file", key, "--once"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    try:
        line = agent.stdout.readline().decode()  # type: ignore[union-attr]
        assert "waiting to be attached" in line, line
        from payload_actors import Sink, digest, make_payload

        from jupyter_mesh import attach_to_workers

        if mode == "mismatch":  # the agent takes frames up to 2 MiB, we up to the default
            try:
                attach_to_workers([addr], key_file=key, preload=[]).spawn_procs(per_host={"gpus": 1})
                say("attached", error="")
            except Exception as e:  # noqa: BLE001 - what the user sees is the point
                say("attached", error=f"{type(e).__name__}: {e}")
            try:
                agent.wait(timeout=30)  # told to stop (--once: then it exits)
                say("agent", exited=True)
            except subprocess.TimeoutExpired:
                say("agent", exited=False)
            say("done")
            return
        hosts = attach_to_workers([addr], key_file=key, preload=[])
        pm = hosts.spawn_procs(per_host={"gpus": 2})
        sink = pm.spawn("sink", Sink)
        say("up", procs=len(sink.make.call("small").get(60)))
        if mode == "limit":  # JUPYTER_MESH_MAX_FRAME is 1 MiB, here and there
            limit(sink, make_payload)
            return
        name, want = "tensor_1m", digest(make_payload("tensor_1m"))
        got = sink.make.call("tensor:2097152").get(30)  # gathered: each rank's result goes straight here
        say("call", ok=[digest(v) for v in got.values()] == [digest(make_payload("tensor:2097152"))] * 2)
        one = sink.slice(gpus=1).echo.call_one(make_payload(name)).get(30)  # 1 MiB both ways
        say("call_one", ok=digest(one) == want)
        pm.stop(timeout=10)
        say("done")
    finally:
        try:
            os.killpg(agent.pid, signal.SIGKILL)  # (what is left of it: its session's agent too)
        except ProcessLookupError:
            pass
        agent.wait()


def limit(sink, make_payload) -> None:
    """Messages with a frame above the limit are refused where they are sent, with why, not dropped
    (with the connection) where they arrive: every wait here is short, as nothing should hang."""
    for step, call in [
        ("result", lambda: sink.make.call("tensor:2097152").get(20)),
        ("argument", lambda: sink.slice(gpus=0).digest.call_one(make_payload("tensor:2097152")).get(20)),
        ("gathered", lambda: sink.make.call("bytes:614400").get(20)),  # 600 KB each: through the agent
        ("cast", lambda: sink.digest.call(make_payload("tensor:2097152")).get(20)),
    ]:
        try:
            call()
            say(step, error="")
        except Exception as e:  # noqa: BLE001 - what the user sees is the point
            say(step, error=f"{type(e).__name__}: {e}")
    say("after", ok=sink.make.call("small").get(20) is not None)
    say("done")


if __name__ == "__main__":
    main()
