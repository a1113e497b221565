// The sidebar's debugger views, in the bottom panel: a console bound to one paused rank's pdb (Attach),
// and the folded stacks of a mesh (Stacks). Both talk to the kernel through the model's `debug`
// requests (the kernel's control channel), so they work while the cell waiting on the call runs.

import { Widget } from '@lumino/widgets';

import { MeshModel } from './model';
import { IDebugReply, IMesh } from './wire';

const CONTINUE = new Set(['c', 'cont', 'continue']);

/** One paused rank's pdb: its output, a line to type commands in; closes itself once the rank runs on. */
export class PdbPanel extends Widget {
  constructor(model: MeshModel, mesh: IMesh, rank: number, onEnd: (text: string) => void) {
    super();
    this._model = model;
    this._meshId = mesh.mesh_id;
    this._rank = rank;
    this._onEnd = onEnd;
    this.addClass('jm-pdb');
    this.id = PdbPanel.idFor(mesh, rank);
    this.title.label = `pdb · ${mesh.name} rank ${rank}`;
    this.title.closable = true;
    this._head.className = 'jm-pdb-head';
    this._head.textContent = `attaching to rank ${rank} of ${mesh.name}…`;
    this._out.className = 'jm-pdb-out';
    const row = document.createElement('div');
    row.className = 'jm-pdb-input';
    const prompt = document.createElement('span');
    prompt.textContent = '(Pdb) ';
    this._input.type = 'text';
    this._input.spellcheck = false;
    this._input.placeholder = 'p x, n, s, w, l … continue (c) lets the rank run on';
    this._input.onkeydown = (e: KeyboardEvent) => {
      if (e.key === 'Enter') {
        e.preventDefault();
        const line = this._input.value;
        if (line.trim() && this._history[this._history.length - 1] !== line) {
          this._history.push(line);
        }
        this._back = this._history.length;
        void this.send(line);
      } else if (e.key === 'ArrowUp' || e.key === 'ArrowDown') {
        // the commands typed before, as in a terminal's pdb
        e.preventDefault();
        this._back = Math.max(0, Math.min(this._history.length, this._back + (e.key === 'ArrowUp' ? -1 : 1)));
        this._input.value = this._history[this._back] ?? '';
      }
    };
    const cont = document.createElement('button');
    cont.className = 'jm-button';
    cont.dataset.action = 'continue';
    cont.textContent = 'Continue';
    cont.onclick = () => void this.send('continue');
    row.append(prompt, this._input, cont);
    this.node.append(this._head, this._out, row);
    void this._attach();
  }

  static idFor(mesh: IMesh, rank: number): string {
    return `jupyter-mesh-pdb-${mesh.mesh_id}-${rank}`;
  }

  /** Run one pdb command on the rank; `continue` lets it run on and closes the panel. */
  async send(line: string): Promise<void> {
    if (this._busy || this._ended) {
      return;
    }
    this._busy = true;
    this._input.value = '';
    this._input.disabled = true;
    this._print(`(Pdb) ${line}\n`, 'jm-pdb-cmd');
    let res = await this._model.debug({ op: 'send', mesh_id: this._meshId, rank: this._rank, actor: this._actor, line });
    while (res.status === 'ok' && res.running && !this.isDisposed) {
      res = await this._model.debug({ op: 'take', mesh_id: this._meshId, rank: this._rank, actor: this._actor });
    }
    this._busy = false;
    this._show(res, CONTINUE.has(line.trim()));
  }

  focusInput(): void {
    this._input.focus();
  }

  private async _attach(): Promise<void> {
    const res = await this._model.debug({ op: 'attach', mesh_id: this._meshId, rank: this._rank });
    if (res.status === 'ok') {
      this._actor = res.actor ?? '';
      this._head.textContent = `${res.actor} on ${res.mesh} ${res.label} · paused at ${res.where}`;
      this._head.dataset.where = res.where ?? '';
    }
    this._show(res, false);
    this.focusInput();
  }

  private _show(res: IDebugReply, continued: boolean): void {
    if (this.isDisposed) {
      return;
    }
    if (res.status !== 'ok') {
      this._print(`${res.error}\n`, 'jm-pdb-error');
      this._input.disabled = false;
      return;
    }
    if (res.out) {
      this._print(res.out.endsWith('\n') ? res.out : `${res.out}\n`, '');
    }
    this._input.disabled = false;
    if (res.ended) {
      this._ended = true;
      const text = `${res.actor ?? 'the actor'} on ${res.mesh ?? ''} ${res.label ?? ''} runs on` + (continued ? '' : ' (it left pdb)');
      this._onEnd(text);
      this.dispose(); // the console of a rank that runs on has nothing more to say
    } else {
      this._input.focus();
    }
  }

  private _print(text: string, cls: string): void {
    const span = document.createElement('span');
    if (cls) {
      span.className = cls;
    }
    span.textContent = text;
    this._out.append(span);
    this._out.scrollTop = this._out.scrollHeight;
  }

  private _model: MeshModel;
  private _meshId: string;
  private _rank: number;
  private _actor = '';
  private _onEnd: (text: string) => void;
  private _history: string[] = [];
  private _back = 0; // where ArrowUp/ArrowDown are in the history
  private _busy = false;
  private _ended = false;
  private _head = document.createElement('div');
  private _out = document.createElement('pre');
  private _input = document.createElement('input');
}

/** `%mesh stacks` of a mesh: every rank's threads, identical stacks folded; Refresh asks again. */
export class StacksView extends Widget {
  constructor(model: MeshModel, mesh: IMesh) {
    super();
    this._model = model;
    this._meshId = mesh.mesh_id;
    this.addClass('jm-logs');
    this.addClass('jm-stacks');
    this.id = `jupyter-mesh-stacks-${mesh.mesh_id}`;
    this.title.label = `${mesh.name} stacks`;
    this.title.closable = true;
    const bar = document.createElement('div');
    const refresh = document.createElement('button');
    refresh.className = 'jm-button';
    refresh.dataset.action = 'refresh-stacks';
    refresh.textContent = 'Refresh';
    refresh.onclick = () => void this.refresh();
    bar.append(refresh);
    this.node.append(bar, this._pre);
    void this.refresh();
  }

  async refresh(): Promise<void> {
    this._pre.dataset.state = 'loading';
    const res = await this._model.debug({ op: 'stacks', mesh_id: this._meshId });
    this._pre.textContent = res.status === 'ok' ? res.out : res.error;
    this._pre.dataset.state = res.status;
  }

  private _model: MeshModel;
  private _meshId: string;
  private _pre = document.createElement('pre');
}
