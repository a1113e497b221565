"""Monarch's own test suite run against jupyter_mesh: how far "a Monarch program ports by changing its
imports" holds, measured. Prints one JSON object.

    python benchmarks/monarch_suite.py --monarch-src DIR [--files a.py,b.py] [-k EXPR] [--timeout 60]

``DIR`` is a checkout of meta-pytorch/monarch or its bare git directory. Nothing of Monarch is kept in
this repository: the tests and examples are exported to a temporary directory, their imports rewritten
(``REWRITES``; nothing else changes), and pytest runs them there against this package.

What counts:
* **applicable**: tests collected from ``FILES``, minus those Monarch's own OSS CI does not run
  (marked ``oss_skip`` or skipped unconditionally) and minus ``EXCLUDED`` (tests of Monarch's
  internals: Rust bindings, private ``_src`` functions and attributes), each listed with its reason.
* A Monarch name we lack, or an internal one, imports as a placeholder that raises when used
  (``PortGap``), so one missing name fails the tests that use it, not the whole file; ``gaps`` counts
  the tests each one stopped (the first one they hit).
* ``examples``: Monarch's CPU examples run as scripts; ``ok`` is exit status 0 within the time limit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent  # the jupyter_mesh checkout under test (--package)

TESTS = "python/tests"
FILES = [  # Monarch's tests of the actor API (meshes, endpoints, failures, config, ports)
    "test_python_actors.py",
    "test_actor_error.py",
    "test_concurrent_endpoints.py",
    "test_config.py",
    "test_supervision_hierarchy.py",
    "test_proc_mesh.py",
    "test_host_mesh.py",
    "test_cookbook.py",
    "test_client_shutdown.py",
    "test_controller_dedup.py",
    "test_failure_introspection.py",
    "test_inter_mesh_ping_pong.py",
    "test_actor_logging.py",
    "test_client_context_guard.py",
    "test_port_reconstruction.py",
    "test_actor_driver_characterization.py",
    "test_rdma_unit.py",
    "test_rdma_cpu_no_torch.py",
]
HELPERS = ["isolate_in_subprocess.py", "scoped_state.py", "rdma_test_utils.py", "proc_mesh_test_utils.py"]
EXAMPLES = ["docs/source/examples/ping_pong.py", "docs/source/examples/getting_started.py",
            "docs/source/examples/grpo_yield.py"]  # fmt: skip

# Monarch module -> ours, for the names of Monarch's public API. A name is public if Monarch exports it
# (``__all__`` of monarch.actor, monarch.config, monarch.job, monarch.rdma, read from DIR), or is in
# PUBLIC_EXTRA: types its users meet though they are defined in Rust.
REWRITES = {
    "monarch.actor": "jupyter_mesh",
    "monarch.actor.concurrent": "jupyter_mesh",
    "monarch._src.actor.actor_mesh": "jupyter_mesh",
    "monarch._src.actor.host_mesh": "jupyter_mesh",
    "monarch._src.actor.proc_mesh": "jupyter_mesh",
    "monarch._src.actor.endpoint": "jupyter_mesh",
    "monarch._src.actor.future": "jupyter_mesh",
    "monarch._src.actor.bootstrap": "jupyter_mesh",
    "monarch._src.actor.supervision": "jupyter_mesh",
    "monarch._src.actor.concurrent": "jupyter_mesh",
    "monarch._rust_bindings.monarch_hyperactor.supervision": "jupyter_mesh",
    "monarch.rdma": "jupyter_mesh",
    "monarch._src.rdma.rdma": "jupyter_mesh",
    "monarch.config": "jupyter_mesh.config",
    "monarch.job": "jupyter_mesh.jobs",
    "monarch._src.job.process": "jupyter_mesh.jobs",
}
PUBLIC_MODULES = {"python/monarch/actor/__init__.py", "python/monarch/config/__init__.py",
                  "python/monarch/job/__init__.py", "python/monarch/rdma/__init__.py"}  # fmt: skip
PUBLIC_EXTRA = {"ActorMesh", "SupervisionError", "MeshFailure", "ProcessJob", "RDMABuffer"}
ATTRIBUTE_REWRITES = {"monarch.actor.": "jupyter_mesh.", "monarch.config.": "jupyter_mesh.config."}

# Tests of Monarch's internals, not of its API: left out of the applicable count, each with the reason.
# Keys are "file::test" (every parametrization of it) or a whole "file".
_TOKIO = "Monarch's Rust runtime (PythonTask / Tokio threads and its guards)"
_PICKLE = "how Monarch's meshes pickle while their Rust side is pending (HyProcMesh, Shared, PythonTask)"
_SETTINGS = "defaults and value formats of Monarch's Rust runtime settings (ours accepts the keys, without effect)"
_LOGS = "Monarch's log-forwarding manager (_logging_manager, its flush tasks)"
_HY = "Monarch's Rust host/proc mesh objects and Shape/Slice constructors (_hy_host_mesh, _new_with_shape, region)"
EXCLUDED: dict[str, str] = {
    "test_actor_driver_characterization.py::test_actor_endpoint_is_asyncio_driven": _TOKIO,
    "test_actor_error.py::test_endpoint_panic_kills_actor": "a Rust panic raised through pyo3 (panicking_function)",
    "test_actor_error.py::test_gil_stall": "holds the GIL from Rust (hold_gil_for_test)",
    "test_client_context_guard.py": _TOKIO,
    "test_port_reconstruction.py": "Monarch's PortRef/ActorAddr reconstruction and mesh-reference counters",
    "test_failure_introspection.py": "Monarch's mesh-admin HTTP server (_spawn_admin)",
    "test_config.py::test_get_set_transport": _SETTINGS,
    "test_config.py::test_get_set_explicit_transport": _SETTINGS,
    "test_config.py::test_get_set_multiple": _SETTINGS,
    "test_config.py::test_duration_config_basic": _SETTINGS,
    "test_config.py::test_duration_config_formats": _SETTINGS,
    "test_config.py::test_duration_config_invalid_format": _SETTINGS,
    "test_config.py::test_duration_config_type_error": _SETTINGS,
    "test_config.py::test_duration_config_multiple": _SETTINGS,
    "test_config.py::test_duration_params": _SETTINGS,
    "test_config.py::test_integer_params": _SETTINGS,
    "test_config.py::test_boolean_params": _SETTINGS,
    "test_config.py::test_float_param_message_latency_sampling_rate": _SETTINGS,
    "test_config.py::test_encoding_param": _SETTINGS,
    "test_config.py::test_encoding_param_invalid": _SETTINGS,
    "test_config.py::test_all_params_together": _SETTINGS,
    "test_config.py::test_channel_transport_pickle": _SETTINGS,
    "test_config.py::test_params_type_errors": _SETTINGS,
    "test_config.py::test_rdma_peer_device_affinity_round_trip": _SETTINGS,
    "test_config.py::test_rdma_runtime_worker_threads_round_trip": _SETTINGS,
    "test_host_mesh.py::test_process_job_host_mesh": _HY,
    "test_host_mesh.py::test_multi_host_mesh": _HY,
    "test_host_mesh.py::test_spawn_proc_mesh": _HY,
    "test_host_mesh.py::test_pickle": _HY,
    "test_host_mesh.py::test_shutdown_host_mesh": "HostMesh._inner_host_mesh (a private attribute)",
    "test_host_mesh.py::test_shutdown_immediately_after_proc_spawn_without_actor": "HostMesh._inner_host_mesh",
    "test_host_mesh.py::test_shutdown_sliced_host_mesh_throws_exception": "HostMesh._inner_host_mesh",
    "test_host_mesh.py::test_attach_to_workers_accepts_future_addresses": "Future._from_coro (a private constructor)",
    "test_host_mesh.py::test_root_client_does_not_leak_host_meshes": "the root client's private _children list",
    "test_host_mesh.py::test_spawn_procs_with_bootstrap_command_callable": "Monarch's BootstrapCommand and Rust Point",
    "test_host_mesh.py::test_client_attach_addr": "Monarch's job ProcessState (_src.job.job)",
    "test_host_mesh.py::test_client_attach_addr_this_host_and_this_proc": "Monarch's job ProcessState (_src.job.job)",
    "test_host_mesh.py::test_client_attach_addr_this_host_spawns_locally": "Monarch's job ProcessState (_src.job.job)",
    "test_proc_mesh.py::test_stop_state_tracks_native_stop_result": _LOGS,
    "test_proc_mesh.py::test_proc_mesh_spawn_single_actor": _HY,
    "test_proc_mesh.py::test_proc_mesh_multi_actor": _HY,
    "test_proc_mesh.py::test_proc_mesh_sliced": _HY,
    "test_proc_mesh.py::test_nested_meshes": _HY,
    "test_proc_mesh.py::test_pickle_initialized_proc_mesh_in_tokio_thread": _TOKIO,
    "test_proc_mesh.py::test_root_client_does_not_leak_proc_meshes": "the root client's private _children list",
    "test_proc_mesh.py::test_actor_spawn_does_not_block_on_proc_mesh_init": _PICKLE,
    "test_proc_mesh.py::test_raw_proc_mesh_pickle_blocks_on_proc_mesh_init": _PICKLE,
    "test_proc_mesh.py::test_actor_spawn_then_immediate_shutdown": _LOGS,
    "test_proc_mesh.py::test_proc_mesh_spawn_callback": "register_proc_mesh_spawn_callback (private _src hook)",
    "test_proc_mesh.py::test_proc_mesh_spawn_callback_multiple": "register_proc_mesh_spawn_callback",
    "test_proc_mesh.py::test_proc_mesh_spawn_callback_unregister": "register_proc_mesh_spawn_callback",
    "test_python_actors.py::test_rust_binding_modules_correct": "walks monarch._rust_bindings",
    "test_python_actors.py::test_multiple_ongoing_flushes_no_deadlock": _LOGS,
    "test_python_actors.py::test_sync_workspace": "monarch.tools workspace sync (Config, Workspace)",
    "test_python_actors.py::test_python_task_tuple": _TOKIO,
    "test_python_actors.py::test_select_result": _TOKIO,
    "test_python_actors.py::test_undeliverable_message_with_override": "hand-built Rust messages (PortRef, PythonMessage)",
    "test_python_actors.py::test_undeliverable_message_without_override": "hand-built Rust messages (PortRef, PythonMessage)",
    "test_python_actors.py::test_config_propagates_to_host_agent": "Monarch's mesh-admin agent (_spawn_admin)",
    "test_python_actors.py::test_this_host": _HY,
    "test_python_actors.py::test_login_job": "Monarch's LoginJob/ProcessState job internals",
    "test_python_actors.py::test_context_propagated_through_python_task_spawn": _TOKIO,
    "test_python_actors.py::test_context_propagated_through_python_task_spawn_blocking": _TOKIO,
    "test_python_actors.py::test_raw_actor_mesh_pickle_blocks_on_proc_mesh_init": _PICKLE,
    "test_python_actors.py::test_accumulate_folds_with_combine": "Future._from_coro (a private constructor)",
    "test_python_actors.py::test_accumulate_empty_stream_returns_identity": "Future._from_coro",
    "test_python_actors.py::test_accumulate_folds_left_to_right": "Future._from_coro",
    "test_python_actors.py::test_accumulate_forwards_args_to_stream": "Future._from_coro",
}

_GAP_MODULE = '''"""Placeholders for the Monarch names jupyter_mesh lacks or that are Monarch's internals."""
import os


