// GENERATED from labextension/ by `npm run build:lib` (labextension/build-widget.mjs): do not edit.
// The mesh grid: the one renderer of a mesh, for the JupyterLab sidebar (view.ts) and the notebook
// widget. A mesh's name and shape, its job (a scheduler's id, kept alive), a chip per state, calls in
// flight, spawn and reply progress, its procs as grids coloured by state (the last two dims as rows x
// columns, one grid per combination of the leading dims; grouped under a line per host with its address
// and state when there are several hosts, or one elsewhere or gone), recent failures, and the selected
// proc's state and cause. Plain DOM; the caller keeps the selection and redraws. The look is labextension/style/grid.css (+ states.css).
//
// This file alone also compiles to the widget's anywidget ESM, jupyter_mesh/ui/static/widget.js
// (`npm run build:lib` runs labextension/build-widget.mjs). anywidget loads one self-contained file,
// so this module imports types only; the build fails if the output imports anything.
/** An element with attributes (set as attributes: class, style, data-*) and children (nulls skipped). */
export function h(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
        node.setAttribute(k, v);
    }
    for (const c of children) {
        if (c !== null) {
            node.append(c);
        }
    }
    return node;
}
export function coordLabel(mesh, coords, upto = mesh.dims.length) {
    return mesh.dims
        .slice(0, upto)
        .map((d, i) => `${d}=${coords[i]}`)
        .join(',');
}
export function shapeLabel(mesh) {
    return mesh.dims.map((d, i) => `${d}=${mesh.sizes[i]}`).join(' × ') || '1 proc';
}
/** The hosts that run ranks of the mesh (a shrunk mesh may keep an agent with none). */
export function usedHosts(mesh) {
    var _a;
    const used = new Set(mesh.ranks.map(r => { var _a; return (_a = r.host) !== null && _a !== void 0 ? _a : 0; }));
    return ((_a = mesh.hosts) !== null && _a !== void 0 ? _a : []).filter(h => used.has(h.index));
}
/**
 * Whether the ranks are headed by host (jupyter_mesh/ui/table.py show_hosts): they run on several, or on
 * one elsewhere (an address worth reading) or gone (its cause). One host on this machine, up: no header.
 */
export function showHosts(mesh) {
    const hosts = usedHosts(mesh);
    return hosts.length > 1 || hosts.some(x => x.address !== 'local' || x.state !== 'up');
}
/** "SLURM job 12", "attached agents"; "" for local agents (nothing to add) unless kept alive
 * (jupyter_mesh/ui/table.py job_line). */
