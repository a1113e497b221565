"""Several "hosts" on one machine: network namespaces on a Linux bridge, each with its own IPv4 address.

Why: a mesh that only ever ran on one host hides "localhost" shortcuts. In a namespace, 127.0.0.1 is
that namespace's own loopback and a peer is reachable only at its bridge address, so code that
advertises `gethostname()` or 127.0.0.1 fails here the way it would on a real cluster. Cutting a host
off (its veth down) is a real network partition, not a mock.

Layout (root only)::

    root namespace: bridge jmbr0 = 10.213.0.1/24
      veth jmv0 --- eth0 in namespace jmh0 = 10.213.0.2/24
      veth jmv1 --- eth0 in namespace jmh1 = 10.213.0.3/24 ...

Everything made here starts with ``jm`` (namespaces ``jmh<i>``, veths ``jmv<i>``, bridge ``jmbr0``);
set-up first deletes whatever a killed run left under those names. Two runs on one machine would
fight over the names, so `Hosts` holds an exclusive lock (`LOCK_PATH`) from set-up to teardown and a
second run waits for it (bounded) instead of clobbering the first.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

PREFIX = "jm"
BRIDGE = f"{PREFIX}br0"
SUBNET = "10.213.0"  # a private /24 that nothing else here uses; .1 is the root namespace
NETNS_DIR = "/var/run/netns"
LOCK_PATH = "/run/jupyter-mesh-cluster.lock"
_NS_RE = re.compile(rf"^{PREFIX}h\d+$")
_VETH_RE = re.compile(rf"^{PREFIX}v\d+$")


class NetnsError(RuntimeError):
    """A namespace command failed; the message carries the command and its stderr."""


@dataclass(frozen=True)
class Host:
    """One namespace host: its namespace name, its address on the bridge, the root side of its veth."""

    name: str
    ip: str
    veth: str
    index: int

    @property
    def netns_path(self) -> str:
        return f"{NETNS_DIR}/{self.name}"


def _ip(*args: str, check: bool = True, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed (rc={r.returncode}): {r.stderr.strip()}")
    return r


def nsenter_argv(host: Host | str, argv: Sequence[str]) -> list[str]:
    """The argv that runs ``argv`` in ``host``'s network namespace only. Not `ip netns exec`: that also
    remounts /sys, which hides /sys/fs/cgroup and makes slurmd abort."""
    name = host.name if isinstance(host, Host) else host
    return ["nsenter", f"--net={NETNS_DIR}/{name}", "--", *argv]


def run_in(host: Host | str, argv: Sequence[str], **popen_kw) -> subprocess.Popen:
    """Start ``argv`` inside ``host``'s network namespace (a Popen; the caller waits or kills it)."""
    return subprocess.Popen(nsenter_argv(host, argv), **popen_kw)


def check_output_in(host: Host | str, argv: Sequence[str], timeout: float = 30.0) -> str:
    """Run ``argv`` in ``host`` to completion; its stdout, or NetnsError with its stderr."""
    r = subprocess.run(nsenter_argv(host, argv), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise NetnsError(f"{list(argv)} in {host} failed (rc={r.returncode}): {r.stderr.strip()}")
    return r.stdout


def netns_pids(name: str) -> set[int]:
    """Processes whose network namespace is ``name`` (empty when the namespace is gone)."""
    r = _ip("netns", "pids", name, check=False)
    return {int(p) for p in r.stdout.split()} if r.returncode == 0 else set()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    """``pid``'s command line, arguments joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def kill_netns_pids(name: str, timeout: float = 5.0) -> set[int]:
    """SIGKILL everything in namespace ``name``; return what is still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = netns_pids(name)
    while left and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
        left = {p for p in netns_pids(name) if alive(p)}
    return left


def ours() -> dict[str, list[str]]:
    """Namespaces and links with our names that exist now (what a leak check looks for)."""
    namespaces = [n for n in os.listdir(NETNS_DIR) if _NS_RE.match(n)] if os.path.isdir(NETNS_DIR) else []
    links = []
    for line in _ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0]
        if name == BRIDGE or _VETH_RE.match(name):
            links.append(name)
    return {"namespaces": sorted(namespaces), "links": sorted(links)}


