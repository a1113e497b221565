"""TCP addresses across hosts: which of our IPs a peer can reach, and parsing what came in.

Every namespace "host" on one machine shares one hostname, and on clusters a hostname often resolves
to an interface the peer cannot route to: an agent advertises the IP of the interface its route to
the controller leaves by, never ``gethostname()``.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["host_of", "local_ip_towards", "parse_tcp"]


def parse_tcp(addr: str) -> tuple[str, int]:
    """``tcp://IP:PORT`` -> (IP, PORT), with a clear error for anything else (a name is resolved)."""
    if not isinstance(addr, str) or not addr.startswith("tcp://"):
        raise ValueError(f"expected an address like tcp://10.0.0.2:6000, got {addr!r}")
    host, sep, port = addr[len("tcp://") :].rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ValueError(f"expected an address like tcp://10.0.0.2:6000, got {addr!r}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            host = socket.gethostbyname(host)
        except OSError as e:
            raise ValueError(f"cannot resolve the host of {addr!r}: {e}") from None
    return host, int(port)


def host_of(addr: str) -> str:
    """The IP of a ``tcp://`` address; for anything else (``ipc://``) the address itself."""
    try:
        return parse_tcp(addr)[0]
    except ValueError:
        return addr


def local_ip_towards(ip: str) -> str:
    """The IP of our interface that the route to ``ip`` leaves by (no packet is sent)."""
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(fam, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
        except OSError as e:
            raise OSError(f"no route from this host to {ip}: {e}") from None
        return str(s.getsockname()[0])