export function jobLabel(mesh) {
    var _a;
    const job = mesh.job;
    if (!job || (job.kind === 'local' && !job.keep_alive)) {
        return '';
    }
    const names = { attach: 'attached agents', local: 'local agents' };
    if (names[job.kind] !== undefined && !job.id) {
        return names[job.kind];
    }
    const schedulers = { slurm: 'SLURM', torchx: 'TorchX' };
    return `${(_a = schedulers[job.kind]) !== null && _a !== void 0 ? _a : job.kind} job` + (job.id ? ` ${job.id}` : ''); // "SLURM job 12"
}
export function renderMesh(mesh, opts) {
    var _a, _b, _c, _d, _e, _f;
    const box = h('section', {
        class: 'jm-mesh' + (mesh.stopped ? ' jm-stopped-mesh' : ''),
        'data-mesh': mesh.name,
        'data-procs': String(mesh.ranks.length)
    });
    box.append(h('div', { class: 'jm-head' }, h('b', { class: 'jm-name' }, mesh.name), h('span', { class: 'jm-shape' }, ` ${shapeLabel(mesh)}` + (mesh.stopped ? ' (stopped)' : '')), h('span', { class: 'jm-dim' }, ` · ${mesh.ranks.length} procs`)));
    const job = jobLabel(mesh);
    if (job) {
        box.append(h('div', { class: 'jm-job', 'data-job': (_b = (_a = mesh.job) === null || _a === void 0 ? void 0 : _a.kind) !== null && _b !== void 0 ? _b : '' }, job, ((_c = mesh.job) === null || _c === void 0 ? void 0 : _c.keep_alive) ? h('span', { class: 'jm-kept', 'data-kept': 'true' }, ' · kept alive past this kernel') : null));
    }
    const chips = h('div', { class: 'jm-chips' });
    // the keys of counts are every state, in ProcState order (jupyter_mesh/ui/wire.py)
    for (const s of Object.keys(mesh.counts)) {
        if (mesh.counts[s]) {
            chips.append(h('span', { class: `jm-chip jm-${s}`, 'data-count': s }, `${mesh.counts[s]} ${s}`));
        }
    }
    chips.append(h('span', { class: 'jm-dim jm-inflight' }, `${mesh.inflight} call(s) in flight`));
    box.append(chips);
    if (mesh.spawn.done < mesh.spawn.total && !mesh.stopped) {
        box.append(progress('spawn', mesh.spawn));
    }
    if (mesh.gather) {
        box.append(calls(mesh.gather));
        if ((_d = mesh.gather.waits) === null || _d === void 0 ? void 0 : _d.length) {
            box.append(waits(mesh.gather));
        }
    }
    box.append(grids(mesh, opts));
    const actions = (_f = (_e = opts.actions) === null || _e === void 0 ? void 0 : _e.call(opts, mesh)) !== null && _f !== void 0 ? _f : null;
    if (actions) {
        box.append(actions);
    }
    const selected = mesh.ranks.find(r => r.rank === opts.selected);
    if (selected) {
        box.append(detail(mesh, selected, opts));
    }
    if (mesh.failures.length) {
        // one line per cause, newest first: the ranks of a lost host all fail with its cause, which reads once
        const folded = new Map();
        for (const f of [...mesh.failures].reverse()) {
            const key = `${f.kind}\n${f.detail}`;
            const seen = folded.get(key);
            if (seen) {
                seen.labels.push(f.label);
            }
            else {
                folded.set(key, { labels: [f.label], kind: f.kind, detail: f.detail });
            }
        }
        const list = h('ul', { class: 'jm-failures' });
        for (const f of folded.values()) {
            list.append(h('li', {}, `[${f.labels.join('; ')}] ${f.kind}: ${f.detail}`));
        }
        box.append(h('div', { class: 'jm-dim' }, 'Recent failures'), list);
    }
    return box;
}
function progress(label, p) {
    return h('div', { class: 'jm-progress', 'data-progress': label }, h('span', {}, label), h('progress', { max: String(p.total), value: String(p.done) }), h('span', {}, `${p.done} / ${p.total}`));
}
/** A time of day (epoch seconds): "since 14:03:07" stays true between updates, "for 2 s" would not. */
function clock(epoch) {
    return new Date(epoch * 1000).toLocaleTimeString([], { hour12: false });
}
/** "3/8 done", live while a call runs (agents report ranks as they finish), with the ranks left. */
function calls(g) {
    const bar = progress('calls', g);
    bar.lastElementChild.textContent = `${g.done}/${g.total} done`;
    const more = g.total - g.done > g.left.length ? ', …' : '';
    bar.append(h('span', { class: 'jm-dim jm-left', 'data-left': g.left.join(',') }, `left: ${g.left.join(', ')}${more} · since ${clock(g.since)}`));
    return bar;
}
/** A long call: the ranks it still waits on, each with where it is (its top frame, or paused at). */
function waits(g) {
    var _a, _b, _c;
    const list = h('ul', { class: 'jm-waits', 'data-waits': String((_b = (_a = g.waits) === null || _a === void 0 ? void 0 : _a.length) !== null && _b !== void 0 ? _b : 0) });
    for (const w of (_c = g.waits) !== null && _c !== void 0 ? _c : []) {
        list.append(h('li', { 'data-rank': String(w.rank) }, `rank ${w.rank} [${w.label}] not answered: ${w.where}`));
    }
    return h('div', { class: 'jm-long-call' }, h('div', { class: 'jm-dim' }, `waiting since ${clock(g.since)}; not answered yet:`), list);
}
function grids(mesh, opts) {
    const out = h('div', { class: 'jm-grids' });
    const ranks = [...mesh.ranks].sort((a, b) => a.rank - b.rank);
    if (!showHosts(mesh)) {
        layout(out, mesh, mesh.dims.map((_, i) => i), mesh.sizes, ranks, opts);
        return out;
    }
    for (const host of usedHosts(mesh)) {
        const mine = ranks.filter(r => { var _a; return ((_a = r.host) !== null && _a !== void 0 ? _a : 0) === host.index; });
        const group = h('div', {
            class: `jm-host-group jm-host-group-${host.state}`,
            'data-host': String(host.index),
            'data-host-state': host.state,
            'data-address': host.address
        }, hostHead(host, mine.length));
        // a host's grid spans the dims along which its ranks differ (gpus of hosts x gpus)
        const spread = (i) => new Set(mine.map(r => r.coords[i])).size;
        const at = mesh.dims.map((_, i) => i).filter(i => spread(i) > 1);
        const sizes = at.map(spread);
        if (sizes.reduce((a, b) => a * b, 1) === mine.length) {
            layout(group, mesh, at, sizes, mine, opts);
        }
        else {
            layout(group, mesh, [], [], mine, opts); // not a block of the mesh (never, today): one row
        }
        out.append(group);
    }
    return out;
}
/** "up host 1 · 10.0.0.3 · 4 procs", and why a host that is not up went. */
function hostHead(host, procs) {
    return h('div', { class: 'jm-host-head' }, h('span', { class: `jm-chip jm-host-${host.state}`, 'data-host-label': host.state }, host.state), h('span', {}, `host ${host.index} · `), h('b', { class: 'jm-host-address' }, host.address), h('span', { class: 'jm-dim' }, ` · ${procs} proc${procs === 1 ? '' : 's'}`), host.why ? h('div', { class: 'jm-host-why' }, host.why) : null);
}
/** `ranks` (sorted) as grids along the dims `at` of the mesh, of `sizes`: the last two as rows x columns,
 * one grid per combination of the ones before; no dims: one row. */