class PortGap(Exception):
    pass


class _Gap(type):
    def _fail(cls):
        raise PortGap(cls._why)

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        cls._fail()

    def __call__(cls, *args, **kwargs):
        if os.environ.get("MONARCH_SUITE_COLLECT"):  # only listing the tests: decorators pass through
            return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else cls
        cls._fail()

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__


def __getattr__(attr):
    kind, _, name = attr.partition("__")
    if kind not in ("lacking", "internal"):
        raise AttributeError(attr)
    why = "jupyter_mesh lacks Monarch name" if kind == "lacking" else "Monarch internal"
    return _Gap(name, (), {"_why": f"{why}: {name}"})
'''

_CONFTEST = '''"""Generated by jupyter_mesh's benchmarks/monarch_suite.py: runs async tests, honours oss_skip."""
import asyncio
import inspect
import json
import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "oss_skip: not run by Monarch's OSS CI")


def pytest_collection_modifyitems(config, items):
    listing = os.environ.get("MONARCH_SUITE_COLLECT")
    found = []
    for item in items:
        skip = item.get_closest_marker("skip")
        oss = item.get_closest_marker("oss_skip") is not None
        found.append({"name": item.name, "oss_skip": oss, "skip": skip is not None})
        if oss:
            item.add_marker(pytest.mark.skip(reason="oss_skip: Monarch's OSS CI does not run it"))
    if listing:
        with open(listing, "w") as f:
            json.dump(found, f)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    fn = pyfuncitem.obj
    if inspect.iscoroutinefunction(fn):
        args = {a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames}
        asyncio.run(fn(**args))
        return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    """Async generator fixtures (Monarch's tests use pytest-asyncio) run on a loop of their own."""
    fn = fixturedef.func
    if inspect.isasyncgenfunction(fn):
        def run(*args, **kwargs):
            loop = asyncio.new_event_loop()
            agen = fn(*args, **kwargs)
            try:
                yield loop.run_until_complete(agen.__anext__())
                try:
                    loop.run_until_complete(agen.__anext__())
                except StopAsyncIteration:
                    pass
            finally:
                loop.close()

        fixturedef.func = run
    return None


