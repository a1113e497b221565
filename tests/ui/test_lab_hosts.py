"""Issue 13 ("Seeing it") in a real JupyterLab in Chromium: the sidebar and the widget group a mesh's
ranks by host, each group headed by the host's address and state; a host whose agent is killed turns
"lost" with its cause; a SLURM-placed mesh shows its job id, kept alive, and the hosts' IPs. Leaves
hosts.png (the README's picture of two hosts)."""

from __future__ import annotations

import pytest
from _lab import cell, notebook, run_cell, shot, sidebar_parts, start

pytestmark = [pytest.mark.ui, pytest.mark.timeout(180)]

# Two agents on this machine are two hosts, both "local". The last cell feeds a widget a snapshot of
# a SLURM-placed mesh (TCP agents, one host cut off): the same renderer draws what a cluster gives.
REMOTE = """from jupyter_mesh._core.state import StateTracker
from jupyter_mesh.ui.wire import mesh_wire
t = StateTracker()
coords = [{'hosts': h, 'gpus': g} for h in range(2) for g in range(2)]
t.created('x', 'remote', {'hosts': 2, 'gpus': 2}, coords, ['tcp://10.213.0.3:4100', 'tcp://10.213.0.4:4100'],
          [0, 0, 1, 1], {'kind': 'slurm', 'id': '12', 'keep_alive': True})
t.host_lost('tcp://10.213.0.4:4100', 'unreachable', 'host 10.213.0.4 unreachable for 3.1 s')
w = ui.widget('no-such-mesh')
w.meshes = [mesh_wire(t.snapshot('x'))]
w"""


def test_ranks_grouped_by_host_with_address_and_state(page, lab):
    notebook(
        lab.root / "hosts.ipynb",
        [
            "from jupyter_mesh import LocalJob, ui\njob = LocalJob(hosts=2)\n"
            "hh = job.host_mesh().spawn_procs(per_host={'gpus': 2}, name='hh')\nui.widget(hh)",
            "import os, signal\nos.kill(job.pids()[1], signal.SIGKILL)",
            REMOTE,
            "hh.stop(); job.stop()",
        ],
    )
    start(page, lab, "hosts.ipynb")
    run_cell(page, 0, allow_tracebacks=False)
    side = page.locator("#jupyter-mesh-sidebar section.jm-mesh[data-mesh='hh']")
    widget = cell(page, 0).locator(".jm-widget")
    for view in (side, widget):
        view.locator(".jm-cell[data-state='idle']").nth(3).wait_for(timeout=20_000)
        groups = view.locator(".jm-host-group")
        assert groups.count() == 2
        for i in (0, 1):
            g = view.locator(f".jm-host-group[data-host='{i}']")
            assert g.get_attribute("data-address") == "local" and g.get_attribute("data-host-state") == "up"
            assert g.locator(".jm-host-address").inner_text() == "local"
            assert f"host {i}" in g.locator(".jm-host-head").inner_text()
            ranks = [c.get_attribute("data-rank") for c in g.locator(".jm-cell").all()]
            assert ranks == [str(2 * i), str(2 * i + 1)]
        assert view.locator(".jm-job").count() == 0  # local agents: no job line

    run_cell(page, 1, allow_tracebacks=False)  # host 1's agent killed: lost, with why
    for view in (side, widget):
        lost = view.locator(".jm-host-group[data-host='1'][data-host-state='lost']")
        lost.wait_for(timeout=20_000)
        assert lost.locator("[data-host-label='lost']").inner_text() == "lost"
        assert "killed by SIGKILL" in lost.locator(".jm-host-why").inner_text()
        lost.locator(".jm-cell[data-rank='3'][data-state='failed']").wait_for(timeout=10_000)
        up = view.locator(".jm-host-group[data-host='0']")
        assert up.get_attribute("data-host-state") == "up" and up.locator(".jm-host-why").count() == 0
    page.wait_for_function("() => window.__jmNb.sessionContext.session.kernel.status === 'idle'", timeout=30_000)
    toolbar, _, sidebar = sidebar_parts(page)
    shot(page, lab, "hosts.png", toolbar, cell(page, 0), cell(page, 1), sidebar)

    run_cell(page, 2, allow_tracebacks=False)  # a cluster's mesh: IPs, the SLURM job, kept alive
    remote = cell(page, 2).locator(".jm-widget .jm-mesh[data-mesh='remote']")
    remote.wait_for(timeout=10_000)
    assert remote.locator(".jm-job[data-job='slurm']").inner_text() == "SLURM job 12 · kept alive past this kernel"
    assert [a.inner_text() for a in remote.locator(".jm-host-address").all()] == ["10.213.0.3", "10.213.0.4"]
    cut = remote.locator(".jm-host-group[data-host='1']")
    assert cut.get_attribute("data-host-state") == "unreachable"
    assert "unreachable for 3.1 s" in cut.locator(".jm-host-why").inner_text()
    run_cell(page, 3, allow_tracebacks=False)
    side.locator(".jm-cell").first.wait_for(state="detached", timeout=20_000)  # the sidebar lists running meshes
    page.evaluate("() => window.__jmNb.sessionContext.session.kernel.shutdown()")