function layout(out, mesh, at, sizes, ranks, opts) {
    const n = at.length;
    const cols = n ? sizes[n - 1] : Math.max(1, ranks.length);
    const rows = n >= 2 ? sizes[n - 2] : 1;
    const lead = Math.max(0, n - 2);
    for (let s = 0; s < ranks.length; s += rows * cols) {
        const chunk = ranks.slice(s, s + rows * cols);
        if (lead) {
            const label = at.slice(0, lead).map(i => `${mesh.dims[i]}=${chunk[0].coords[i]}`).join(',');
            out.append(h('div', { class: 'jm-slice-label' }, label));
        }
        const grid = h('div', { class: 'jm-grid' });
        grid.style.gridTemplateColumns = `repeat(${cols}, auto)`;
        for (const r of chunk) {
            const cell = h('div', {
                class: `jm-cell jm-${r.state}` + (opts.selected === r.rank ? ' jm-selected' : ''),
                title: `rank ${r.rank} [${coordLabel(mesh, r.coords)}] ${r.state}` +
                    (r.busy_since !== null ? ` since ${clock(r.busy_since)}` : '') +
                    (r.failure ? `: ${r.failure.detail}` : '') +
                    (r.note ? ` (${r.note})` : ''),
                'data-rank': String(r.rank),
                'data-state': r.state
            }, String(r.rank));
            if (r.inflight > 1) {
                cell.append(h('span', { class: 'jm-badge' }, String(r.inflight)));
            }
            cell.onclick = () => opts.select(opts.selected === r.rank ? null : r.rank);
            grid.append(cell);
        }
        out.append(grid);
    }
}
function detail(mesh, r, opts) {
    var _a, _b;
    const box = h('div', { class: 'jm-detail', 'data-testid': 'jm-detail', 'data-rank': String(r.rank) }, h('div', {}, h('b', {}, `rank ${r.rank} [${coordLabel(mesh, r.coords)}]`), ` ${r.state}` + (r.busy_since !== null ? ` since ${clock(r.busy_since)}` : '') + (r.pid ? ` · pid ${r.pid}` : '') +
        (r.inflight ? ` · ${r.inflight} call(s) in flight` : '')));
    if (r.note) {
        box.append(h('div', { class: 'jm-note' }, r.note));
    }
    if (r.failure) {
        box.append(h('div', { class: 'jm-cause' }, `${r.failure.kind}: ${r.failure.detail}`));
        if (r.failure.traceback) {
            // the newest lines are at the end: replaceKeepingScroll opens it there
            box.append(h('pre', { 'data-scroll': `${mesh.mesh_id}/${r.rank}` }, r.failure.traceback));
        }
    }
    const actions = (_b = (_a = opts.rankActions) === null || _a === void 0 ? void 0 : _a.call(opts, mesh, r)) !== null && _b !== void 0 ? _b : null;
    if (actions) {
        box.append(actions);
    }
    return box;
}
/**
 * Put `nodes` in `root` in place of what it held, keeping the scroll of each `pre[data-scroll]` (a failed
 * rank's output tail): one seen for the first time opens at its end, where the newest lines are; one the
 * user scrolled up stays where it was, and one left at its end follows new lines.
 */
