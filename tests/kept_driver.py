"""A controller of a kept-alive job on this host, for tests/test_kept_reattach.py: the agent is a
dial-back one (as SLURM's would be, started by the test), the controllers are processes of their own.

    first            a controller that writes a kept job's key (keep_alive) and waits for its agent's
                     hello; prints {"key": path, "controller": addr}, then {"agent": addr}, then
                     lives (heartbeating its agent) until killed or its stdin closes
    reattach KEY AGENT [force]
                     a new controller takes the agent over with the job's keys (what
                     ``SlurmJob.reattach`` does after reading its record); prints {"error": ...}, then
                     stops the agent when it took it
"""

from __future__ import annotations

import json
import os
import sys

from jupyter_mesh._runtime.controller import Controller
from jupyter_mesh._wire.keyfile import read_key_file
from jupyter_mesh.jobs._dialback import JobFiles, stop_agents
from jupyter_mesh.jobs.kept import reattach_agents


def say(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def first() -> None:
    ctl = Controller.reachable_from("127.0.0.1")
    files = JobFiles(ctl, "slurm", 1, "a kept test job")
    (waiter,) = files.write_key([], keep_alive=True)
    say(key=files.key_path, controller=ctl.address)
    hello = waiter.get(60)
    say(agent=hello["addr"], pid=hello["pid"])
    sys.stdin.read()  # until the test kills us, or lets us go


def reattach(key: str, agent: str, force: bool) -> None:
    kf = read_key_file(key)
    ctl = Controller.adopt(kf.key, kf.curve, "127.0.0.1")
    token = os.path.basename(key).removesuffix(".key")
    try:
        agents, _ = reattach_agents(ctl, token, [agent], force, 60.0, "the kept test job", "kill its agent")
    except Exception as e:  # noqa: BLE001 - the test reads why
        say(error=f"{type(e).__name__}: {e}")
        return
    say(error=None, agent=agents[0].addr)
    stop_agents(ctl, agents)


if __name__ == "__main__":
    if sys.argv[1] == "first":
        first()
    else:
        reattach(sys.argv[2], sys.argv[3], "force" in sys.argv[4:])
