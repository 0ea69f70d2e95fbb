/**
 * The Streams side panel: every cluster the Jupyter server can see, its TaskManagers and slots,
 * its jobs with their numbers and actions. Refreshes at most once a second, and only while shown.
 */
import { LabIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ICluster, IClusters, IJob, ITaskManager, TERMINAL_STATES, requestAPI } from './api';
import { JobAction, actionTitle, runJobAction } from './actions';
import { Refresher } from './refresher';
import { el, formatBytes, formatCount, formatDuration, formatTime, setData, setText, syncChildren } from './format';

export const PANEL_REFRESH_MS = 1000;

export type OpenJob = (cluster: ICluster, job: IJob) => void;

export class StreamsPanel extends Widget {
  constructor(
    private readonly openJob: OpenJob,
    icon: LabIcon
  ) {
    super();
    this.id = 'streamlab-streams';
    this.addClass('streamlab-panel');
    this.title.icon = icon;
    this.title.caption = 'Streams';
    const header = el('div', 'streamlab-panel-header');
    header.append(el('span', 'streamlab-panel-title', 'Streams'), this._refreshed);
    this._empty.textContent =
      'No streamlab cluster yet: run a %%stream cell in a notebook, or name standing clusters ' +
      'in the server setting StreamlabLab.cluster_dirs.';
    this._error.hidden = true;
    this._empty.hidden = true;
    this.node.append(header, this._error, this._empty, this._clusters);
  }

