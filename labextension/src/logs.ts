// A rank's (or a mesh's) output in the bottom panel, fetched through the model's `logs` action.

import { Widget } from '@lumino/widgets';

import { MeshModel } from './model';
import { IMesh } from './wire';

export class LogView extends Widget {
  constructor(model: MeshModel, mesh: IMesh, rank: number | null) {
    super();
    this._model = model;
    this._meshId = mesh.mesh_id;
    this._rank = rank;
    this.addClass('jm-logs');
    this.id = `jupyter-mesh-logs-${mesh.mesh_id}-${rank ?? 'all'}`;
    this.title.label = `${mesh.name} ${rank === null ? 'logs' : `rank ${rank} logs`}`;
    this.title.closable = true;
    const bar = document.createElement('div');
    const refresh = document.createElement('button');
    refresh.className = 'jm-button';
    refresh.textContent = 'Refresh';
    refresh.onclick = () => void this.refresh();
    bar.append(refresh);
    this.node.append(bar, this._pre);
    void this.refresh();
  }

  async refresh(): Promise<void> {
    const res = await this._model.act('logs', this._meshId, this._rank);
    this._pre.textContent = res.ok ? res.lines.join('\n') || '(no output yet)' : res.error;
    this.node.scrollTop = this.node.scrollHeight; // the newest lines are at the end
  }

  private _model: MeshModel;
  private _meshId: string;
  private _rank: number | null;
  private _pre = document.createElement('pre');
}
