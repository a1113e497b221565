// The mesh widget's view (anywidget ESM). Renders the `meshes` trait (MeshWire snapshots, see
// jupyter_mesh/ui/wire.py); the kernel pushes new values, this code never polls.

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) el.append(c);
  return el;
}

function coordLabel(mesh, coords, upto = mesh.dims.length) {
  return mesh.dims.slice(0, upto).map((d, i) => `${d}=${coords[i]}`).join(",");
}

// The last two dims as rows x columns, one grid per combination of the leading dims.
function slices(mesh) {
  const n = mesh.dims.length;
  const cols = n ? mesh.sizes[n - 1] : 1;
  const rows = n >= 2 ? mesh.sizes[n - 2] : 1;
  const lead = Math.max(0, n - 2);
  const ranks = [...mesh.ranks].sort((a, b) => a.rank - b.rank);
  const out = [];
  for (let s = 0; s < ranks.length; s += rows * cols) {
    const chunk = ranks.slice(s, s + rows * cols);
    out.push({ label: lead ? coordLabel(mesh, chunk[0].coords, lead) : "", cols, ranks: chunk });
  }
  return out;
}

function progress(label, p) {
  return h("div", { class: "jm-progress" }, h("span", {}, label),
    h("progress", { max: String(p.total), value: String(p.done) }), h("span", {}, `${p.done} / ${p.total}`));
}

function detail(mesh, r) {
  const where = `rank ${r.rank} [${coordLabel(mesh, r.coords)}]`;
  const box = h("div", { class: "jm-detail", "data-testid": "jm-detail" },
    h("div", {}, h("b", {}, where), ` ${r.state}`, r.pid ? ` · pid ${r.pid}` : "",
      r.inflight ? ` · ${r.inflight} call(s) in flight` : ""));
  if (r.note) box.append(h("div", { class: "jm-note" }, r.note));
  if (r.failure) {
    box.append(h("div", {}, `${r.failure.kind}: ${r.failure.detail}`));
    if (r.failure.traceback) box.append(h("pre", {}, r.failure.traceback));
  }
  return box;
}

function renderMesh(mesh, selected, select) {
  const box = h("div", { class: "jm-mesh" + (mesh.stopped ? " jm-stopped-mesh" : ""), "data-mesh": mesh.name });
  const shape = mesh.dims.map((d, i) => `${d}=${mesh.sizes[i]}`).join(" × ") || "1 proc";
  const head = h("div", { class: "jm-head" }, h("span", { class: "jm-name" }, mesh.name),
    h("span", { class: "jm-shape" }, shape + (mesh.stopped ? " (stopped)" : "")));
  for (const s of Object.keys(mesh.counts)) { // every state, in ProcState order (see wire.py)
    if (mesh.counts[s]) head.append(h("span", { class: `jm-chip jm-${s}`, "data-count": s }, `${mesh.counts[s]} ${s}`));
  }
  head.append(h("span", { class: "jm-inflight" }, `${mesh.inflight} call(s) in flight`));
  box.append(head);
  if (mesh.spawn.done < mesh.spawn.total && !mesh.stopped) box.append(progress("spawn", mesh.spawn));
  if (mesh.gather && mesh.gather.total > 1) box.append(progress("replies", mesh.gather));
  for (const sl of slices(mesh)) {
    if (sl.label) box.append(h("div", { class: "jm-slice-label" }, sl.label));
    const grid = h("div", { class: "jm-grid", style: `grid-template-columns: repeat(${sl.cols}, auto)` });
    for (const r of sl.ranks) {
      const title = `rank ${r.rank} [${coordLabel(mesh, r.coords)}] ${r.state}` +
        (r.failure ? `: ${r.failure.detail}` : "") + (r.note ? ` (${r.note})` : "");
      const cell = h("div", {
        class: `jm-cell jm-${r.state}` + (selected === r.rank ? " jm-selected" : ""),
        title, "data-rank": r.rank, "data-state": r.state,
        onclick: () => select(selected === r.rank ? null : r.rank),
      }, String(r.rank));
      if (r.inflight > 1) cell.append(h("span", { class: "jm-badge" }, String(r.inflight)));
      grid.append(cell);
    }
    box.append(grid);
  }
  const sel = mesh.ranks.find((r) => r.rank === selected);
  if (sel) box.append(detail(mesh, sel));
  return box;
}

function render({ model, el }) {
  const root = h("div", { class: "jm-widget" });
  el.append(root);
  const selected = new Map(); // mesh_id -> selected rank (view-local)
  const draw = () => {
    const meshes = model.get("meshes") || [];
    root.replaceChildren();
    if (!meshes.length) {
      root.append(h("div", { class: "jm-empty" }, "No proc mesh yet: spawn one (this_host().spawn_procs(...) or %mesh up)."));
      return;
    }
    for (const m of meshes) {
      root.append(renderMesh(m, selected.get(m.mesh_id) ?? null, (rank) => { selected.set(m.mesh_id, rank); draw(); }));
    }
  };
  model.on("change:meshes", draw);
  draw();
  return () => model.off("change:meshes", draw);
}

export default { render };
