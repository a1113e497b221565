"""Unit tests of the wire: signing, framing, serialization (no processes)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import msgpack
import pytest

from jupyter_mesh._wire.serialize import INBAND_LIMIT, dumps, loads
from jupyter_mesh._wire.transport import Message, Transport

KEY = b"k" * 32


@pytest.fixture
def transport():
    t = Transport(KEY)
    yield t
    t.close()


class Boom:
    def __reduce__(self):
        raise AssertionError("must never be pickled in these tests")


def _evil_payload() -> bytes:
    # unpickling this would run os.system: it must never be unpickled
    return b"cos\nsystem\n(S'touch /tmp/jm-should-not-exist'\ntR."


def test_roundtrip_and_buffers(transport):
    np = pytest.importorskip("numpy")
    a = np.arange(INBAND_LIMIT, dtype=np.uint8)
    payload, bufs = dumps({"a": a, "n": 3})
    assert len(bufs) == 1 and len(payload) < 1000  # the array is not inside the pickle
    frames = transport.encode(Message({"k": "c", "i": 1}, payload, bufs), transport.address)
    msg = transport.decode(frames)
    assert msg is not None and msg.header["k"] == "c"
    out = loads(msg.payload, msg.buffers)
    assert (out["a"] == a).all() and out["n"] == 3


@pytest.mark.parametrize(
    "mutate",
    [
        "wrong_key",
        "flip_header",
        "flip_payload",
        "truncate",
        "unsigned",
        "extra_buffer",
        "short_buffer",
        "not_msgpack",
        "wrong_version",
    ],
)
def test_forged_or_broken_frames_are_dropped_and_counted(transport, mutate):
    payload = _evil_payload()
    good = transport.encode(Message({"k": "c", "i": 1}, payload, [b"x" * 10]), transport.address)
    frames = list(good)
    if mutate == "wrong_key":
        other = Transport(b"z" * 32)
        frames = other.encode(Message({"k": "c", "i": 1}, payload), transport.address)
        other.close()
    elif mutate == "flip_header":
        frames[1] = frames[1][:-1] + bytes([frames[1][-1] ^ 1])
    elif mutate == "flip_payload":
        frames[2] = frames[2][:-1] + b"X"
    elif mutate == "truncate":
        frames = frames[:2]
    elif mutate == "unsigned":
        frames = [b"", frames[1], frames[2]]
    elif mutate == "extra_buffer":
        frames = [*frames, b"more"]
    elif mutate == "short_buffer":
        frames[3] = b"x" * 9
    elif mutate == "not_msgpack":
        h = b"\xc1garbage"
        frames = [transport._sign(h, payload), h, payload]
    elif mutate == "wrong_version":
        h = msgpack.packb({"k": "c", "v": 999, "nb": []})
        frames = [transport._sign(h, payload), h, payload]
    before = transport.stats.dropped
    assert transport.decode(frames) is None
    assert transport.stats.dropped == before + 1


def test_torch_tensor_travels_out_of_band():
    torch = pytest.importorskip("torch")
    t = torch.randn(256, 256)
    payload, bufs = dumps(t)
    assert len(bufs) == 1 and bufs[0].nbytes == t.nbytes and len(payload) < 500
    assert torch.equal(loads(payload, bufs), t)


def test_main_classes_pickle_by_value():
    code = (
        "from jupyter_mesh._wire.serialize import dumps\n"
        "class Local:\n    def hi(self): return 'hi'\n"
        "import sys; p, b = dumps(Local()); sys.stdout.buffer.write(p)\n"
    )
    blob = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    obj = pickle.loads(blob)
    assert obj.hi() == "hi"


_HEAVY = ("torch", "IPython", "ipywidgets", "ucxx", "numpy")
_API = ("asyncio", "jupyter_mesh._api.mesh", "jupyter_mesh.jobs", "jupyter_mesh._core.actor")


@pytest.mark.parametrize(
    "module, absent",
    [
        # a script or kernel: the facade loads each name on first use
        ("jupyter_mesh", _HEAVY + _API + ("zmq", "jupyter_mesh.config")),
        # a fork server (template): its warm child starts importing torch as soon as it can
        ("jupyter_mesh._runtime.template", _HEAVY + _API + ("zmq", "cloudpickle", "jupyter_mesh._wire")),
        # an agent: it serves procs, never the API
        ("jupyter_mesh._runtime.agent_boot", _HEAVY + _API),
        # a local agent's first step: it starts its template before it loads the agent
        (
            "jupyter_mesh._runtime.agent_main",
            _HEAVY + _API + ("zmq", "jupyter_mesh._runtime.agent", "jupyter_mesh._wire"),
        ),
    ],
)
def test_each_process_starts_with_only_what_it_needs(module, absent):
    """Every agent, template and script starts by running the package's ``__init__``: when that
    imported the whole API (asyncio, the jobs) each of them paid ~70 ms before its own work, three
    times in a row before a host's first proc."""
    code = f"import sys, {module}\nprint(','.join(m for m in {absent!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_facade_loads_a_name_on_first_use_and_knows_no_other():
    code = (
        "import sys, jupyter_mesh as jm\n"
        "assert 'jupyter_mesh._core.actor' not in sys.modules\n"
        "from jupyter_mesh import Actor, endpoint\n"
        "assert Actor.__module__ == 'jupyter_mesh._core.actor' and 'Actor' in vars(jm)\n"
        "assert 'jupyter_mesh.jobs' not in sys.modules\n"
        "assert jm.config.__name__ == 'jupyter_mesh.config' and 'this_host' in dir(jm)\n"
        "try:\n    jm.spawn_procs\nexcept AttributeError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "module 'jupyter_mesh' has no attribute 'spawn_procs'"


_IMPORT_RACE = """
import importlib, threading
import jupyter_mesh
names = ["mod:jupyter_mesh._data.buffer", "attr:attach_to_workers", "attr:concurrent_endpoint",
         "mod:jupyter_mesh.jobs.slurm", "attr:LocalJob", "mod:jupyter_mesh.jobs.local", "attr:MeshInterrupted",
         "mod:jupyter_mesh.ui.mesh_widget", "mod:jupyter_mesh.ui.values", "mod:jupyter_mesh.ui.hub",
         "mod:jupyter_mesh.spmd.launch", "mod:jupyter_mesh.spmd.actor", "mod:jupyter_mesh.spmd.stuck"]
start = threading.Barrier(len(names))
errors = []
def load(spec):
    start.wait()
    kind, name = spec.split(":")
    try:
        getattr(jupyter_mesh, name) if kind == "attr" else importlib.import_module(name)
    except BaseException as e:
        errors.append(f"{spec}: {e!r}")
threads = [threading.Thread(target=load, args=(n,)) for n in names]
[t.start() for t in threads]
[t.join(60) for t in threads]
print(errors or "ok")
"""


def test_threads_that_load_names_and_import_submodules_at_once_do_not_deadlock():
    """Names load on first use, so threads may import the package's modules concurrently. A package whose
    ``__init__`` imported its submodules (``jobs`` did; ``spmd`` and ``ui`` every time) deadlocked
    CPython's module locks: one thread in ``jobs/__init__`` waiting for ``jobs.slurm``, another importing ``jobs.slurm``
    directly and waiting for ``jobs`` (``_DeadlockError``). Fresh interpreters, each a new race."""
    outs = []
    for _ in range(15):  # two at a time: more at once on two cores makes the race rarer
        pair = [
            subprocess.Popen(
                [sys.executable, "-c", _IMPORT_RACE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for _ in range(2)
        ]
        outs += [p.communicate(timeout=120)[0].strip() for p in pair]
    assert outs == ["ok"] * len(outs), [o for o in outs if o != "ok"]


def test_public_api_is_sorted_and_complete():
    import jupyter_mesh

    assert list(jupyter_mesh.__all__) == sorted(jupyter_mesh.__all__)
    for name in jupyter_mesh.__all__:
        assert hasattr(jupyter_mesh, name)
    for name in ("Actor", "endpoint", "this_host", "current_rank", "ValueMesh", "Future", "ActorError"):
        assert name in jupyter_mesh.__all__


def test_every_public_error_survives_pickling_with_its_attributes():
    """An error raised in an endpoint travels back pickled: one that does not unpickle reaches the
    caller as an ActorError without its ``exception`` (MeshTimeoutError needed three arguments)."""
    import jupyter_mesh as jm
    from jupyter_mesh import errors

    f = jm.Failure("m", {"gpus": 1}, "signal", "killed", "tail", None, 9)
    rf = jm.RemoteFailure({"gpus": 1}, "a", "ep", "ValueError", "bad", "tb")
    samples = {
        jm.ActorError: jm.ActorError([rf], 2),
        jm.SupervisionError: jm.SupervisionError([f], "during x"),
        errors.MeshFailure: errors.MeshFailure([f], "while nothing was waiting on it"),
        jm.DeliveryError: jm.DeliveryError([f], "during x"),
        jm.MeshTimeoutError: jm.MeshTimeoutError("call", 2.5, "inner call"),
        jm.MeshInterrupted: jm.MeshInterrupted("stopped", [{"gpus": 1}]),
        errors.ReduceError: errors.ReduceError("sum", "TypeError: bad operand", "the agent at ipc://x", "during y"),
    }
    public = [getattr(errors, n) for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    for cls in public:
        if not issubclass(cls, BaseException):
            continue
        e = samples.get(cls) or cls("message")
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and str(back) == str(e), cls
        assert {k: v for k, v in vars(back).items()} == {k: v for k, v in vars(e).items()}, cls


def test_a_timeout_whose_cause_ends_a_sentence_reads_as_one():
    """A cell's timeout quotes its cancel's report, which ends with a full stop: the text read
    '... %mesh respawn.. Raise the timeout'."""
    import jupyter_mesh as jm

    e = jm.MeshTimeoutError("call", 5, "it was cancelled, and 2 procs were killed: `%mesh respawn`.")
    assert ".." not in str(e) and "`%mesh respawn`. Raise the timeout" in str(e)
    assert pickle.loads(pickle.dumps(e)).what == e.what