export function replaceKeepingScroll(root, ...nodes) {
    var _a, _b, _c;
    const fromEnd = new Map();
    for (const pre of Array.from(root.querySelectorAll('pre[data-scroll]'))) {
        fromEnd.set((_a = pre.dataset.scroll) !== null && _a !== void 0 ? _a : '', pre.scrollHeight - pre.scrollTop - pre.clientHeight);
    }
    root.replaceChildren(...nodes);
    for (const pre of Array.from(root.querySelectorAll('pre[data-scroll]'))) {
        const back = (_c = fromEnd.get((_b = pre.dataset.scroll) !== null && _b !== void 0 ? _b : '')) !== null && _c !== void 0 ? _c : 0;
        pre.scrollTop = pre.scrollHeight - pre.clientHeight - (back > 2 ? back : 0);
    }
}
function render({ model, el }) {
    // the widget is the live view (a cell's %mesh status or ProcMesh output is a snapshot): it says so
    const live = h('div', { class: 'jm-widget-head' }, h('span', { class: 'jm-live', 'data-testid': 'jm-live', title: 'updates as the meshes change' }, 'live'));
    const body = h('div', {});
    const root = h('div', { class: 'jm-widget' }, live, body);
    el.append(root);
    const selected = new Map(); // mesh_id -> selected rank (this view's own)
    const draw = () => {
        var _a;
        const meshes = (_a = model.get('meshes')) !== null && _a !== void 0 ? _a : [];
        if (!meshes.length) {
            body.replaceChildren(h('div', { class: 'jm-empty' }, 'No proc mesh yet: spawn one (this_host().spawn_procs(...) or %mesh up).'));
            return;
        }
        replaceKeepingScroll(body, ...meshes.map(m => {
            var _a;
            return renderMesh(m, {
                selected: (_a = selected.get(m.mesh_id)) !== null && _a !== void 0 ? _a : null,
                select: rank => {
                    selected.set(m.mesh_id, rank);
                    draw();
                }
            });
        }));
    };
    model.on('change:meshes', draw);
    draw();
    return () => model.off('change:meshes', draw);
}
export default { render };
