/**
 * streamlab in JupyterLab: the Streams side panel, the slots status item and the notebook
 * commands, all fed by the server extension's streamlab/api routes.
 */
import { ILabShell, ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget } from '@jupyterlab/apputils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { INotebookModel, INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { CommandToolbarButton, LabIcon, downloadIcon, stopIcon } from '@jupyterlab/ui-components';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';

import { ICluster, IJob } from './api';
import { cancelActiveCellJob, exportActiveCell } from './commands';
import { JobView } from './jobview';
import { StreamsPanel } from './panel';
import { SlotsStatus } from './statusbar';

const STREAMS_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
  '<g class="jp-icon3" fill="#616161"><path d="M2 6c3-3 6 3 10 0s7-3 10 0v3c-3-3-6 3-10 0S5 6 2 9z"/>' +
  '<path d="M2 13c3-3 6 3 10 0s7-3 10 0v3c-3-3-6 3-10 0s-7-3-10 0z"/></g></svg>';

export const streamsIcon = new LabIcon({ name: 'streamlab:streams', svgstr: STREAMS_SVG });

export namespace CommandIDs {
  export const exportCell = 'streamlab:export-cell';
  export const cancelCellJob = 'streamlab:cancel-cell-job';
  export const openJob = 'streamlab:open-job';
  export const showPanel = 'streamlab:show-panel';
}

const panelPlugin: JupyterFrontEndPlugin<void> = {
  id: 'streamlab-labext:panel',
  description: 'The Streams side panel: clusters, TaskManagers and slots, jobs and their actions.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    labShell: ILabShell | null
  ) => {
    const views = new Map<string, MainAreaWidget<JobView>>();
    const openJob = (clusterId: string, jobId: string, name: string) => {
      const key = `${clusterId}/${jobId}`;
      let view = views.get(key);
      if (!view || view.isDisposed) {
        view = new MainAreaWidget({ content: new JobView(clusterId, jobId, name) });
        view.id = `streamlab-job-${clusterId}-${jobId}`;
        view.title.label = name;
        view.title.caption = `streamlab job ${name} (${jobId})`;
        view.title.icon = streamsIcon;
        view.title.closable = true;
        views.set(key, view);
        view.disposed.connect(() => views.delete(key));
        app.shell.add(view, 'main');
      }
      app.shell.activateById(view.id);
      return view;
    };
    app.commands.addCommand(CommandIDs.openJob, {
      label: 'Open streamlab job',
      execute: args => {
        openJob(String(args.clusterId), String(args.jobId), String(args.name ?? args.jobId));
      }
    });
    const panel = new StreamsPanel((cluster: ICluster, job: IJob) => openJob(cluster.id, job.id, job.name), streamsIcon);
    app.shell.add(panel, 'left', { rank: 700 });
    restorer?.add(panel, panel.id);
    app.commands.addCommand(CommandIDs.showPanel, {
      label: 'Show the Streams panel',
      execute: () => {
        if (labShell) {
          labShell.activateById(panel.id);
        } else {
          app.shell.activateById(panel.id);
        }
      }
    });
    palette?.addItem({ command: CommandIDs.showPanel, category: 'streamlab' });
  }
};

const statusPlugin: JupyterFrontEndPlugin<void> = {
  id: 'streamlab-labext:statusbar',
  description: "Slots in use / total of the current notebook's streamlab cluster.",
  autoStart: true,
  requires: [IStatusBar, INotebookTracker],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar, tracker: INotebookTracker) => {
    const item = new SlotsStatus(app.shell, tracker);
    statusBar.registerStatusItem('streamlab-labext:slots', { item, align: 'left', rank: 4 });
  }
};

class NotebookButtons implements DocumentRegistry.IWidgetExtension<NotebookPanel, INotebookModel> {
  constructor(private readonly app: JupyterFrontEnd) {}

  createNew(panel: NotebookPanel): IDisposable {
    const buttons = (
      [
        ['streamlab-export', CommandIDs.exportCell, downloadIcon],
        ['streamlab-cancel', CommandIDs.cancelCellJob, stopIcon]
      ] as const
    ).map(([name, id, icon]) => {
      // an icon with the command's caption as its tooltip: the toolbar has no room for labels
      const button = new CommandToolbarButton({ commands: this.app.commands, id, icon, label: '' });
      button.addClass(`${name}-button`);
      panel.toolbar.insertAfter('cellType', name, button);
      return button;
    });
    return new DisposableDelegate(() => buttons.forEach(b => b.dispose()));
  }
}

const commandsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'streamlab-labext:commands',
  description: 'Notebook commands: export the active %%stream cell as a job, cancel its job.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker, palette: ICommandPalette | null) => {
    const hasNotebook = () => tracker.currentWidget !== null;
    app.commands.addCommand(CommandIDs.exportCell, {
      label: 'Export this %%stream cell as a job',
      caption: 'Save the notebook and export the active %%stream cell as a job package',
      isEnabled: hasNotebook,
      execute: () => exportActiveCell(tracker)
    });
    app.commands.addCommand(CommandIDs.cancelCellJob, {
      label: "Cancel this cell's job",
      caption: 'Cancel the streamlab job the active cell started',
      isEnabled: hasNotebook,
      // args.confirm === false skips the question (scripts, tests)
      execute: args => cancelActiveCellJob(tracker, args.confirm !== false)
    });
    for (const command of [CommandIDs.exportCell, CommandIDs.cancelCellJob]) {
      palette?.addItem({ command, category: 'streamlab' });
    }
    app.docRegistry.addWidgetExtension('Notebook', new NotebookButtons(app));
  }
};

export default [panelPlugin, statusPlugin, commandsPlugin];
