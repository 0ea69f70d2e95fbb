/**
 * A job's detail view in the main area: its graph (vertices in columns by their distance from the
 * sources, as Flink's web UI draws it left to right, each with its back pressure, and the edges
 * between them with their ship strategies), its checkpoint history, an operator's keyed state on demand, and its
 * exceptions. Refreshes at most once a second while shown, and stops once the job reached a
 * terminal state.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IDiagnosis, IEdge, IJobDetail, IVertex, TERMINAL_STATES, jobPath, requestAPI } from './api';
import { JobAction, actionTitle, runJobAction } from './actions';
import { Refresher } from './refresher';
import { KeyedStateSection } from './stateview';
import {
  el,
  formatBytes,
  formatCount,
  formatDuration,
  formatLatency,
  formatTime,
  percent,
  setData,
  setText,
  syncChildren
} from './format';

export const JOB_REFRESH_MS = 1000;

/** Vertices in layers: a vertex's layer is one more than the deepest of its inputs. */
export function layers(vertices: IVertex[], edges: IEdge[]): IVertex[][] {
  const inputs = new Map<string, string[]>(vertices.map(v => [v.id, []]));
  for (const e of edges) {
    inputs.get(e.target)?.push(e.source);
  }
  const depth = new Map<string, number>();
  const visiting = new Set<string>();
  const depthOf = (id: string): number => {
    const known = depth.get(id);
    if (known !== undefined) {
      return known;
    }
    if (visiting.has(id)) {
      return 0; // a cycle (iterations) must not hang the view
    }
    visiting.add(id);
    const d = Math.max(-1, ...(inputs.get(id) || []).filter(s => inputs.has(s)).map(depthOf)) + 1;
    visiting.delete(id);
    depth.set(id, d);
    return d;
  };
  const result: IVertex[][] = [];
  for (const v of vertices) {
    const d = depthOf(v.id);
    (result[d] = result[d] || []).push(v);
  }
  return result.filter(layer => layer);
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** The arrow head the edges end in (an SVG marker). */
function arrowHead(): SVGElement {
  const defs = document.createElementNS(SVG_NS, 'defs');
  const marker = document.createElementNS(SVG_NS, 'marker');
  for (const [k, v] of Object.entries({
    id: 'streamlab-graph-arrow',
    viewBox: '0 0 10 10',
    refX: '10',
    refY: '5',
    markerWidth: '7',
    markerHeight: '7',
    orient: 'auto'
  })) {
    marker.setAttribute(k, v);
  }
  const tip = document.createElementNS(SVG_NS, 'path');
  tip.setAttribute('d', 'M0,0 L10,5 L0,10 z');
  marker.append(tip);
  defs.append(marker);
  return defs;
}

export class JobView extends Widget {
  constructor(
    readonly clusterId: string,
    readonly jobId: string,
    private jobName: string
  ) {
    super();
    this.addClass('streamlab-jobview');
    this.node.dataset.jobId = jobId;
    this.node.dataset.clusterId = clusterId;
    const head = el('div', 'streamlab-jobview-head');
    head.append(this._name, this._state, this._summary, this._actions);
    for (const action of ['cancel', 'savepoint', 'stop'] as JobAction[]) {
      const button = el('button', `jp-Button jp-mod-styled streamlab-job-${action}`, actionTitle(action));
      button.addEventListener('click', () => void this._act(action));
      this._actions.append(button);
    }
    const section = (title: string, ...body: HTMLElement[]) => {
      const node = el('section', 'streamlab-jobview-section');
      node.append(el('h3', '', title), ...body);
      return node;
    };
    this._stateSection = new KeyedStateSection(clusterId, jobId);
    const table = el('table', 'streamlab-checkpoints');
    const header = el('tr');
    for (const h of ['id', 'kind', 'status', 'triggered', 'duration', 'size']) {
      header.append(el('th', '', h));
    }
    table.append(el('thead'), this._checkpoints);
    table.tHead!.append(header);
    this.node.append(
      head,
      this._error,
      section('Diagnosis', this._diagnosis),
      section('Job graph', this._graph),
      section('Checkpoints', this._checkpointsNote, table),
      section('Keyed state', this._stateSection.node),
      section('Exceptions', this._exceptions)
    );
    this._error.hidden = true;
    this._edges.setAttribute('class', 'streamlab-graph-edges');
    this._graph.append(this._edges, this._layers);
    setText(this._name, jobName);
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._drawEdges();
  }

  /**
   * The edges as arrows from a vertex's right side to its consumer's left, each labelled with its
   * ship strategy, drawn over the laid-out boxes (their places are the browser's, so they are
   * drawn again after every refresh and resize).
   */
  private _drawEdges(): void {
    const frame = this._graph.getBoundingClientRect();
    const boxes = new Map<string, DOMRect>();
    this._layers.querySelectorAll<HTMLElement>('.streamlab-vertex').forEach(box => {
      boxes.set(box.dataset.vertexId ?? '', box.getBoundingClientRect());
    });
    const svg = this._edges;
    svg.setAttribute('width', String(Math.ceil(frame.width)));
    svg.setAttribute('height', String(Math.ceil(frame.height)));
    const paths: SVGElement[] = [];
    for (const e of this._edgeList) {
      const from = boxes.get(e.source);
      const to = boxes.get(e.target);
      if (!from || !to) {
        continue;
      }
      const x1 = from.right - frame.left;
      const y1 = from.top + from.height / 2 - frame.top;
      const x2 = to.left - frame.left;
      const y2 = to.top + to.height / 2 - frame.top;
      const bend = Math.max(16, (x2 - x1) / 2);
      const edge = document.createElementNS(SVG_NS, 'g');
      edge.setAttribute('class', 'streamlab-graph-edge');
      edge.setAttribute('data-source', e.source);
      edge.setAttribute('data-target', e.target);
      edge.setAttribute('data-ship-strategy', e.ship_strategy);
      const path = document.createElementNS(SVG_NS, 'path');
      path.setAttribute('d', `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`);
      path.setAttribute('marker-end', 'url(#streamlab-graph-arrow)');
      const label = document.createElementNS(SVG_NS, 'text');
      label.setAttribute('x', String((x1 + x2) / 2));
      label.setAttribute('y', String((y1 + y2) / 2 - 4));
      label.setAttribute('text-anchor', 'middle');
      label.textContent = e.ship_strategy;
      edge.append(path, label);
      paths.push(edge);
    }
    svg.replaceChildren(this._arrowHead, ...paths);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    if (!this._ended) {
      this._refresher.start();
    }
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible && !this._ended) {
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
    let detail: IJobDetail;
    try {
      detail = await requestAPI<IJobDetail>(jobPath(this.clusterId, this.jobId));
    } catch (error) {
      this._error.hidden = false;
      setText(this._error, (error as Error).message);
      return;
    }
    if (this.isDisposed) {
      return;
    }
    this._error.hidden = true;
    this._render(detail);
    if (TERMINAL_STATES.has(detail.job.state)) {
      this._ended = true;
      this._refresher.stop();
    }
  }

  private _render(detail: IJobDetail): void {
    const job = detail.job;
    this.jobName = job.name;
    setData(this.node, 'state', job.state);
    setText(this._name, job.name);
    setText(this._state, job.state);
    setData(this._state, 'state', job.state);
    setText(
      this._summary,
      `${formatDuration(job.duration_ms)} · in ${formatCount(job.records_in)} · out ${formatCount(job.records_out)}` +
        ` · back pressure ${job.backpressure}`
    );
    const ended = TERMINAL_STATES.has(job.state);
    // an ended job can be neither cancelled nor stopped, nor give a savepoint
    this._actions.hidden = ended;
    this._actions.querySelectorAll('button').forEach(b => (b.disabled = ended || this._busy));
    this._stateSection.setOperators(detail.keyed_operators);
    this._renderDiagnosis(detail.diagnosis, ended);

    syncChildren(
      this._layers,
      layers(detail.vertices, detail.edges),
      layer => layer.map(v => v.id).join(','),
      () => el('div', 'streamlab-graph-layer'),
      (node, layer) =>
        syncChildren(
          node,
          layer,
          v => v.id,
          () => {
            const box = el('div', 'streamlab-vertex');
            box.append(
              el('div', 'streamlab-vertex-name'),
              el('div', 'streamlab-vertex-numbers'),
              el('div', 'streamlab-vertex-backpressure')
            );
            return box;
          },
          (box, v) => {
            setData(box, 'vertexId', v.id);
            setData(box, 'backpressure', v.backpressure);
            setData(box, 'busy', String(Math.round(v.busy * 100)));
            setData(box, 'backpressured', String(Math.round(v.backpressured * 100)));
            box.style.background = v.color ?? '';
            box.style.color = v.ink ?? '';
            const [name, numbers, bp] = Array.from(box.children) as HTMLElement[];
            setText(name, `${v.name} ×${v.parallelism}`);
            setText(numbers, `in ${formatCount(v.records_in)} · out ${formatCount(v.records_out)}`);
            setText(
              bp,
              `busy ${percent(v.busy)} · back-pressured ${percent(v.backpressured)} (${v.backpressure})`
            );
          }
        )
    );
    this._edgeList = detail.edges;
    this._drawEdges();

    const checkpoints = [...detail.checkpoints].sort((a, b) => b.id - a.id);
    syncChildren(
      this._checkpoints,
      checkpoints,
      c => String(c.id),
      () => {
        const row = el('tr', 'streamlab-checkpoint');
        for (let i = 0; i < 6; i++) {
          row.append(el('td'));
        }
        return row;
      },
      (row, c) => {
        setData(row, 'status', c.status);
        const cells = Array.from(row.children);
        const values = [
          String(c.id),
          c.is_savepoint ? 'savepoint' : 'checkpoint',
          c.status,
          formatTime(c.trigger_time),
          c.end_time > 0 ? formatDuration(c.duration_ms) : '-',
          formatBytes(c.size)
        ];
        values.forEach((v, i) => setText(cells[i], v));
      }
    );
    if (!checkpoints.length) {
      setText(this._checkpoints, '');
    }
    // never a bare table header: say that checkpointing is off, or that none was taken yet
    const interval = detail.checkpoint_interval_ms;
    const note =
      interval === 0
        ? 'Checkpointing is off for this job: no --checkpoint-interval on its %%stream line ' +
          '(execution.checkpointing.interval). Checkpoints taken for a fresh look at its keyed state show here.'
        : checkpoints.length
          ? ''
          : `No checkpoint yet: one every ${formatDuration(interval)}.`;
    setText(this._checkpointsNote, note);
    setData(this._checkpointsNote, 'interval', String(interval));
    this._checkpointsNote.hidden = !note;
    (this._checkpoints.parentElement as HTMLElement).hidden = !checkpoints.length;

    syncChildren(
      this._exceptions,
      detail.exceptions.length ? detail.exceptions : [null],
      e => (e ? `${e.time}:${e.task}:${e.exception.slice(0, 80)}` : 'none'),
      e => {
        if (!e) {
          return el('div', 'streamlab-exceptions-none', 'No exceptions.');
        }
        const node = el('details', 'streamlab-exception');
        const summary = el('summary', '', `${formatTime(e.time)}${e.task ? ` · ${e.task}` : ''} · ${e.exception.split('\n')[0]}`);
        node.append(summary, el('pre', '', e.exception));
        return node;
      },
      () => undefined
    );
  }

  /** The JobManager's answers, a line each: what limits the job, its latency, why its windows
   * wait (those only while it runs), and its late rows. */
  private _renderDiagnosis(d: IDiagnosis, ended: boolean): void {
    const lines: { kind: string; key?: string; text: string; data?: Record<string, string> }[] = [];
    if (!ended && d.bottleneck) {
      lines.push({ kind: 'bottleneck', text: `Bottleneck: ${d.bottleneck}` });
    }
    const l = d.latency;
    if (!ended && l && l.p50 !== null && l.p90 !== null && l.p99 !== null) {
      const lag = l['event-time-lag'];
      lines.push({
        kind: 'latency',
        text:
          `Latency, ingestion to sink, last seconds: p50 ${formatLatency(l.p50)} · p90 ${formatLatency(l.p90)}` +
          ` · p99 ${formatLatency(l.p99)}` +
          (lag !== null ? ` · event time ${formatLatency(lag.p50)} behind the clock (p99 ${formatLatency(lag.p99)})` : ''),
        data: { p50: String(l.p50), p99: String(l.p99) }
      });
    }
    (ended ? [] : d.window_waits).forEach((wait, i) => lines.push({ kind: 'window-wait', key: String(i), text: wait }));
    for (const r of d.late_rows) {
      lines.push({
        kind: 'late-rows',
        key: r.operator,
        text: `Late rows of ${r.operator}: ${formatCount(r.count)} (${formatCount(r.dropped)} dropped)`
      });
    }
    if (!lines.length) {
      lines.push({
        kind: 'none',
        text: ended ? 'The job has ended.' : 'Nothing to report: nothing limits the job, no window waits, no late rows.'
      });
    }
    syncChildren(
      this._diagnosis,
      lines,
      line => `${line.kind}:${line.key ?? ''}`,
      line => el('div', `streamlab-diagnosis-${line.kind}`),
      (node, line) => {
        setText(node, line.text);
        for (const [k, v] of Object.entries(line.data || {})) {
          setData(node, k, v);
        }
      }
    );
  }

  private async _act(action: JobAction): Promise<void> {
    this._busy = true;
    this._actions.querySelectorAll('button').forEach(b => (b.disabled = true));
    try {
      await runJobAction(action, this.clusterId, this.jobId, this.jobName);
    } catch {
      // shown by runJobAction
    } finally {
      this._busy = false;
      this._ended = false; // a new state is coming: look again
      this._refresher.start();
      this._refresher.poke();
    }
  }

  private readonly _refresher = new Refresher(() => this._refresh(), JOB_REFRESH_MS);
  private readonly _name = el('span', 'streamlab-jobview-name');
  private readonly _state = el('span', 'streamlab-job-state');
  private readonly _summary = el('span', 'streamlab-jobview-summary');
  private readonly _actions = el('span', 'streamlab-jobview-actions');
  private readonly _stateSection: KeyedStateSection;
  private readonly _checkpointsNote = el('div', 'streamlab-checkpoints-note');
  private readonly _error = el('div', 'streamlab-panel-error');
  private readonly _graph = el('div', 'streamlab-graph');
  private readonly _layers = el('div', 'streamlab-graph-layers');
  private readonly _edges = document.createElementNS(SVG_NS, 'svg');
  private readonly _arrowHead = arrowHead();
  private _edgeList: IEdge[] = [];
  private readonly _diagnosis = el('div', 'streamlab-diagnosis');
  private readonly _checkpoints = el('tbody');
  private readonly _exceptions = el('div', 'streamlab-exceptions');
  private _ended = false;
  private _busy = false;
}
