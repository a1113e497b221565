"""Runtime settings, under Monarch's names: ``configure``, ``configured``, ``get_global_config``.

Two layers, as in Monarch: the defaults (with ``JUPYTER_MESH_*`` environment overrides for the settings
that have one) and a *runtime* layer set from Python. ``configured(**overrides)`` applies overrides for a
``with`` block and puts the runtime layer back as it was afterwards, which is what tests want.

The runtime layer travels to procs spawned while it is set (``HostMesh.spawn_procs`` hands it to them),
so a setting read inside an actor is the one its spawner had.

Keys: ours (``OURS``) and Monarch's documented ones (``MONARCH_KEYS``). Monarch's keys tune its Rust
runtime (transports, codecs, acknowledgements, its own timeouts); here they are accepted and stored so a
Monarch program's ``configure(...)`` keeps working, but they change nothing — the README lists the few
that have a counterpart. An unknown key is a ``ValueError`` naming the known ones, as in Monarch.
"""

from __future__ import annotations

import contextlib
import enum
import json
import numbers
import operator
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .errors import MeshValueError

__all__ = [
    "MONARCH_KEYS",
    "OURS",
    "ChannelTransport",
    "clear_runtime_config",
    "configure",
    "configured",
    "enable_transport",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
    "setting",
]

ENV = "JUPYTER_MESH_RUNTIME_CONFIG"
"""How a proc receives its spawner's runtime layer (JSON; set by ``HostMesh.spawn_procs``)."""

OURS: dict[str, tuple[str, Any]] = {
    # key: (environment variable that sets its default, default when unset)
    "init_timeout": ("JUPYTER_MESH_INIT_TIMEOUT", None),
    "heartbeat_timeout": ("JUPYTER_MESH_HEARTBEAT_TIMEOUT", None),
    "max_frame": ("JUPYTER_MESH_MAX_FRAME", None),
    "warm": ("JUPYTER_MESH_WARM", None),  # None/true: local templates preload torch (``jobs.warm``)
    # host agents a cast goes to directly; past that, agents relay to agents (``_runtime/tree``); 0: direct
    "fanout": ("JUPYTER_MESH_FANOUT", None),
    # a call waited on longer than this (seconds) shows, in its cell and the views, which ranks have not
    # answered and where each is (its stack's top frame, or "paused at file:line"); 0 turns it off
    "slow_call_after": ("JUPYTER_MESH_SLOW_CALL_AFTER", 10.0),
    # folds of reduce functions running at once in one process (an agent, the caller): past it a reduce
    # with a function fails at once (``_runtime/fn_folds``); an agent reads only the environment variable
    "max_reduce_fn_folds": ("JUPYTER_MESH_MAX_REDUCE_FN_FOLDS", None),
}

MONARCH_KEYS = frozenset(
    """default_transport enable_log_forwarding enable_file_capture tail_log_lines codec_max_frame_length
    message_delivery_timeout host_spawn_ready_timeout mesh_proc_spawn_max_idle process_exit_timeout
    message_ack_time_interval message_ack_every_n_messages message_ttl_default split_max_buffer_size
    split_max_buffer_age stop_actor_timeout cleanup_timeout default_encoding
    channel_net_rx_buffer_full_check_interval channel_tcp_congestion message_latency_sampling_rate
    enable_dest_actor_reordering_buffer mesh_bootstrap_enable_pdeathsig mesh_terminate_concurrency
    mesh_terminate_timeout small_write_threshold max_cast_dimension_size remote_alloc_bind_to_inaddr_any
    remote_alloc_bootstrap_addr remote_alloc_allowed_port_range read_log_buffer force_file_log
    prefix_with_rank actor_spawn_max_idle get_actor_state_max_idle supervision_watchdog_timeout
    proc_stop_max_idle get_proc_state_max_idle mesh_admin_addr mesh_attach_config_timeout
    mesh_orphan_timeout rdma_allow_tcp_fallback rdma_disable_ibverbs rdma_max_chunk_size_mb
    rdma_ibverbs_target rdma_peer_device_affinity rdma_runtime_worker_threads""".split()
)
"""Monarch's documented ``configure`` keys: accepted, stored, and (here) without effect."""

_BOOL = frozenset(
    """enable_log_forwarding enable_file_capture enable_dest_actor_reordering_buffer
    mesh_bootstrap_enable_pdeathsig remote_alloc_bind_to_inaddr_any force_file_log prefix_with_rank
    rdma_allow_tcp_fallback rdma_disable_ibverbs""".split()
)
_COUNT = frozenset(
    """tail_log_lines codec_max_frame_length message_ack_every_n_messages message_ttl_default
    split_max_buffer_size mesh_terminate_concurrency small_write_threshold max_cast_dimension_size
    read_log_buffer rdma_max_chunk_size_mb rdma_runtime_worker_threads""".split()
)
_TEXT = frozenset(
    """message_delivery_timeout host_spawn_ready_timeout mesh_proc_spawn_max_idle process_exit_timeout
    message_ack_time_interval split_max_buffer_age stop_actor_timeout cleanup_timeout
    channel_net_rx_buffer_full_check_interval channel_tcp_congestion mesh_terminate_timeout
    remote_alloc_bootstrap_addr actor_spawn_max_idle get_actor_state_max_idle supervision_watchdog_timeout
    proc_stop_max_idle get_proc_state_max_idle mesh_admin_addr mesh_attach_config_timeout mesh_orphan_timeout
    rdma_ibverbs_target rdma_peer_device_affinity""".split()
)


