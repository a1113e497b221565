// The messages of the `jupyter_mesh.sidebar` comm: twins of jupyter_mesh/ui/wire.py (keep in step).

export const COMM_TARGET = 'jupyter_mesh.sidebar';

import type { HostState, ProcState } from './states';

export type { HostState, ProcState };

export interface IFailure {
  kind: string;
  detail: string;
  traceback: string;
  exit_code: number | null;
  signal: number | null;
}

export interface IRank {
  rank: number;
  coords: number[];
  state: ProcState;
  inflight: number;
  pid: number | null;
  failure: IFailure | null;
  note: string; // why it is slow to answer: "initializing 'trainer' (42 s)", "busy in native code"; or ""
  busy_since: number | null; // since when it is busy (epoch seconds), null unless busy
  host?: number; // index into IMesh.hosts (absent in snapshots from kernels before hosts were sent)
}

export interface IHost {
  index: number;
  address: string; // the agent's IP, or "local" (this machine, private sockets)
  state: HostState;
  why: string; // why it is not up ("" while up)
}

/** What placed the hosts (Job.describe()). */
export interface IJob {
  kind: string; // local, slurm, attach, ...
  id: string | null; // the scheduler's id (SLURM job id)
  keep_alive: boolean; // the job outlives this kernel
}

export interface IRecentFailure {
  rank: number;
  label: string;
  kind: string;
  detail: string;
  time: number;
}

export interface IProgress {
  done: number;
  total: number;
}

/** The calls out on a mesh: ranks done / ranks busy since none was, and (the first of) those left. */
export interface ICalls extends IProgress {
  left: number[];
  since: number; // when the first of them got busy (epoch seconds)
  waits?: IWait[] | null; // past slow_call_after: where the ranks left are (absent from older kernels)
}

/** A rank a long call still waits on, and where it is (jupyter_mesh/ui/slow_calls.py). */
export interface IWait {
  rank: number;
  label: string; // "gpus=2"
  where: string; // "train.py:42 in step: time.sleep(100)", "paused at <cell>:5", or why it is unknown
}

export interface IMesh {
  mesh_id: string;
  name: string;
  dims: string[];
  sizes: number[];
  ranks: IRank[];
  stopped: boolean;
  counts: Record<ProcState, number>; // every state, in ProcState order (the order chips are drawn in)
  inflight: number;
  spawn: IProgress;
  gather: ICalls | null; // while calls are out (live: ranks report as they finish), else null
  failures: IRecentFailure[];
  hosts?: IHost[]; // where the ranks run; absent from older kernels, [] when unknown
  job?: IJob | null;
}

export interface ISnapshotMessage {
  type: 'snapshot';
  kernel: string;
  meshes: IMesh[];
}

export interface IUpdateMessage {
  type: 'update';
  meshes: IMesh[];
  removed: string[];
}

export interface IActionResult {
  type: 'result';
  id: string;
  ok: boolean;
  error: string;
  lines: string[];
}

export type KernelMessage = ISnapshotMessage | IUpdateMessage | IActionResult;

export type ActionName = 'kill' | 'respawn' | 'stop' | 'logs';

export interface IActionRequest {
  type: 'action';
  id: string;
  action: ActionName;
  mesh_id: string;
  rank: number | null;
}

export interface IRefreshRequest {
  type: 'refresh';
}

export type FrontMessage = IActionRequest | IRefreshRequest;

// -- the sidebar's debugger requests, on the kernel's control channel (jupyter_mesh/ui/debug_channel.py)

export const DEBUG_REQUEST = 'jupyter_mesh_debug_request';
export const DEBUG_REPLY = 'jupyter_mesh_debug_reply';

export interface IDebugRequest {
  op: 'attach' | 'send' | 'take' | 'stacks';
  mesh_id: string;
  rank?: number;
  actor?: string;
  line?: string;
}

export interface IDebugReply {
  status: 'ok' | 'error';
  error: string;
  out: string; // what pdb printed (up to its prompt), or the folded stacks
  ended: boolean; // the actor runs on (continue), or its proc died
  running: boolean; // a command still runs (a slow `n`): ask again with `take`
  where?: string; // "file:line" it is paused at
  actor?: string;
  label?: string; // "gpus=3"
  mesh?: string;
}