@pytest.fixture(autouse=True)
def _stop_left_over_meshes():
    """What Monarch's stop_all_proc_meshes does: a test's leftover proc meshes do not outlive it."""
    yield
    from jupyter_mesh import lowlevel

    for state in lowlevel.mesh_states():
        try:
            lowlevel.proc_mesh(state.mesh_id).stop()
        except Exception:
            pass
'''


class Source:
    """Files of a Monarch checkout or of its (bare) git directory."""

    def __init__(self, path: str):
        self.root = Path(path)
        self.git = (self.root / "HEAD").exists() and (self.root / "objects").exists()
        self.rev = ""
        if self.git:
            self.rev = self._git("rev-parse", "HEAD").strip()
        elif (self.root / ".git").exists():
            self.rev = subprocess.run(
                ["git", "-C", str(self.root), "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip()

    def _git(self, *args: str) -> str:
        return subprocess.run(
            ["git", f"--git-dir={self.root}", *args], capture_output=True, text=True, check=True
        ).stdout

    def read(self, rel: str) -> str:
        if self.git:
            return self._git("show", f"HEAD:{rel}")
        return (self.root / rel).read_text()


def public_names(src: Source) -> set[str]:
    names = set(PUBLIC_EXTRA)
    for rel in PUBLIC_MODULES:
        text = src.read(rel)
        m = re.search(r"__all__\s*=\s*\[(.*?)\]", text, re.S)
        if m:
            names |= set(re.findall(r"[\"'](\w+)[\"']", m.group(1)))
    return names


_FROM = re.compile(r"\bfrom[ \t]+(monarch(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[\w \t,]+)")
_IMPORT = re.compile(r"(?m)^([ \t]*)import[ \t]+(monarch(?:\.\w+)*)[ \t]*$")


class Rewriter:
    """Monarch imports -> ours; names we lack or internals -> placeholders (``_monarch_gap``)."""

    def __init__(self, public: set[str]):
        self.public = public
        self.lacking: set[str] = set()
        import importlib

        self._has: dict[tuple[str, str], bool] = {}
        self._import = importlib.import_module

    def has(self, module: str, name: str) -> bool:
        key = (module, name)
        if key not in self._has:
            try:
                self._has[key] = hasattr(self._import(module), name)
            except ImportError:
                self._has[key] = False
        return self._has[key]

    def _names(self, text: str) -> list[tuple[str, str]]:
        text = re.sub(r"#[^\n]*", "", text).strip("() \t\n")
        out = []
        for part in text.split(","):
            bits = part.split()
            if bits:
                out.append((bits[0], bits[2] if len(bits) == 3 and bits[1] == "as" else bits[0]))
        return out

    def _from(self, m: re.Match[str]) -> str:
        module, names = m.group(1), self._names(m.group(2))
        ours = REWRITES.get(module)
        stmts: list[str] = []
        for name, alias in names:
            bound = name if alias == name else f"{name} as {alias}"
            if ours is not None and name in self.public and self.has(ours, name):
                stmts.append(f"from {ours} import {bound}")
            elif ours is not None and name in self.public:
                self.lacking.add(name)
                stmts.append(f"from _monarch_gap import lacking__{name} as {alias}")
            else:
                stmts.append(f"from _monarch_gap import internal__{name} as {alias}")
        return "; ".join(stmts)

    def _import_stmt(self, m: re.Match[str]) -> str:
        indent, module = m.group(1), m.group(2)
        if module in ("monarch", "monarch.actor"):
            config = "; import jupyter_mesh.config" if self.has("jupyter_mesh", "config") else ""
            return f"{indent}import jupyter_mesh{config}"
        last = module.split(".")[-1]
        return f"{indent}from _monarch_gap import internal__{last} as {last}"

    def rewrite(self, text: str) -> str:
        text = _FROM.sub(self._from, text)
        text = _IMPORT.sub(self._import_stmt, text)
        for old, new in ATTRIBUTE_REWRITES.items():
            text = text.replace(old, new)
        return text


def export(src: Source, work: Path, files: list[str]) -> Rewriter:
    rw = Rewriter(public_names(src))
    (work / "_monarch_gap.py").write_text(_GAP_MODULE)
    (work / "conftest.py").write_text(_CONFTEST)
    for name in [*files, *HELPERS]:
        (work / name).write_text(rw.rewrite(src.read(f"{TESTS}/{name}")))
    (work / "examples").mkdir(exist_ok=True)
    for rel in EXAMPLES:
        (work / "examples" / Path(rel).name).write_text(rw.rewrite(src.read(rel)))
    return rw


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(work), str(PACKAGE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def collect(work: Path, name: str, k: str | None) -> list[dict[str, Any]]:
    """The file's tests, listed with placeholders that let its decorators pass, so a test counts even
    when a missing name stops the file from importing; by their names alone if it still fails."""
    listing = work / f"{name}.collected.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", name]
    if k:
        cmd += ["-k", k]
    env = {**_env(work), "MONARCH_SUITE_COLLECT": str(listing)}
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and listing.exists() and not json.loads(listing.read_text()):
        listing.unlink()  # the file did not import even so: ``load_file`` lists its tests by name
    return json.loads(listing.read_text()) if listing.exists() else []


def run_file(work: Path, name: str, timeout: int, k: str | None, file_limit: int) -> list[dict[str, Any]]:
    """pytest on one file (a crash or hang in one file does not take the others with it)."""
    collect(work, name, k)
    xml = work / f"{name}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--timeout={timeout}", f"--junitxml={xml}", "-o", "junit_family=xunit1", name]  # fmt: skip
    if k:
        cmd += ["-k", k]
    try:
        proc = subprocess.run(cmd, cwd=work, env=_env(work), capture_output=True, text=True, timeout=file_limit)
        tail = proc.stdout[-3000:]
    except subprocess.TimeoutExpired as e:
        tail = f"file timed out after {file_limit}s: {(e.stdout or b'')[-2000:]!r}"
    (work / f"{name}.log").write_text(tail)
    return load_file(work, name)


def load_file(work: Path, name: str) -> list[dict[str, Any]]:
    """One file's outcomes, from what ``collect`` and pytest left in ``work``."""
    listing = work / f"{name}.collected.json"
    tests = json.loads(listing.read_text()) if listing.exists() else []
    if not tests:
        import ast

        tree = ast.parse((work / name).read_text())
        tests = [
            {"name": n.name, "oss_skip": False, "skip": False, "approximate": True}
            for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
        ]
    log = work / f"{name}.log"
    tail = log.read_text() if log.exists() else ""
    xml = work / f"{name}.xml"
    ran = {r["test"]: r for r in parse_junit(xml, name)} if xml.exists() else {}
    collection_error = next((r["why"] for r in ran.values() if r["test"] in ("", name.removesuffix(".py"))), "")
    out = []
    for t in tests:
        rec = ran.get(t["name"]) or {
            "file": name, "test": t["name"], "outcome": "error",
            "why": "file did not import: " + (collection_error or tail[-800:]),
        }  # fmt: skip
        out.append({**rec, "oss_skip": t["oss_skip"], "skip": t["skip"], "approximate": t.get("approximate", False)})
    return out


def parse_junit(xml: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        test = case.get("name", "")
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                why = (el.get("message") or "") + "\n" + (el.text or "")
                break
        out.append({"file": name, "test": test, "outcome": outcome, "why": why})
    return out


def excluded(rec: dict[str, Any]) -> str | None:
    base = rec["test"].split("[")[0]
    return EXCLUDED.get(f"{rec['file']}::{base}") or EXCLUDED.get(rec["file"])


def not_run_by_monarch(rec: dict[str, Any]) -> bool:
    return bool(rec.get("oss_skip") or rec.get("skip"))


def first_gap(why: str) -> str | None:
    m = re.search(r"PortGap: (.*?): (\w+)", why)
    if m:
        return f"{m.group(2)} ({'internal' if 'internal' in m.group(1) else 'lacking'})"
    return None


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    per_file: dict[str, Counter[str]] = {}
    why_excluded: Counter[str] = Counter()
    gaps: Counter[str] = Counter()
    unlisted_internal: list[str] = []
    failing: list[dict[str, str]] = []
    applicable = passed = 0
    for rec in records:
        c = per_file.setdefault(rec["file"], Counter())
        reason = excluded(rec)
        if reason is not None:
            c["excluded"] += 1
            why_excluded[reason] += 1
            continue
        if not_run_by_monarch(rec):
            c["not_run_by_monarch"] += 1
            continue
        c[rec["outcome"]] += 1
        if rec["outcome"] == "skipped":
            continue
        applicable += 1
        if rec["outcome"] == "passed":
            passed += 1
            continue
        gap = first_gap(rec["why"])
        if gap is not None:
            gaps[gap] += 1
            if gap.endswith("(internal)"):
                unlisted_internal.append(f"{rec['file']}::{rec['test']}")
        first = next((ln for ln in rec["why"].splitlines() if ln.strip()), "")
        failing.append({"test": f"{rec['file']}::{rec['test']}", "why": first[:300]})
    return {
        "applicable": applicable,
        "passed": passed,
        "pass_rate": round(passed / applicable, 3) if applicable else None,
        "per_file": {f: dict(c) for f, c in per_file.items()},
        "excluded": dict(why_excluded.most_common()),
        "gaps": dict(gaps.most_common()),
        "internal_not_excluded": unlisted_internal,
        "failing": failing,
    }


def run_examples(work: Path, limit: int) -> dict[str, Any]:
    out = {}
    for rel in EXAMPLES:
        name = Path(rel).name
        t0 = time.monotonic()
        try:
            p = subprocess.run([sys.executable, f"examples/{name}"], cwd=work, env=_env(work),
                               capture_output=True, text=True, timeout=limit)  # fmt: skip
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = None, f"timed out after {limit}s; {(e.stderr or b'')[-1500:]!r}"
        last = [ln for ln in err.splitlines() if ln.strip()][-3:]
        out[name] = {"ok": rc == 0, "rc": rc, "seconds": round(time.monotonic() - t0, 1), "stderr_tail": last}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--monarch-src", required=True, help="a checkout of meta-pytorch/monarch, or its git dir")
    ap.add_argument("--files", help="comma-separated subset of the test files")
    ap.add_argument("-k", help="pytest -k expression")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per test (pytest-timeout)")
    ap.add_argument("--file-timeout", type=int, default=1800, help="seconds per test file")
    ap.add_argument("--no-examples", action="store_true")
    ap.add_argument("--example-timeout", type=int, default=180)
    ap.add_argument("--workdir", help="export here (kept) instead of a temporary directory")
    ap.add_argument("--details", action="store_true", help="list every failing test with its first line")
    ap.add_argument("--package", help="the jupyter_mesh checkout to test (default: this one)")
    ap.add_argument("--resummarize", action="store_true", help="count again what a run left in --workdir")
    a = ap.parse_args()
    global PACKAGE
    if a.package:
        PACKAGE = Path(a.package).resolve()
        sys.path.insert(0, str(PACKAGE))
    src = Source(a.monarch_src)
    files = a.files.split(",") if a.files else FILES
    tmp = None
    if a.workdir:
        work = Path(a.workdir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="monarch-suite-")
        work = Path(tmp.name)
    if a.resummarize:
        if not a.workdir:
            ap.error("--resummarize needs --workdir")
        records = [r for name in files for r in load_file(work, name)]
        print(json.dumps({"monarch_rev": src.rev, "files": len(files), **summarize(records)}, indent=1))
        return
    rw = export(src, work, files)
    records = []
    for name in files:
        records += run_file(work, name, a.timeout, a.k, a.file_timeout)
    result: dict[str, Any] = {"monarch_rev": src.rev, "files": len(files), **summarize(records)}
    result["lacking_names_imported"] = sorted(rw.lacking)
    if not a.details:
        result.pop("failing")
    if not a.no_examples and not a.k:
        result["examples"] = run_examples(work, a.example_timeout)
    print(json.dumps(result, indent=1))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
