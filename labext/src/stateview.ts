/**
 * A running job's keyed state in its job view: the user picks an operator (the job's operators
 * with keyed state are offered, the first filled in) or names one by uid, and reads its state at the newest completed checkpoint, or at one taken for the look
 * ("Fresh"); the job runs on. Read on demand only, never on the view's refresh: a look reads
 * checkpoint files at the JobManager.
 */
import { IKeyedState, jobPath, requestAPI } from './api';
import { el, setData, setText } from './format';

export class KeyedStateSection {
  readonly node = el('div', 'streamlab-state');

  constructor(
    private readonly clusterId: string,
    private readonly jobId: string
  ) {
    this._operator.placeholder = 'operator name or uid, e.g. count';
    this._choices.id = `streamlab-operators-${jobId}`;
    this._operator.setAttribute('list', this._choices.id);
    const latest = el('button', 'jp-Button jp-mod-styled streamlab-state-show', 'Latest checkpoint');
    const fresh = el('button', 'jp-Button jp-mod-styled streamlab-state-fresh', 'Fresh checkpoint');
    latest.addEventListener('click', () => void this._show(false));
    fresh.addEventListener('click', () => void this._show(true));
    this._operator.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        void this._show(false);
      }
    });
    const form = el('div', 'streamlab-state-form');
    form.append(this._operator, this._choices, latest, fresh);
    this.node.append(form, this._caption, this._table);
  }

  /** The job's operators with keyed state, to pick from; the first is filled in until the user types. */
  setOperators(names: string[]): void {
    const known = Array.from(this._choices.options).map(o => o.value);
    if (known.join('\n') !== names.join('\n')) {
      this._choices.replaceChildren(...names.map(name => Object.assign(el('option'), { value: name })));
    }
    if (!this._operator.value && names.length) {
      this._operator.value = names[0];
    }
  }

  private async _show(fresh: boolean): Promise<void> {
    const operator = this._operator.value.trim();
    if (!operator) {
      setText(this._caption, 'Name the operator whose keyed state to show.');
      return;
    }
    setText(this._caption, fresh ? 'Taking a checkpoint…' : 'Reading…');
    let state: IKeyedState;
    try {
      state = await requestAPI<IKeyedState>(jobPath(this.clusterId, this.jobId, 'state'), {}, {
        operator,
        fresh: String(fresh)
      });
    } catch (error) {
      setData(this._caption, 'checkpointId', '');
      setText(this._caption, (error as Error).message);
      this._table.replaceChildren();
      return;
    }
    setData(this._caption, 'checkpointId', String(state.checkpoint_id));
    const shown = state.rows.length < state.rows_total ? ` (the first ${state.rows.length})` : '';
    setText(
      this._caption,
      `${state.operator} at checkpoint ${state.checkpoint_id}: ${state.rows_total} key(s)${shown}`
    );
    const head = el('tr');
    state.columns.forEach(c => head.append(el('th', state.key_columns.includes(c) ? 'streamlab-state-key' : '', c)));
    const body = el('tbody');
    for (const row of state.rows) {
      const tr = el('tr', 'streamlab-state-row');
      row.forEach(value => tr.append(el('td', '', typeof value === 'string' ? value : JSON.stringify(value))));
      body.append(tr);
    }
    const thead = el('thead');
    thead.append(head);
    this._table.replaceChildren(thead, body);
  }

  private readonly _operator = el('input', 'jp-mod-styled streamlab-state-operator');
  private readonly _choices = el('datalist', 'streamlab-state-operators');
  private readonly _caption = el('div', 'streamlab-state-caption');
  private readonly _table = el('table', 'streamlab-state-table');
}
