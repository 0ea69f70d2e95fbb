/**
 * The server extension's API (streamlab/api/..., see labext-api contract): types and one
 * request helper. ServerConnection adds the token and the XSRF header, so the page never holds
 * a cluster address or secret of its own.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export type Backpressure = 'ok' | 'low' | 'high';

export interface ICheckpointSummary {
  id: number;
  status: string;
  end_time: number;
  duration_ms: number;
  size: number;
}

export interface IJob {
  id: string;
  name: string;
  state: string;
  start_time: number;
  duration_ms: number;
  records_in: number;
  records_out: number;
  backpressure: Backpressure;
  last_checkpoint: ICheckpointSummary | null;
}

export interface ISlot {
  index: number;
  job_id: string | null;
  job_name: string | null;
}

export interface ITaskManager {
  id: string;
  slots_total: number;
  slots_used: number;
  slots: ISlot[];
}

export interface ICluster {
  id: string;
  name: string;
  source: 'kernel' | 'setting';
  kernel_id: string | null;
  notebook_path: string | null;
  error: string | null;
  slots_total: number;
  slots_used: number;
  taskmanagers: ITaskManager[];
  jobs: IJob[];
}

export interface IClusters {
  clusters: ICluster[];
  refreshed: number;
}

export interface IVertex {
  id: string;
  name: string;
  parallelism: number;
  status: string;
  backpressure: Backpressure;
  /** the highest busy and back-pressured shares of time of its subtasks, 0..1 */
  busy: number;
  backpressured: number;
  /** its fill while it runs, as Flink's job graph colours it (busy red, back-pressured dark, idle blue) */
  color: string | null;
  ink: string | null;
  records_in: number;
  records_out: number;
}

export interface IEdge {
  source: string;
  target: string;
  ship_strategy: string;
}

export interface ICheckpoint {
  id: number;
  status: string;
  trigger_time: number;
  end_time: number;
  duration_ms: number;
  size: number;
  is_savepoint: boolean;
}

export interface IJobException {
  time: number;
  exception: string;
  task: string | null;
}

export interface IJobDetail {
  job: IJob;
  vertices: IVertex[];
  edges: IEdge[];
  checkpoints: ICheckpoint[];
  exceptions: IJobException[];
  /** the operators that keep keyed state, which the view offers to show */
  keyed_operators: string[];
  /** execution.checkpointing.interval; 0: checkpointing is off */
  checkpoint_interval_ms: number;
  diagnosis: IDiagnosis;
}

/** What the JobManager answers of a job: its bottleneck in words, its end-to-end latency, why
 * its windows wait, its late rows. */
export interface IDiagnosis {
  bottleneck: string | null;
  latency: {
    p50: number | null;
    p90: number | null;
    p99: number | null;
    rows: number;
    'event-time-lag': { p50: number; p90: number; p99: number } | null;
  } | null;
  window_waits: string[];
  late_rows: { operator: string; count: number; dropped: number }[];
}

/** GET .../jobs/<jid>/state: an operator's keyed state at a checkpoint, a page of its keys. */
export interface IKeyedState {
  checkpoint_id: number;
  operator: string;
  key_columns: string[];
  columns: string[];
  rows: unknown[][];
  rows_total: number;
}

/** The job a %%stream cell's output names (its JobHandle's mimebundle). */
export const JOB_MIME = 'application/vnd.streamlab.job+json';

export interface ICellJob {
  job_id: string;
  name: string;
  cluster_id: string;
}

/** Flink's terminal job states: nothing to refresh or act on after them. */
export const TERMINAL_STATES = new Set(['FINISHED', 'CANCELED', 'FAILED', 'SUSPENDED']);

/** An error answer of the API, with the server's message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

/** A request to streamlab/api/<path segments>[?query]; each segment is URL-encoded. */
export async function requestAPI<T>(
  segments: string[],
  init: RequestInit = {},
  query: Record<string, string> = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const search = new URLSearchParams(query).toString();
  const url =
    URLExt.join(settings.baseUrl, 'streamlab', 'api', ...segments.map(encodeURIComponent)) + (search ? `?${search}` : '');
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: any = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { message: text };
    }
  }
  if (!response.ok) {
    const message = (data && data.message) || response.statusText;
    throw new ApiError(response.status, `streamlab/api/${segments.join('/')}: ${message}`);
  }
  return data as T;
}

export function postAPI<T>(segments: string[], body: unknown = {}): Promise<T> {
  return requestAPI<T>(segments, { method: 'POST', body: JSON.stringify(body) });
}

export function jobPath(clusterId: string, jobId: string, ...rest: string[]): string[] {
  return ['clusters', clusterId, 'jobs', jobId, ...rest];
}