  /** Requests made for the cluster list (tests and the bench read it: none while hidden). */
  get refreshCount(): number {
    return this._count;
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._refresher.start();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible) {
      this._refresher.start();
    }
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._refresher.stop();
  }

  protected onBeforeDetach(msg: Message): void {
    this._refresher.stop();
    super.onBeforeDetach(msg);
  }

  dispose(): void {
    this._refresher.stop();
    super.dispose();
  }

  private async _refresh(): Promise<void> {
    let data: IClusters;
    this._count++;
    try {
      data = await requestAPI<IClusters>(['clusters']);
    } catch (error) {
      // The cluster list stays as last seen, marked stale, until the server answers again.
      this._error.hidden = false;
      setText(this._error, `Cannot list clusters: ${(error as Error).message}`);
      this.node.classList.add('streamlab-stale');
      return;
    }
    if (this.isDisposed) {
      return;
    }
    this._error.hidden = true;
    this.node.classList.remove('streamlab-stale');
    setText(this._refreshed, formatTime(data.refreshed));
    this._empty.hidden = data.clusters.length > 0;
    syncChildren(this._clusters, data.clusters, c => c.id, c => this._createCluster(c), (n, c) => this._updateCluster(n, c));
  }

  private _createCluster(cluster: ICluster): HTMLElement {
    const node = el('section', 'streamlab-cluster');
    const title = el('div', 'streamlab-cluster-title');
    title.append(
      el('span', 'streamlab-cluster-name'),
      el('span', 'streamlab-cluster-source'),
      el('span', 'streamlab-cluster-slots')
    );
    const error = el('div', 'streamlab-cluster-error');
    const tms = el('div', 'streamlab-taskmanagers');
    const jobs = el('div', 'streamlab-jobs');
    node.append(title, error, tms, jobs);
    return node;
  }

  private _updateCluster(node: HTMLElement, cluster: ICluster): void {
    setData(node, 'clusterId', cluster.id);
    setData(node, 'source', cluster.source);
    setData(node, 'slotsUsed', String(cluster.slots_used));
    setData(node, 'slotsTotal', String(cluster.slots_total));
    node.classList.toggle('streamlab-mod-error', !!cluster.error);
    const q = (cls: string) => node.querySelector(`.${cls}`) as HTMLElement;
    setText(q('streamlab-cluster-name'), cluster.name);
    q('streamlab-cluster-name').title = cluster.notebook_path
      ? `embedded cluster of ${cluster.notebook_path}`
      : `standing cluster ${cluster.name}`;
    setText(q('streamlab-cluster-source'), cluster.source === 'kernel' ? 'notebook' : 'standing');
    setText(q('streamlab-cluster-slots'), `slots ${cluster.slots_used}/${cluster.slots_total}`);
    const error = q('streamlab-cluster-error');
    error.hidden = !cluster.error;
    setText(error, cluster.error || '');

    const jobNames = new Map(cluster.jobs.map(j => [j.id, j.name]));
    syncChildren(
      q('streamlab-taskmanagers'),
      cluster.error ? [] : cluster.taskmanagers,
      tm => tm.id,
      () => this._createTaskManager(),
      (n, tm) => this._updateTaskManager(n, tm, jobNames)
    );
    const slotsPerJob = new Map<string, number>();
    for (const tm of cluster.taskmanagers) {
      for (const slot of tm.slots) {
        if (slot.job_id) {
          slotsPerJob.set(slot.job_id, (slotsPerJob.get(slot.job_id) || 0) + 1);
        }
      }
    }
    syncChildren(
      q('streamlab-jobs'),
      cluster.error ? [] : cluster.jobs,
      j => j.id,
      j => this._createJob(cluster.id, j),
      (n, j) => this._updateJob(n, cluster, j, slotsPerJob.get(j.id) || 0)
    );
  }

  private _createTaskManager(): HTMLElement {
    const node = el('div', 'streamlab-taskmanager');
    node.append(el('span', 'streamlab-taskmanager-id'), el('span', 'streamlab-taskmanager-slots'), el('span', 'streamlab-slots'));
    return node;
  }

  private _updateTaskManager(node: HTMLElement, tm: ITaskManager, jobNames: Map<string, string>): void {
    setData(node, 'tmId', tm.id);
    const [id, count, slots] = Array.from(node.children) as HTMLElement[];
    setText(id, tm.id);
    id.title = tm.id;
    setText(count, `${tm.slots_used}/${tm.slots_total}`);
    syncChildren(
      slots,
      tm.slots,
      s => String(s.index),
      () => el('span', 'streamlab-slot'),
      (n, s) => {
        setData(n, 'state', s.job_id ? 'busy' : 'free');
        setData(n, 'jobId', s.job_id || '');
        n.title = s.job_id ? `slot ${s.index}: ${s.job_name || jobNames.get(s.job_id) || s.job_id}` : `slot ${s.index}: free`;
      }
    );
  }

  private _createJob(clusterId: string, job: IJob): HTMLElement {
    const node = el('div', 'streamlab-job');
    const head = el('div', 'streamlab-job-head');
    const name = el('button', 'streamlab-job-name');
    name.title = 'Open the job: graph, checkpoints, exceptions';
    head.append(name, el('span', 'streamlab-job-state'));
    const stats = el('div', 'streamlab-job-stats');
    for (const [cls, label] of [
      ['duration', 'duration'],
      ['records-in', 'in'],
      ['records-out', 'out'],
      ['backpressure', 'back pressure'],
      ['slots', 'slots'],
      ['checkpoint', 'last checkpoint']
    ]) {
      const cell = el('span', 'streamlab-job-stat');
      cell.append(el('span', 'streamlab-job-label', label), el('span', `streamlab-job-${cls}`));
      stats.append(cell);
    }
    const actions = el('div', 'streamlab-job-actions');
    for (const action of ['cancel', 'savepoint', 'stop'] as JobAction[]) {
      const button = el('button', `jp-Button jp-mod-minimal jp-mod-styled streamlab-job-${action}`, actionTitle(action));
      button.addEventListener('click', () => void this._act(node, action, button));
      actions.append(button);
    }
    name.addEventListener('click', () => {
      const entry = this._jobs.get(node);
      if (entry) {
        this.openJob(entry.cluster, entry.job);
      }
    });
    node.append(head, stats, actions);
    return node;
  }

  private _updateJob(node: HTMLElement, cluster: ICluster, job: IJob, slots: number): void {
    this._jobs.set(node, { cluster, job });
    setData(node, 'jobId', job.id);
    setData(node, 'state', job.state);
    setData(node, 'recordsOut', String(job.records_out));
    setData(node, 'recordsIn', String(job.records_in));
    const q = (cls: string) => node.querySelector(`.streamlab-job-${cls}`) as HTMLElement;
    setText(q('name'), job.name);
    setText(q('state'), job.state);
    setData(q('state'), 'state', job.state);
    setText(q('duration'), formatDuration(job.duration_ms));
    setText(q('records-in'), formatCount(job.records_in));
    setText(q('records-out'), formatCount(job.records_out));
    setText(q('backpressure'), job.backpressure);
    setData(q('backpressure'), 'level', job.backpressure);
    setText(q('slots'), String(slots));
    const cp = job.last_checkpoint;
    setText(
      q('checkpoint'),
      cp ? `#${cp.id} ${cp.status} ${formatTime(cp.end_time)} (${formatDuration(cp.duration_ms)}, ${formatBytes(cp.size)})` : '-'
    );
    const ended = TERMINAL_STATES.has(job.state);
    for (const action of ['cancel', 'savepoint', 'stop']) {
      const button = q(action) as HTMLButtonElement;
      const disabled = ended || node.dataset.busy === '1';
      if (button.disabled !== disabled) {
        button.disabled = disabled;
      }
    }
  }

  private async _act(node: HTMLElement, action: JobAction, button: HTMLButtonElement): Promise<void> {
    const entry = this._jobs.get(node);
    if (!entry) {
      return;
    }
    node.dataset.busy = '1';
    node.querySelectorAll('.streamlab-job-actions button').forEach(b => ((b as HTMLButtonElement).disabled = true));
    button.classList.add('streamlab-mod-pending');
    try {
      await runJobAction(action, entry.cluster.id, entry.job.id, entry.job.name);
    } catch {
      // runJobAction showed the error
    } finally {
      delete node.dataset.busy;
      button.classList.remove('streamlab-mod-pending');
      const latest = this._jobs.get(node);
      const ended = latest ? TERMINAL_STATES.has(latest.job.state) : true;
      node.querySelectorAll('.streamlab-job-actions button').forEach(b => ((b as HTMLButtonElement).disabled = ended));
      this._refresher.poke();
    }
  }

  private readonly _refresher = new Refresher(() => this._refresh(), PANEL_REFRESH_MS);
  private readonly _refreshed = el('span', 'streamlab-refreshed');
  private readonly _error = el('div', 'streamlab-panel-error');
  private readonly _empty = el('div', 'streamlab-panel-empty');
  private readonly _clusters = el('div', 'streamlab-clusters');
  private readonly _jobs = new WeakMap<HTMLElement, { cluster: ICluster; job: IJob }>();
  private _count = 0;
}