def _check_type(key: str, value: Any) -> Any:
    """Monarch's type of a value of its key (its ``TypeError``): a bool, an unsigned 64-bit int, a string
    (the durations are strings: ``"30s"``), a float, a transport. What Monarch takes from Python, this
    takes too (numpy's scalars, a bool or an int as a float), stored as the plain Python value, so that it
    reaches procs. Keys of unknown type pass as they are."""
    if key in _BOOL:
        ok, want = isinstance(value, bool) or _numpy_bool(value), "a bool (True or False)"
        plain = bool(value) if ok else value
    elif key in _COUNT:
        plain = _index(value)
        ok, want = plain is not None and 0 <= plain < 2**64, "a non-negative int (below 2**64)"
    elif key in _TEXT:
        ok, want, plain = isinstance(value, str), 'a string (durations as "30s", "5m")', value
    elif key == "message_latency_sampling_rate":
        ok, want = isinstance(value, numbers.Real), "a float"
        plain = float(value) if ok else value
    elif key == "default_transport":
        ok, want, plain = isinstance(value, (str, ChannelTransport)), "a ChannelTransport or a string", value
    else:
        return value
    if not ok:
        raise TypeError(
            f"invalid value {value!r} ({type(value).__name__}) for configuration key `{key}`: it takes {want}. "
            f"Pass configure({key}=...) a value of that type"
        )
    return plain


def _numpy_bool(value: Any) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")


def _index(value: Any) -> int | None:
    """An int, or what says it is one (``__index__``: numpy's integers, a bool, as Monarch takes); not a float."""
    try:
        return operator.index(value)
    except TypeError:
        return None


class ChannelTransport(enum.Enum):
    """Monarch's transports (``ChannelTransport.Unix``...), accepted by :func:`enable_transport` and
    ``configure(default_transport=...)`` and stored, without effect: control messages here travel over
    ZeroMQ (``ipc`` on one host, ``tcp`` with CURVE between hosts), chosen by where the peer is."""

    Local = "local"
    MetaQuicWithHostname = "metaquic(Hostname)"
    MetaQuicWithIpV6 = "metaquic(IpV6)"
    MetaTlsWithHostname = "metatls(Hostname)"
    MetaTlsWithIpV6 = "metatls(IpV6)"
    Quic = "quic"
    TcpWithHostname = "tcp(Hostname)"
    TcpWithLocalhost = "tcp(Localhost)"
    Tls = "tls"
    Unix = "unix"


_SHORTCUTS = {
    "tcp": ChannelTransport.TcpWithHostname,
    "ipc": ChannelTransport.Unix,
    "metatls": ChannelTransport.MetaTlsWithIpV6,
    "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
    "tls": ChannelTransport.Tls,
}
_transport: ChannelTransport | str | None = None


def enable_transport(transport: ChannelTransport | str) -> None:
    """Monarch's ``enable_transport``: checked and stored, without effect (see :class:`ChannelTransport`).
    ``"tcp"``, ``"ipc"``, ``"metatls"``, ``"metatls-hostname"``, ``"tls"``, an address such as
    ``"tcp://127.0.0.1:8080"``, or a ``ChannelTransport``. As in Monarch, only one may be enabled."""
    global _transport
    if isinstance(transport, str):
        chosen: ChannelTransport | str = _SHORTCUTS.get(transport, transport)
        if chosen is transport and "://" not in transport:
            raise MeshValueError(
                f"enable_transport({transport!r}): not a transport; give one of {sorted(_SHORTCUTS)}, an "
                "address such as 'tcp://127.0.0.1:8080', or a ChannelTransport"
            )
    elif isinstance(transport, ChannelTransport):
        chosen = transport
    else:
        raise TypeError(f"enable_transport takes a ChannelTransport or a str, got {type(transport).__name__}")
    with _lock:
        if _transport is not None and _transport != chosen:
            raise RuntimeError(
                f"Only one transport type may be enabled at one time: {_transport} is, not {chosen} "
                "(here the choice has no effect: leave the first one)"
            )
        _transport = chosen


_lock = threading.Lock()
_runtime: dict[str, Any] = {}
_pid = 0  # the process whose layer ``_runtime`` is: a proc forked from a template reads its own


