// The sidebar's view: draws the model (each mesh with grid.ts, the renderer the notebook widget uses
// too, plus the sidebar's buttons) and turns clicks into model actions. Plain DOM, redrawn at most
// once per animation frame.

import { Widget } from '@lumino/widgets';

import { coordLabel, h, renderMesh, replaceKeepingScroll } from './grid';
import { MeshModel } from './model';
import { ActionName, IMesh, IRank } from './wire';

/** What the sidebar opens in the bottom panel. */
export interface IOpeners {
  openLogs: (mesh: IMesh, rank: number | null) => void;
  openPdb: (mesh: IMesh, rank: number) => void;
  openStacks: (mesh: IMesh) => void;
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
  constructor(model: MeshModel, open: IOpeners) {
    super();
    this._model = model;
    this._open = open;
    this.addClass('jm-sidebar');
    this.id = 'jupyter-mesh-sidebar';
    this.title.caption = 'Meshes of the notebook\'s kernel';
    model.changed.connect(this._schedule, this);
    this._draw();
  }

  /** A line under the meshes ("trainer on procs gpus=1 runs on"). */
  say(text: string): void {
    this._message = text;
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
    const root = h('div', { class: 'jm-sidebar-body' });
    const head = h('div', { class: 'jm-sidebar-head' }, h('b', {}, 'Meshes'));
    if (m.notebookName) {
      head.append(h('span', { class: 'jm-dim' }, ` · ${m.notebookName} · ${m.kernelDisplayName}`));
    }
    root.append(head);
    if (m.phase !== 'ready') {
      root.append(h('div', { class: 'jm-status', 'data-phase': m.phase }, PHASE_TEXT[m.phase](m)));
      if (m.phase === 'not-mesh') {
        const retry = h('button', { class: 'jm-button' }, 'Check again');
        retry.onclick = () => m.reconnect();
        root.append(retry);
      }
    } else if (m.meshes.length === 0) {
      root.append(
        h('div', { class: 'jm-status', 'data-phase': 'empty' },
          'No mesh in this kernel yet: bring one up with %mesh up or this_host().spawn_procs(...).')
      );
    } else {
      for (const mesh of m.meshes) {
        root.append(this._mesh(mesh));
      }
    }
    if (this._message) {
      root.append(h('div', { class: 'jm-message' }, this._message));
    }
    replaceKeepingScroll(this.node, root);
  }

  private _mesh(mesh: IMesh): HTMLElement {
    return renderMesh(mesh, {
      selected: this._selected.get(mesh.mesh_id) ?? null,
      select: rank => {
        this._selected.set(mesh.mesh_id, rank);
        this._draw();
      },
      actions: () => {
        const actions = h('div', { class: 'jm-actions' });
        actions.append(this._button('Respawn failed', mesh, 'respawn', null, mesh.counts.failed === 0));
        actions.append(this._button('Stop mesh', mesh, 'stop', null, false));
        const logs = h('button', { class: 'jm-button' }, 'Logs');
        logs.onclick = () => this._open.openLogs(mesh, null);
        actions.append(logs);
        const stacks = h('button', { class: 'jm-button', 'data-action': 'stacks', title: 'where every rank is now (%mesh stacks)' }, 'Stacks');
        stacks.onclick = () => this._open.openStacks(mesh);
        actions.append(stacks);
        const paused = this._paused(mesh);
        if (!paused) {
          return actions;
        }
        return h('div', {}, paused, actions);
      },
      rankActions: (_, r) => {
        const actions = h('div', { class: 'jm-actions' });
        actions.append(this._button('Stop proc', mesh, 'kill', r.rank, r.state === 'failed' || r.state === 'stopped'));
        actions.append(this._button('Respawn', mesh, 'respawn', r.rank, r.state !== 'failed'));
        const logs = h('button', { class: 'jm-button' }, 'Open logs');
        logs.onclick = () => this._open.openLogs(mesh, r.rank);
        actions.append(logs);
        if (r.state === 'paused') {
          actions.append(this._attachButton(mesh, r));
        }
        return actions;
      }
    });
  }

  /** The ranks paused in the debugger, each with where and an Attach button (null when none is). */
  private _paused(mesh: IMesh): HTMLElement | null {
    const paused = mesh.ranks.filter(r => r.state === 'paused');
    if (!paused.length) {
      return null;
    }
    const list = h('div', { class: 'jm-paused-list', 'data-paused': paused.map(r => r.rank).join(',') },
      h('div', { class: 'jm-dim' }, 'Paused in the debugger'));
    for (const r of paused) {
      list.append(h('div', { class: 'jm-paused-rank', 'data-rank': String(r.rank) },
        h('span', { class: 'jm-chip jm-paused' }, `rank ${r.rank}`),
        h('span', { class: 'jm-paused-where' }, ` [${coordLabel(mesh, r.coords)}] ${r.note || 'paused'} `),
        this._attachButton(mesh, r)));
    }
    return list;
  }

  private _attachButton(mesh: IMesh, r: IRank): HTMLElement {
    const b = h('button', { class: 'jm-button', 'data-action': 'attach', 'data-rank': String(r.rank),
      title: 'a console bound to this rank\'s pdb (continue lets it run on)' }, 'Attach');
    b.onclick = () => this._open.openPdb(mesh, r.rank);
    return b;
  }

  private _button(label: string, mesh: IMesh, action: ActionName, rank: number | null, disabled: boolean): HTMLElement {
    const b = h('button', { class: 'jm-button', 'data-action': action }, label);
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
  private _open: IOpeners;
  private _selected = new Map<string, number | null>(); // mesh_id -> selected rank
  private _message = '';
  private _frame = 0;
}