def clean_all(timeout: float = 10.0) -> None:
    """Delete every namespace, veth and bridge with our names, killing what still runs in them. Also
    what a killed run left behind; call it only while holding the lock."""
    left = ours()
    stuck = {}
    for name in left["namespaces"]:
        survivors = kill_netns_pids(name, timeout)
        if survivors:
            stuck[name] = sorted(survivors)
        _ip("netns", "del", name, check=False)
    for link in left["links"]:
        _ip("link", "del", link, check=False)
    now = ours()
    if stuck or now["namespaces"] or now["links"]:
        raise NetnsError(
            f"could not clean up the namespace hosts: {now} (processes that would not die: {stuck}); "
            f"delete them by hand (`ip netns del NAME`, `ip link del NAME`) and kill those processes"
        )


class Hosts:
    """``n`` namespace hosts on one bridge; a context manager (set-up on enter, teardown on exit).

    Timings of the last set-up and teardown are kept in `setup_s` / `teardown_s`."""

    def __init__(self, n: int, lock_timeout: float = 120.0) -> None:
        if not 1 <= n <= 200:
            raise ValueError(f"n={n}: between 1 and 200 hosts fit on the /24")
        self.n = n
        self.lock_timeout = lock_timeout
        self.bridge = BRIDGE
        self.bridge_ip = f"{SUBNET}.1"
        self.prefixlen = 24
        self.hosts = [Host(f"{PREFIX}h{i}", f"{SUBNET}.{i + 2}", f"{PREFIX}v{i}", i) for i in range(n)]
        self.setup_s = self.teardown_s = 0.0
        self._lock_fd: int | None = None

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __repr__(self) -> str:
        return f"Hosts({', '.join(f'{h.name}={h.ip}' for h in self.hosts)})"

    def by_ip(self, ip: str) -> Host:
        for h in self.hosts:
            if h.ip == ip:
                return h
        raise KeyError(f"no namespace host has address {ip}; the hosts are {self!r}")

    # -- lifecycle -------------------------------------------------------------------------------

    def _lock(self) -> None:
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                    os.close(fd)
                    raise NetnsError(
                        f"waited {self.lock_timeout:.0f} s for another run (pid {holder or '?'}) to release the "
                        f"namespace hosts ({LOCK_PATH}); wait for it to finish, or kill it"
                    ) from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def setup(self) -> Hosts:
        t0 = time.monotonic()
        self._lock()
        try:
            clean_all()
            os.makedirs(NETNS_DIR, exist_ok=True)
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_ip}/{self.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for h in self.hosts:
                _ip("netns", "add", h.name)
                _ip("link", "add", h.veth, "type", "veth", "peer", "name", f"{h.veth}p", "netns", h.name)
                _ip("link", "set", h.veth, "master", self.bridge)
                _ip("link", "set", h.veth, "up")
                ns = ("-n", h.name)
                _ip(*ns, "link", "set", f"{h.veth}p", "name", "eth0")
                _ip(*ns, "addr", "add", f"{h.ip}/{self.prefixlen}", "dev", "eth0")
                _ip(*ns, "link", "set", "eth0", "up")
                _ip(*ns, "link", "set", "lo", "up")
        except BaseException:
            self.teardown()
            raise
        self.setup_s = time.monotonic() - t0
        return self

    def teardown(self) -> None:
        """Kill what runs in the hosts, delete namespaces, veths and the bridge, release the lock."""
        if self._lock_fd is None:
            return
        t0 = time.monotonic()
        try:
            clean_all()
        finally:
            self._unlock()
        self.teardown_s = time.monotonic() - t0

    def __enter__(self) -> Hosts:
        return self.setup()

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    # -- faults ----------------------------------------------------------------------------------

    def cut(self, host: Host) -> None:
        """Cut ``host`` off the network (its veth down on the root side). Its neighbour entry is
        flushed too, so new connects fail once ARP gives up (~3 s, EHOSTUNREACH) instead of sending
        into a dead link until the cached entry goes stale."""
        _ip("link", "set", host.veth, "down")
        _ip("neigh", "flush", "to", host.ip, "dev", self.bridge, check=False)

    def is_cut(self, host: Host) -> bool:
        with open(f"/sys/class/net/{host.veth}/flags") as f:
            return not int(f.read(), 16) & 0x1  # IFF_UP

    def heal(self, host: Host) -> None:
        """Put ``host`` back on the network."""
        _ip("link", "set", host.veth, "up")
        _ip("neigh", "flush", "to", host.ip, "dev", self.bridge, check=False)

    # -- running things --------------------------------------------------------------------------

    def run_in(self, host: Host, argv: Sequence[str], **popen_kw) -> subprocess.Popen:
        return run_in(host, argv, **popen_kw)

    def pids(self) -> dict[str, set[int]]:
        """What runs in each host now."""
        return {h.name: netns_pids(h.name) for h in self.hosts}
