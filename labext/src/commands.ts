/**
 * The notebook commands: export the active %%stream cell as a job package, and cancel the job
 * the active cell started (read from its output's application/vnd.streamlab.job+json).
 */
import { Notification } from '@jupyterlab/apputils';
import { ICodeCellModel } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { ICellJob, JOB_MIME, postAPI } from './api';
import { runJobAction } from './actions';

/** Splits a magic line as a shell does (quotes group words): enough for %%stream's options. */
export function splitArgs(line: string): string[] {
  const words: string[] = [];
  const re = /"((?:[^"\\]|\\.)*)"|'([^']*)'|(\S+)/g;
  let m: RegExpExecArray | null;
  while ((m = re.exec(line))) {
    words.push(m[1] !== undefined ? m[1].replace(/\\(.)/g, '$1') : m[2] !== undefined ? m[2] : m[3]);
  }
  return words;
}

/**
 * The --name of a %%stream cell, null for a %%stream cell without one, undefined for a cell
 * that is not a %%stream cell (the magic must be its first line).
 */
export function streamCellName(source: string): string | null | undefined {
  const first = source.split('\n', 1)[0].trim();
  const words = splitArgs(first);
  if (words[0] !== '%%stream') {
    return undefined;
  }
  for (let i = 1; i < words.length; i++) {
    if ((words[i] === '--name' || words[i] === '-n') && i + 1 < words.length) {
      return words[i + 1];
    }
    if (words[i].startsWith('--name=')) {
      return words[i].slice('--name='.length);
    }
  }
  return null;
}

/** The job an output of the cell names; the newest if it ran several times. */
export function cellJob(model: ICodeCellModel): ICellJob | null {
  const outputs = model.outputs;
  for (let i = outputs.length - 1; i >= 0; i--) {
    const job = outputs.get(i).data[JOB_MIME] as unknown as ICellJob | undefined;
    if (job && job.job_id && job.cluster_id) {
      return job;
    }
  }
  return null;
}

export class CommandError extends Error {}

function fail(message: string): never {
  Notification.error(message, { autoClose: 8000 });
  throw new CommandError(message);
}

function activeCodeCell(tracker: INotebookTracker): { panel: NotebookPanel; model: ICodeCellModel } {
  const panel = tracker.currentWidget;
  const cell = panel?.content.activeCell;
  if (!panel || !cell) {
    fail('No notebook cell is active.');
  }
  if (cell.model.type !== 'code') {
    fail('The active cell is not a code cell: select a %%stream cell.');
  }
  return { panel, model: cell.model as ICodeCellModel };
}

/** POST .../export: the packages written (a job's named after it), their files, the notebook read. */
export interface IExported {
  packages: string[];
  files: string[][];
  notebook: string;
}

/** Saves the notebook and exports its active %%stream cell; resolves to the packages written. */
export async function exportActiveCell(tracker: INotebookTracker): Promise<IExported> {
  const { panel, model } = activeCodeCell(tracker);
  const name = streamCellName(model.sharedModel.getSource());
  if (name === undefined) {
    fail('The active cell is not a %%stream cell (%%stream must be its first line).');
  }
  // the export reads the notebook as saved on disk
  await panel.context.save();
  let result: IExported;
  try {
    result = await postAPI<IExported>(['export'], { path: panel.context.path, cell: name, output: null });
  } catch (error) {
    fail(`Export failed: ${(error as Error).message}`);
  }
  const written = result.packages.map((p, i) => `${p} (${result.files[i].join(', ')})`).join('; ');
  Notification.success(
    `Exported ${name === null ? 'the notebook' : `"${name}"`} to ${written}, from ${result.notebook} as just saved`,
    { autoClose: 15000 }
  );
  return result;
}

/** Cancels the job named by the active cell's output; resolves to null if the user declined. */
export async function cancelActiveCellJob(tracker: INotebookTracker, confirm: boolean): Promise<ICellJob | null> {
  const { model } = activeCodeCell(tracker);
  const job = cellJob(model);
  if (!job) {
    fail("The active cell's outputs name no streamlab job: run a %%stream cell first.");
  }
  const answer = await runJobAction('cancel', job.cluster_id, job.job_id, job.name, confirm);
  return answer ? job : null;
}
