// One comm with one kernel: opened by us, or by the kernel (`%load_ext jupyter_mesh.ui`), never both
// at once. Knows nothing of the UI: it reports messages and its own end.

import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { COMM_TARGET, FrontMessage, KernelMessage as MeshMessage } from './wire';

export type ChannelEnd = 'closed-by-kernel' | 'disposed';

export class KernelChannel {
  constructor(kernel: Kernel.IKernelConnection) {
    this._kernel = kernel;
    kernel.registerCommTarget(COMM_TARGET, this._onKernelOpen);
  }

  get message(): ISignal<this, MeshMessage> {
    return this._message;
  }

  /** The comm went away; `closed-by-kernel` before any snapshot means: no such target there. */
  get ended(): ISignal<this, ChannelEnd> {
    return this._ended;
  }

  get isOpen(): boolean {
    return this._comm !== null;
  }

  open(): void {
    if (this._comm || this._disposed) {
      return;
    }
    const comm = this._kernel.createComm(COMM_TARGET);
    this._attach(comm);
    comm.open({});
  }

  send(msg: FrontMessage): boolean {
    if (!this._comm) {
      return false;
    }
    this._comm.send(msg as any);
    return true;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._kernel.removeCommTarget(COMM_TARGET, this._onKernelOpen);
    const comm = this._comm;
    this._comm = null;
    if (comm && !comm.isDisposed) {
      try {
        comm.close();
      } catch {
        // the kernel is gone already: nothing to tell it
      }
    }
    this._ended.emit('disposed');
    Signal.clearData(this);
  }

  private _onKernelOpen = (comm: Kernel.IComm): void => {
    if (this._disposed) {
      comm.close();
      return;
    }
    if (this._comm && !this._comm.isDisposed) {
      this._comm.onClose = () => undefined;
      this._comm.close();
    }
    this._attach(comm);
  };

  private _attach(comm: Kernel.IComm): void {
    this._comm = comm;
    comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => {
      this._message.emit(msg.content.data as unknown as MeshMessage);
    };
    comm.onClose = () => {
      if (this._comm === comm) {
        this._comm = null;
        this._ended.emit('closed-by-kernel');
      }
    };
  }

  private _kernel: Kernel.IKernelConnection;
  private _comm: Kernel.IComm | null = null;
  private _disposed = false;
  private _message = new Signal<this, MeshMessage>(this);
  private _ended = new Signal<this, ChannelEnd>(this);
}
