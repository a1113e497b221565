"""torchrun's environment for one rank of a mesh, by Monarch's rules, and the rendezvous address.

The rules (``monarch.spmd``'s, so a script sees the same numbers under either):

* ``RANK`` is the rank's row-major index in the mesh, ``WORLD_SIZE`` the mesh's size;
* the *last* dim is the node's local dim (``gpus`` in ``{hosts: 2, gpus: 4}``): ``LOCAL_RANK`` is the
  coordinate along it, ``LOCAL_WORLD_SIZE`` its size;
* ``GROUP_RANK = RANK // LOCAL_WORLD_SIZE`` (the node), ``GROUP_WORLD_SIZE`` the number of nodes
  (rounded up);
* one role for everyone: ``ROLE_RANK = RANK``, ``ROLE_WORLD_SIZE = WORLD_SIZE``, ``ROLE_NAME = "rank"``;
* ``MASTER_ADDR`` / ``MASTER_PORT``: the first rank's host and a port free there.

Nothing here imports torch: the variables are what ``init_process_group("gloo")`` (``env://``) and
Lightning read.
"""

from __future__ import annotations

import enum
import ipaddress
import math
import socket
from collections.abc import Mapping

from .._core.shape import Point, Shape

__all__ = ["ENV_KEYS", "AddrType", "free_port", "host_address", "torch_elastic_env", "view_point"]

ENV_KEYS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "WORLD_SIZE",
)


class AddrType(enum.Enum):
    """Which address family ``MASTER_ADDR`` is resolved to (Monarch's ``use_ipaddr``): ``Default``
    tries IPv6 then IPv4. ``None`` instead of one of these keeps the host name."""

    Default = enum.auto()
    IPv4 = enum.auto()
    IPv6 = enum.auto()


def torch_elastic_env(point: Point, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables torchrun would give the rank at ``point`` (its coordinates in the mesh it runs on)."""
    sizes: Mapping[str, int] = point.extent
    labels = list(sizes)
    world = math.prod(sizes.values())
    local_world = sizes[labels[-1]] if labels else 1
    local_rank = point[labels[-1]] if labels else 0
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(point.rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(point.rank // local_world),
        "GROUP_WORLD_SIZE": str(-(-world // local_world)),
        "ROLE_RANK": str(point.rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "rank",
        "WORLD_SIZE": str(world),
    }


def view_point(global_point: Point, view: Shape | None) -> Point:
    """The rank's point in ``view`` (a slice of its proc mesh), or in the whole mesh when ``view`` is
    None: ranks of a slice count from 0, as in Monarch where a sliced mesh's actors see the slice."""
    if view is None:
        return global_point
    index = view.slice.index_of(global_point.rank)
    if index is None:
        raise ValueError(f"rank {global_point.rank} is not in the slice {view} it was asked to run in")
    return view.point(index)


def free_port() -> int:
    """A TCP port free on every interface of this host now (the rendezvous store binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def host_address(use_ipaddr: AddrType | None, peer_ip: str | None = None) -> str:
    """Where the other ranks reach this host.

    Monarch's choice: the host name, or (``use_ipaddr``) its first address of that family that is
    not link-local. Two refinements, for hosts a name does not tell apart: when the proc's mesh spans
    hosts, ``peer_ip`` (the address its agent advertises, which the other hosts reach it by) is used
    instead of the name; and a name that does not resolve falls back to ``127.0.0.1``.
    """
    name = socket.gethostname()
    if use_ipaddr is None:
        if peer_ip:
            return peer_ip
        return name if _resolve(name, [socket.AF_INET6, socket.AF_INET]) else "127.0.0.1"
    families = {
        AddrType.Default: [socket.AF_INET6, socket.AF_INET],
        AddrType.IPv4: [socket.AF_INET],
        AddrType.IPv6: [socket.AF_INET6],
    }[use_ipaddr]
    ip = _resolve(name, families)
    if ip is None:
        raise RuntimeError(
            f"host name {name!r} resolves to no {use_ipaddr.name} address that is not link-local; "
            "pass master_addr= (and master_port=) explicitly, or fix the host's name resolution"
        )
    return ip


def _resolve(name: str, families: list[socket.AddressFamily]) -> str | None:
    for family in families:
        try:
            infos = socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)
        except OSError:
            continue
        for info in infos:
            ip = str(info[4][0])
            if not ipaddress.ip_address(ip.split("%")[0]).is_link_local:
                return ip
    return None
