"""Unit tests of the notebook output router (no processes, no kernel) and of the front's import weight."""

from __future__ import annotations

import subprocess
import sys
import threading

from jupyter_mesh.notebook.output import SYNC_PREFIX, OutputRouter, fold_label, group_by_rank


def test_fold_label():
    assert fold_label([f"hosts=0,gpus={g}" for g in range(4)]) == "gpus 0-3"
    assert fold_label(["hosts=0,gpus=2"]) == "gpus=2"
    assert fold_label(["hosts=1,gpus=0"]) == "hosts=1 gpus=0"
    assert fold_label(["hosts=0,gpus=0", "hosts=0,gpus=2", "hosts=0,gpus=3"]) == "gpus 0,2-3"
    assert fold_label([f"hosts={h},gpus={g}" for h in range(2) for g in range(2)]) == "hosts 0-1 gpus 0-1"
    assert fold_label(["hosts=0,gpus=0", "hosts=1,gpus=1"]) == "hosts=0,gpus=0; hosts=1,gpus=1"  # not a box


class _Sink:
    def __init__(self):
        self.got: list[tuple[object, str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, parent, name, text):
        with self.lock:
            self.got.append((parent, name, text))

    def text(self, name="stdout"):
        return "".join(t for _, n, t in self.got if n == name)


def test_router_folds_routes_limits_and_syncs():
    sink = _Sink()
    r = OutputRouter(sink, window=0.05, cell_lines=10)
    try:
        r.sink("m", 0, "gpus=0", 1, ["between cells"])  # no cell: not shown
        r.begin_cell({"msg_id": "A"})
        for rank in range(4):
            r.sink("m", rank, f"gpus={rank}", 1, ["loss 0.42", "loss 0.42", f"mine {rank}"])
        r.flush()
        out = sink.text()
        assert "between cells" not in out
        assert out.count("[gpus 0-3] loss 0.42\n") == 2  # the n-th repeat folds with the others' n-th
        assert "[gpus=3] mine 3\n" in out
        assert {p["msg_id"] for p, _, _ in sink.got} == {"A"}
        ev = r.expect_sync("tok", 2)
        r.sink("m", 0, "gpus=0", 1, [f"partial{SYNC_PREFIX}tok"])
        r.sink("m", 0, "gpus=0", 2, [f"{SYNC_PREFIX}tok"])
        assert ev.wait(1.0)
        r.sink("m", 1, "gpus=1", 2, [f"flood {i}" for i in range(100)])
        r.end_cell()
        err = sink.text("stderr")
        assert "output truncated after 10 lines" in err and "more worker lines not shown here" in err
        assert "[gpus=0] partial\n" in sink.text() and SYNC_PREFIX not in sink.text() + err
    finally:
        r.close()


def test_group_by_rank():
    from jupyter_mesh.notebook.output import LogLine

    lines = [LogLine(0, "m", r, f"gpus={r}", 1, t) for r in range(4) for t in ("a", f"b{r % 2}")]
    assert group_by_rank(lines) == "--- [gpus 0,2] ---\na\nb0\n--- [gpus 1,3] ---\na\nb1\n"


def test_package_and_worker_side_do_not_import_ipython():
    code = (
        "import sys, jupyter_mesh, jupyter_mesh.notebook.remote_exec\n"
        "print([m for m in ('IPython', 'ipykernel', 'jupyter_client') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
