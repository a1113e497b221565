"""The fan-out tree of a cast: which host agents the caller sends to, and which each agent forwards to.

With H host agents and a fan-out F, a cast goes straight to every agent while H <= F (one hop, the
fastest for small meshes); past that the caller sends to F agents only, and each forwards the same
signed frames to at most F agents below it, so no process sends more than F messages per cast and the
depth is about log_F(H). Replies of a ``call`` are gathered on the way up: each agent sends its
subtree's in one message to its parent, the top ones to the caller.

The layout is signed with the call: the header's ``dst`` lists the agents (the transport signs it), and
``tp`` gives each one's parent as an index into ``dst`` (-1: the caller). An agent forwards only to the
agents that ``tp`` names as its children, and only the caller can have made ``tp``: a relayer never
trusts a route it cannot verify. The layout is a complete F-ary tree over ``dst`` in order: agent i's
parent is ``i // F - 1``.
"""

from __future__ import annotations

from .. import config
from ..errors import MeshValueError

__all__ = ["DEFAULT_FANOUT", "children", "fanout", "parents", "subtree"]

DEFAULT_FANOUT = 16
"""Up to this many host agents a cast goes direct. Measured on the 2-core machine with
``benchmarks/bench_tree.py`` (LocalJob(hosts=8) x 4 procs, call + gather p50): 19.8 ms direct,
22.1 ms with fan-out 2 (three agents deep), 20.3 ms with 4: each hop of a tree costs an agent's
receive-and-forward, more than the caller saves by sending fewer messages, so small meshes go
direct; the tree is for hundreds of hosts, where the caller's sends and receives dominate."""


def fanout() -> int:
    """The configured fan-out: ``configure(fanout=N)`` (this process and the procs it spawns), else
    ``JUPYTER_MESH_FANOUT``, else :data:`DEFAULT_FANOUT`. 0 means always direct."""
    value = config.setting("fanout")
    try:
        n = int(value) if value is not None and value != "" else DEFAULT_FANOUT
    except (TypeError, ValueError):
        raise MeshValueError(
            f"fanout must be an integer (0: always direct, else >= 2), got {value!r}; "
            "set it with jupyter_mesh.configure(fanout=N) or JUPYTER_MESH_FANOUT"
        ) from None
    if n == 1 or n < 0:
        raise MeshValueError(f"fanout must be 0 (always direct) or >= 2, got {n}")
    return n


def parents(hosts: int, f: int) -> list[int] | None:
    """Each agent's parent (an index, -1 for the caller) in a cast to ``hosts`` agents; None: direct."""
    if f == 0 or hosts <= f:
        return None
    return [i // f - 1 for i in range(hosts)]


def children(tp: list[int], i: int) -> list[int]:
    """The agents ``i`` forwards to, from the signed layout (not recomputed: the layout is the caller's)."""
    return [j for j, p in enumerate(tp) if p == i]


def subtree(tp: list[int], i: int) -> list[int]:
    """``i`` and every agent below it."""
    out, todo = [], [i]
    while todo:
        n = todo.pop()
        out.append(n)
        todo.extend(children(tp, n))
    return out
