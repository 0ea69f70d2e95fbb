/**
 * The status bar item "Slots: used/total" of the current notebook's kernel's embedded cluster,
 * asked at most every 2 s, and only while a notebook is the current widget.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { ICluster, requestAPI } from './api';
import { setData, setText } from './format';
import { Refresher } from './refresher';

export const STATUS_REFRESH_MS = 2000;

export class SlotsStatus extends Widget {
  constructor(
    private readonly shell: JupyterFrontEnd.IShell,
    private readonly tracker: INotebookTracker
  ) {
    super();
    this.addClass('streamlab-statusbar');
    this.node.hidden = true;
    tracker.currentChanged.connect(this._follow, this);
    shell.currentChanged?.connect(this._follow, this);
    this._follow();
  }

  dispose(): void {
    this._refresher.stop();
    super.dispose();
  }

  /** The notebook the item reports on: the tracker's current one, while it is the shell's. */
  private _notebook(): NotebookPanel | null {
    const panel = this.tracker.currentWidget;
    return panel && this.shell.currentWidget === panel ? panel : null;
  }

  private _follow(): void {
    const panel = this._notebook();
    if (panel !== this._watched) {
      this._watched?.sessionContext.kernelChanged.disconnect(this._kernelChanged, this);
      this._watched = panel;
      panel?.sessionContext.kernelChanged.connect(this._kernelChanged, this);
    }
    if (panel) {
      this._refresher.start();
    } else {
      this._refresher.stop();
      this._show(null);
    }
  }

  private _kernelChanged(): void {
    this._show(null);
    this._refresher.poke();
  }

  private async _refresh(): Promise<void> {
    const panel = this._notebook();
    const kernel = panel?.sessionContext.session?.kernel;
    if (!panel || !kernel) {
      this._show(null);
      return;
    }
    try {
      const answer = await requestAPI<{ cluster: ICluster | null }>(['kernels', kernel.id, 'cluster']);
      // the notebook may have changed while the request was out
      this._show(this._notebook()?.sessionContext.session?.kernel?.id === kernel.id ? answer.cluster : null);
    } catch (error) {
      this._show(null);
      throw error;
    }
  }

  private _show(cluster: ICluster | null): void {
    const hidden = !cluster || !!cluster.error;
    if (this.node.hidden !== hidden) {
      this.node.hidden = hidden;
    }
    if (cluster && !cluster.error) {
      setText(this.node, `Slots: ${cluster.slots_used}/${cluster.slots_total}`);
      setData(this.node, 'slotsUsed', String(cluster.slots_used));
      setData(this.node, 'slotsTotal', String(cluster.slots_total));
      this.node.title = `streamlab cluster ${cluster.name}: ${cluster.slots_used} of ${cluster.slots_total} slots in use`;
    }
  }

  private readonly _refresher = new Refresher(() => this._refresh(), STATUS_REFRESH_MS);
  private _watched: NotebookPanel | null = null;
}