def _layer() -> dict[str, Any]:
    """The runtime layer of this process (caller holds ``_lock``); a new process starts from the one its
    spawner handed down (``ENV``)."""
    global _pid
    if _pid != os.getpid():
        _pid = os.getpid()
        _runtime.clear()
        try:
            inherited = json.loads(os.environ.get(ENV) or "{}")
        except ValueError:
            inherited = {}
        if isinstance(inherited, dict):
            _runtime.update({k: v for k, v in inherited.items() if k in OURS or k in MONARCH_KEYS})
    return _runtime


def _defaults() -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(sorted(MONARCH_KEYS))
    for key, (env, default) in OURS.items():
        out[key] = os.environ.get(env, default)
    return out


def setting(key: str) -> Any:
    """One of our settings as it applies now (runtime layer, else environment, else default): cheap
    enough for every cast, unlike :func:`get_global_config`, which copies them all."""
    with _lock:
        layer = _layer()
        if key in layer:
            return layer[key]
    env, default = OURS[key]
    return os.environ.get(env, default)


def configure(**settings: Any) -> None:
    """Set runtime settings for this process (and the procs it spawns from now on)."""
    unknown = sorted(k for k in settings if k not in OURS and k not in MONARCH_KEYS)
    if unknown:
        raise MeshValueError(
            f"unknown setting(s) {unknown}; jupyter_mesh knows {sorted(OURS)} and Monarch's documented keys "
            f"(jupyter_mesh.config.MONARCH_KEYS)"
        )
    settings = {key: _check_type(key, value) for key, value in settings.items()}
    with _lock:
        _layer().update(settings)


def get_runtime_config() -> dict[str, Any]:
    """A copy of the settings made from Python (the runtime layer)."""
    with _lock:
        return dict(_layer())


def clear_runtime_config() -> None:
    """Forget every setting made from Python; defaults and the environment stay."""
    with _lock:
        _layer().clear()


def get_global_config() -> dict[str, Any]:
    """Every setting as it applies now: defaults, environment, then the runtime layer (a copy)."""
    merged = _defaults()
    with _lock:
        merged.update(_layer())
    return merged


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[dict[str, Any]]:
    """``with configured(k=v) as cfg:`` applies overrides, yields the merged settings, and restores the
    runtime layer on exit (even on error)."""
    saved = get_runtime_config()
    try:
        configure(**overrides)
        yield get_global_config()
    finally:
        with _lock:
            _layer().clear()
            _runtime.update(saved)


def for_procs() -> dict[str, str]:
    """The environment that hands this runtime layer to procs spawned now (empty if nothing is set or it
    is not plain JSON data)."""
    layer = get_runtime_config()
    if not layer:
        return {}
    try:
        return {ENV: json.dumps(layer)}
    except (TypeError, ValueError):
        return {ENV: json.dumps({k: v for k, v in layer.items() if _plain(v)})}


def _plain(v: Any) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True


def parametrize_config(**options: Sequence[Any]) -> Callable[[Callable[..., Any]], Any]:
    """For pytest: run a test once per combination of the settings' values (Monarch's helper), each
    run inside ``configured(...)`` with that combination."""
    import itertools

    keys = list(options)
    return _parametrize(keys, list(itertools.product(*(list(options[k]) for k in keys))))


def parametrize_config_pointwise(**options: Sequence[Any]) -> Callable[[Callable[..., Any]], Any]:
    """As :func:`parametrize_config`, but the i-th run takes the i-th value of every setting."""
    keys = list(options)
    columns = [list(options[k]) for k in keys]
    if len({len(c) for c in columns}) > 1:
        raise MeshValueError(f"every setting needs as many values: {dict(zip(keys, map(len, columns)))}")
    return _parametrize(keys, list(zip(*columns)))


def _parametrize(keys: list[str], rows: list[tuple[Any, ...]]) -> Callable[[Callable[..., Any]], Any]:
    import functools
    import inspect

    import pytest

    if not keys:
        raise MeshValueError("name at least one setting to parametrize over")
    runs = [dict(zip(keys, row)) for row in rows]
    ids = ["-".join(f"{k}={v}" for k, v in run.items()) for run in runs]

    def decorate(fn: Callable[..., Any]) -> Any:
        sig = inspect.signature(fn)
        param = inspect.Parameter("_config_overrides", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if inspect.iscoroutinefunction(fn):

            async def wrapper(_config_overrides: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
                with configured(**_config_overrides):
                    return await fn(*args, **kwargs)
        else:

            def wrapper(_config_overrides: dict[str, Any], *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                with configured(**_config_overrides):
                    return fn(*args, **kwargs)

        functools.update_wrapper(wrapper, fn)
        wrapper.__signature__ = sig.replace(parameters=[param, *sig.parameters.values()])  # type: ignore[attr-defined]
        return pytest.mark.parametrize("_config_overrides", runs, ids=ids)(wrapper)

    return decorate
