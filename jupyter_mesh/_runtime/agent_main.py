"""A local agent's process: ``python -m jupyter_mesh._runtime.agent_main``, its configuration one JSON
line on stdin (``LocalJob``, a listener's session; ``agent_boot.main``).

Its host's template starts first, before this process imports the agent: the template's own imports,
and then torch's in its warm child, run while the agent loads, instead of after it. That is the
agent's import time (about 50 ms here) off every local host's first proc."""

from __future__ import annotations

from .template import start_early


def main() -> None:
    early = start_early()
    from .agent_boot import main as run  # the agent, its wire and ZeroMQ: loaded while the template starts

    run(early)


if __name__ == "__main__":
    main()
