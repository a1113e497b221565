// The sidebar's view: draws the model (grids coloured by state, counts, progress, failures) and turns
// clicks into model actions. Plain DOM, redrawn at most once per animation frame.

import { Widget } from '@lumino/widgets';

import { MeshModel } from './model';
import { ActionName, coordLabel, IMesh, IRank, ProcState, shapeLabel } from './wire';

type OpenLogs = (mesh: IMesh, rank: number | null) => void;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: (Node | string | null)[]
): HTMLElementTagNameMap[K] {
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

const PHASE_TEXT: Record<string, (m: MeshModel) => string> = {
  'no-notebook': () => 'Open a notebook to see the meshes of its kernel.',
  'no-kernel': () => 'This notebook has no running kernel.',
  connecting: () => 'Asking the kernel for its meshes… (a busy kernel answers when its cell ends)',
  'not-mesh': m =>
    `The kernel "${m.kernelDisplayName}" is not a mesh kernel. Switch to "Python 3 (mesh)", ` +
    'or run %load_ext jupyter_mesh.ui in it.'
};

export class MeshSidebar extends Widget {
  constructor(model: MeshModel, openLogs: OpenLogs) {
    super();
    this._model = model;
    this._openLogs = openLogs;
    this.addClass('jm-sidebar');
    this.id = 'jupyter-mesh-sidebar';
    this.title.caption = 'Meshes of the notebook\'s kernel';
    model.changed.connect(this._schedule, this);
    this._draw();
  }

  dispose(): void {
    this._model.changed.disconnect(this._schedule, this);
    super.dispose();
  }

  private _schedule(): void {
    if (this._frame === 0) {
      this._frame = requestAnimationFrame(() => {
        this._frame = 0;
        this._draw();
      });
    }
  }

  private _draw(): void {
    const m = this._model;
    const root = el('div', { class: 'jm-sidebar-body' });
    const head = el('div', { class: 'jm-sidebar-head' }, el('b', {}, 'Meshes'));
    if (m.notebookName) {
      head.append(el('span', { class: 'jm-dim' }, ` · ${m.notebookName} · ${m.kernelDisplayName}`));
    }
    root.append(head);
    if (m.phase !== 'ready') {
      root.append(el('div', { class: 'jm-status', 'data-phase': m.phase }, PHASE_TEXT[m.phase](m)));
      if (m.phase === 'not-mesh') {
        const retry = el('button', { class: 'jm-button' }, 'Check again');
        retry.onclick = () => m.reconnect();
        root.append(retry);
      }
    } else if (m.meshes.length === 0) {
      root.append(
        el('div', { class: 'jm-status', 'data-phase': 'empty' },
          'No mesh in this kernel yet: bring one up with %mesh up or this_host().spawn_procs(...).')
      );
    } else {
      for (const mesh of m.meshes) {
        root.append(this._mesh(mesh));
      }
    }
    if (this._message) {
      root.append(el('div', { class: 'jm-message' }, this._message));
    }
    this.node.replaceChildren(root);
  }

  private _mesh(mesh: IMesh): HTMLElement {
    const box = el('section', {
      class: 'jm-mesh', 'data-mesh': mesh.name, 'data-procs': String(mesh.ranks.length)
    });
    box.append(el('div', { class: 'jm-mesh-head' }, el('b', {}, mesh.name), ` ${shapeLabel(mesh)}`,
      el('span', { class: 'jm-dim' }, ` · ${mesh.ranks.length} procs`)));
    const chips = el('div', { class: 'jm-chips' });
    for (const s of Object.keys(mesh.counts) as ProcState[]) {
      if (mesh.counts[s]) {
        chips.append(el('span', { class: `jm-chip jm-${s}`, 'data-count': s }, `${mesh.counts[s]} ${s}`));
      }
    }
    chips.append(el('span', { class: 'jm-dim' }, `${mesh.inflight} call(s) in flight`));
    box.append(chips);
    if (mesh.spawn.done < mesh.spawn.total) {
      box.append(this._progress('spawn', mesh.spawn.done, mesh.spawn.total));
    }
    if (mesh.gather && mesh.gather.total > 1) {
      box.append(this._progress('replies', mesh.gather.done, mesh.gather.total));
    }
    box.append(this._grids(mesh));
    const actions = el('div', { class: 'jm-actions' });
    actions.append(this._button('Respawn failed', mesh, 'respawn', null, mesh.counts.failed === 0));
    actions.append(this._button('Stop mesh', mesh, 'stop', null, false));
    const logs = el('button', { class: 'jm-button' }, 'Logs');
    logs.onclick = () => this._openLogs(mesh, null);
    actions.append(logs);
    box.append(actions);
    const selected = mesh.ranks.find(r => r.rank === this._selected.get(mesh.mesh_id));
    if (selected) {
      box.append(this._detail(mesh, selected));
    }
    if (mesh.failures.length) {
      const list = el('ul', { class: 'jm-failures' });
      for (const f of [...mesh.failures].reverse()) {
        list.append(el('li', {}, `[${f.label}] ${f.kind}: ${f.detail}`));
      }
      box.append(el('div', { class: 'jm-dim' }, 'Recent failures'), list);
    }
    return box;
  }

  private _grids(mesh: IMesh): HTMLElement {
    const out = el('div', { class: 'jm-grids' });
    const n = mesh.dims.length;
    const cols = n ? mesh.sizes[n - 1] : 1;
    const rows = n >= 2 ? mesh.sizes[n - 2] : 1;
    const lead = Math.max(0, n - 2);
    const ranks = [...mesh.ranks].sort((a, b) => a.rank - b.rank);
    for (let s = 0; s < ranks.length; s += rows * cols) {
      const chunk = ranks.slice(s, s + rows * cols);
      if (lead) {
        out.append(el('div', { class: 'jm-dim' }, coordLabel(mesh, chunk[0].coords, lead)));
      }
      const grid = el('div', { class: 'jm-grid' });
      grid.style.gridTemplateColumns = `repeat(${cols}, auto)`;
      for (const r of chunk) {
        const cell = el('div', {
          class: `jm-cell jm-${r.state}` + (this._selected.get(mesh.mesh_id) === r.rank ? ' jm-selected' : ''),
          title:
            `rank ${r.rank} [${coordLabel(mesh, r.coords)}] ${r.state}` +
            (r.failure ? `: ${r.failure.detail}` : '') +
            (r.note ? ` (${r.note})` : ''),
          'data-rank': String(r.rank),
          'data-state': r.state
        }, String(r.rank));
        cell.onclick = () => {
          const same = this._selected.get(mesh.mesh_id) === r.rank;
          this._selected.set(mesh.mesh_id, same ? -1 : r.rank);
          this._draw();
        };
        grid.append(cell);
      }
      out.append(grid);
    }
    return out;
  }

  private _detail(mesh: IMesh, r: IRank): HTMLElement {
    const box = el('div', { class: 'jm-detail', 'data-rank': String(r.rank) },
      el('div', {}, el('b', {}, `rank ${r.rank} [${coordLabel(mesh, r.coords)}]`),
        ` ${r.state}` + (r.pid ? ` · pid ${r.pid}` : '') + (r.inflight ? ` · ${r.inflight} call(s)` : '')));
    if (r.note) {
      box.append(el('div', { class: 'jm-note' }, r.note));
    }
    if (r.failure) {
      box.append(el('div', { class: 'jm-cause' }, `${r.failure.kind}: ${r.failure.detail}`));
      if (r.failure.traceback) {
        box.append(el('pre', {}, r.failure.traceback));
      }
    }
    const actions = el('div', { class: 'jm-actions' });
    actions.append(this._button('Stop proc', mesh, 'kill', r.rank, r.state === 'failed' || r.state === 'stopped'));
    actions.append(this._button('Respawn', mesh, 'respawn', r.rank, r.state !== 'failed'));
    const logs = el('button', { class: 'jm-button' }, 'Open logs');
    logs.onclick = () => this._openLogs(mesh, r.rank);
    actions.append(logs);
    box.append(actions);
    return box;
  }

  private _progress(label: string, done: number, total: number): HTMLElement {
    const bar = el('progress', { max: String(total), value: String(done) });
    return el('div', { class: 'jm-progress', 'data-progress': label }, `${label} `, bar, ` ${done} / ${total}`);
  }

  private _button(label: string, mesh: IMesh, action: ActionName, rank: number | null, disabled: boolean): HTMLElement {
    const b = el('button', { class: 'jm-button', 'data-action': action }, label);
    b.disabled = disabled;
    b.onclick = async () => {
      b.disabled = true;
      this._message = `${label}: working…`;
      this._draw();
      const res = await this._model.act(action, mesh.mesh_id, rank);
      this._message = res.ok ? `${label}: done${res.lines.length ? ` (${res.lines.join(', ')})` : ''}` : `${label}: ${res.error}`;
      this._draw();
    };
    return b;
  }

  private _model: MeshModel;
  private _openLogs: OpenLogs;
  private _selected = new Map<string, number>();
  private _message = '';
  private _frame = 0;
}
