// What the sidebar shows, for the notebook in focus: its kernel's meshes, live, and what it can do
// with them. The view reads this model and calls its methods; it never touches a kernel itself.

import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { KernelChannel } from './channel';
import { ActionName, DEBUG_REPLY, DEBUG_REQUEST, IActionResult, IDebugReply, IDebugRequest, IMesh, KernelMessage as MeshMessage } from './wire';

/** Where the sidebar stands with the notebook in focus. */
export type Phase =
  | 'no-notebook' // nothing to follow
  | 'no-kernel' // the notebook has no running kernel
  | 'connecting' // asked the kernel, no answer yet (it answers when its running cell ends)
  | 'not-mesh' // the kernel has no jupyter_mesh sidebar target
  | 'ready'; // meshes below (possibly none)

const ACTION_TIMEOUT_MS = 120_000;
const DEBUG_TIMEOUT_MS = 30_000; // the kernel bounds each request to a few seconds

interface IPending {
  resolve: (r: IActionResult) => void;
  timer: number;
}

export class MeshModel {
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get phase(): Phase {
    return this._phase;
  }

  /** The notebook's kernel, as the user knows it ("Python 3 (mesh)"). */
  get kernelDisplayName(): string {
    return this._session?.kernelDisplayName ?? '';
  }

  /** "mesh" for the mesh kernel, "python" for a kernel with %load_ext jupyter_mesh.ui. */
  get kernelKind(): string {
    return this._kernelKind;
  }

  get notebookName(): string {
    return this._notebookName;
  }

  get meshes(): IMesh[] {
    return [...this._meshes.values()];
  }

  /** Follow the notebook now in focus (null: none). */
  follow(session: ISessionContext | null, notebookName: string): void {
    if (session === this._session) {
      return;
    }
    if (this._session) {
      this._session.kernelChanged.disconnect(this._onKernelChanged, this);
      this._session.statusChanged.disconnect(this._onStatus, this);
    }
    this._session = session;
    this._notebookName = notebookName;
    if (session) {
      session.kernelChanged.connect(this._onKernelChanged, this);
      session.statusChanged.connect(this._onStatus, this);
    }
    this._connect(session?.session?.kernel ?? null);
  }

  /** Run an action in the kernel (through the same public API as the magics). */
  act(action: ActionName, meshId: string, rank: number | null): Promise<IActionResult> {
    const id = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
    const failed = (error: string): IActionResult => ({ type: 'result', id, ok: false, error, lines: [] });
    if (!this._channel || !this._channel.send({ type: 'action', id, action, mesh_id: meshId, rank })) {
      return Promise.resolve(failed('not connected to a mesh kernel'));
    }
    return new Promise<IActionResult>(resolve => {
      const timer = window.setTimeout(() => {
        this._pending.delete(id);
        resolve(failed('no answer from the kernel (is a cell still running?)'));
      }, ACTION_TIMEOUT_MS);
      this._pending.set(id, { resolve, timer });
    });
  }

  /**
   * A debugger request (a paused rank's pdb, a mesh's stacks) on the kernel's control channel: the
   * kernel answers it while a cell runs (comms wait for the cell), over the path JupyterLab already
   * has to the kernel (the server's authenticated websocket; the kernel's signed sockets).
   */
  debug(req: IDebugRequest): Promise<IDebugReply> {
    const kernel = this._session?.session?.kernel ?? null;
    const failed = (error: string): IDebugReply => ({ status: 'error', error, out: '', ended: false, running: false });
    if (!kernel || this._phase !== 'ready') {
      return Promise.resolve(failed('not connected to a mesh kernel'));
    }
    const msg = KernelMessage.createMessage<any>({
      msgType: DEBUG_REQUEST,
      channel: 'control',
      session: kernel.clientId,
      content: req
    });
    return new Promise<IDebugReply>(resolve => {
      const timer = window.setTimeout(() => resolve(failed('no answer from the kernel')), DEBUG_TIMEOUT_MS);
      const future = kernel.sendControlMessage(msg, true, true);
      future.onReply = (reply: KernelMessage.IMessage) => {
        if ((reply.header.msg_type as string) === DEBUG_REPLY) {
          window.clearTimeout(timer);
          resolve(reply.content as unknown as IDebugReply);
        }
      };
      future.done.catch(() => {
        window.clearTimeout(timer);
        resolve(failed('the kernel went away'));
      });
    });
  }

  /** Ask again: after %load_ext in a plain kernel, or to resynchronise. */
  reconnect(): void {
    this._connect(this._session?.session?.kernel ?? null);
  }

  dispose(): void {
    this.follow(null, '');
    Signal.clearData(this);
  }

  private _onKernelChanged(): void {
    this._connect(this._session?.session?.kernel ?? null);
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._connect(null, status === 'dead' ? 'no-kernel' : 'connecting');
    } else if (status === 'idle' && this._phase === 'connecting' && !this._channel) {
      this._connect(this._session?.session?.kernel ?? null); // back from a restart
    }
  }

  private _connect(kernel: Kernel.IKernelConnection | null, phase?: Phase): void {
    this._channel?.dispose();
    this._channel = null;
    this._meshes.clear();
    this._kernelKind = '';
    for (const [, p] of this._pending) {
      window.clearTimeout(p.timer);
      p.resolve({ type: 'result', id: '', ok: false, error: 'the kernel changed', lines: [] });
    }
    this._pending.clear();
    if (!kernel) {
      this._setPhase(phase ?? (this._session ? 'no-kernel' : 'no-notebook'));
      return;
    }
    const channel = (this._channel = new KernelChannel(kernel));
    channel.message.connect((_, msg) => this._onMessage(msg));
    channel.ended.connect((_, why) => {
      if (why === 'closed-by-kernel' && this._channel === channel) {
        // no target (a plain kernel), or the kernel went away: wait for its announce
        this._meshes.clear();
        this._setPhase('not-mesh');
      }
    });
    this._setPhase('connecting');
    channel.open();
  }

  private _onMessage(msg: MeshMessage): void {
    switch (msg.type) {
      case 'snapshot':
        this._kernelKind = msg.kernel;
        this._meshes = new Map(msg.meshes.map(m => [m.mesh_id, m]));
        this._phase = 'ready';
        break;
      case 'update':
        for (const m of msg.meshes) {
          this._meshes.set(m.mesh_id, m);
        }
        for (const id of msg.removed) {
          this._meshes.delete(id);
        }
        break;
      case 'result': {
        const p = this._pending.get(msg.id);
        if (p) {
          window.clearTimeout(p.timer);
          this._pending.delete(msg.id);
          p.resolve(msg);
        }
        return;
      }
    }
    this._changed.emit();
  }

  private _setPhase(phase: Phase): void {
    this._phase = phase;
    this._changed.emit();
  }

  private _session: ISessionContext | null = null;
  private _notebookName = '';
  private _channel: KernelChannel | null = null;
  private _phase: Phase = 'no-notebook';
  private _kernelKind = '';
  private _meshes = new Map<string, IMesh>();
  private _pending = new Map<string, IPending>();
  private _changed = new Signal<this, void>(this);
}
