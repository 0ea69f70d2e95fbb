/** Job actions shared by the panel, the job view and the notebook commands. */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';

import { jobPath, postAPI } from './api';

export type JobAction = 'cancel' | 'savepoint' | 'stop';

const LABELS: Record<JobAction, { title: string; confirm: string | null; done: string }> = {
  cancel: { title: 'Cancel', confirm: 'Cancel job', done: 'canceled' },
  savepoint: { title: 'Savepoint', confirm: null, done: 'savepoint written' },
  stop: { title: 'Stop with savepoint', confirm: 'Stop job with a savepoint', done: 'stopped' }
};

export function actionTitle(action: JobAction): string {
  return LABELS[action].title;
}

/**
 * Runs an action on a job, asking first for the ones that end it (as Flink's web UI does).
 * Resolves to the server's answer, or null when the user declined; failures are shown as a
 * notification and rethrown.
 */
export async function runJobAction(
  action: JobAction,
  clusterId: string,
  jobId: string,
  jobName: string,
  confirm = true
): Promise<{ ok?: boolean; location?: string } | null> {
  const label = LABELS[action];
  if (confirm && label.confirm) {
    const answer = await showDialog({
      title: `${label.confirm}?`,
      body: `${jobName} (${jobId})`,
      buttons: [Dialog.cancelButton({ label: 'Keep running' }), Dialog.warnButton({ label: label.confirm })]
    });
    if (!answer.button.accept) {
      return null;
    }
  }
  try {
    const result = await postAPI<{ ok?: boolean; location?: string }>(jobPath(clusterId, jobId, action));
    const where = result.location ? `: ${result.location}` : '';
    Notification.success(`${jobName}: ${label.done}${where}`, { autoClose: 8000 });
    return result;
  } catch (error) {
    Notification.error(`${jobName}: ${label.title.toLowerCase()} failed: ${(error as Error).message}`, {
      autoClose: false
    });
    throw error;
  }
}
