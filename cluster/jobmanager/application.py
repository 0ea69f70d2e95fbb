"""Application mode: the JobManager runs a job script's ``main()`` itself (Flink's
ApplicationDispatcherBootstrap), then shuts its cluster down.

``python -m cluster.jobmanager --cluster-dir D --application job.py [--application-arg A ...]``:
once the JobManager is up and ``jobmanager.json`` written, the script runs as ``__main__`` in a
thread of this process, with the context variables of ``streamlab run`` pointing at D, so its
``env.execute()`` submits here over the JobManager's own socket. When ``main()`` has returned (or
raised) and no job of the Dispatcher is still running, the outcome is logged and written to
``D/application.json``, every TaskManager is told to shut down (those the active ResourceManager
started are stopped) and the process exits with:

    0  every job ended FINISHED
    1  a job ended FAILED
    2  a job was CANCELED, main() raised, submitted no job, or the JobManager was stopped first
"""
from __future__ import annotations

import json
import logging
import os
import runpy
import sys
import threading
import traceback
from pathlib import Path
from typing import Optional, Protocol

from cluster.common import launch
from cluster.protocol.states import JobState
from cluster.protocol.endpoint import RpcEndpoint
from cluster.protocol.job_context import CONTEXT_CLUSTER_DIR, CONTEXT_DETACHED, CONTEXT_VERBOSE

from cluster.jobmanager.dispatcher import Dispatcher
from cluster.jobmanager.resourcemanager.resource_manager import ResourceManager

log = logging.getLogger("streamlab.application")


EXIT_FINISHED, EXIT_FAILED, EXIT_NOT_FINISHED = 0, 1, 2
_CHECK_EVERY_S = 0.2


def exit_code_of(job_states: list[str], main_error: Optional[str]) -> int:
    if JobState.FAILED in job_states:
        return EXIT_FAILED
    if main_error is not None or not job_states or any(s != JobState.FINISHED for s in job_states):
        return EXIT_NOT_FINISHED
    return EXIT_FINISHED


class JobManagerProcess(Protocol):
    """What the application drives of the JobManager that runs it (entrypoint.JobManager, which
    imports this module: described here, not imported back)."""
    cluster_dir: Path
    endpoint: RpcEndpoint
    dispatcher: Dispatcher
    resource_manager: ResourceManager
    stopped: threading.Event  # stop() began

    def stop(self) -> None: ...


class Application:
    """``start`` from the process's main thread once the JobManager is up; ``main()`` runs on the
    thread ``application-main``; what follows it (waiting for jobs, shutdown) on the JobManager's
    loop thread (checked); ``exit_code`` is read by the main thread after the JobManager stopped."""

    def __init__(self, jm: JobManagerProcess, script: Path, args: list[str]):
        self.jm = jm
        self.script = Path(script).resolve()
        self.args = list(args)
        self.main_error: Optional[str] = None
        self.exit_code: Optional[int] = None  # None until the application ended

    def start(self) -> None:
        # a daemon: a main() that never returns does not keep a stopped JobManager's process alive
        threading.Thread(target=self._run_main, name="application-main", daemon=True).start()

    def _run_main(self) -> None:
        os.environ[CONTEXT_CLUSTER_DIR] = str(self.jm.cluster_dir)
        os.environ[CONTEXT_DETACHED] = "0"
        os.environ[CONTEXT_VERBOSE] = "1"
        sys.argv = [str(self.script), *self.args]
        sys.path.insert(0, str(self.script.parent))
        log.info("running main() of %s %s", self.script, " ".join(self.args))
        error: Optional[str] = None
        try:
            runpy.run_path(str(self.script), run_name="__main__")
        except SystemExit as exc:  # sys.exit(0) from a script is a normal end
            if exc.code not in (0, None):
                error = f"main() exited with {exc.code!r}"
        except BaseException as exc:  # the application's failure, reported as its outcome
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            log.error("main() of %s raised:\n%s", self.script, traceback.format_exc())
        self.jm.endpoint.call_soon(self._main_returned, error)

    def _main_returned(self, error: Optional[str]) -> None:
        self.jm.endpoint.assert_loop_thread()
        self.main_error = error
        log.info("main() of %s %s", self.script.name, "returned" if error is None else f"raised: {error}")
        self._finish_when_jobs_ended()

    def _finish_when_jobs_ended(self) -> None:
        self.jm.endpoint.assert_loop_thread()
        if self.jm.stopped.is_set():
            return
        running = [j for j in self.jm.dispatcher.jobs.values() if j.state not in JobState.GLOBALLY_TERMINAL]
        if running:  # submitted detached (execute_async) and still going
            self.jm.endpoint.call_later(_CHECK_EVERY_S, self._finish_when_jobs_ended)
            return
        self._finish()

    def _finish(self) -> None:
        masters = list(self.jm.dispatcher.jobs.values())
        jobs = [{"jid": j.job_id, "name": j.job_graph.name, "state": j.state, "failure": j.status().failure}
                for j in masters]
        self.exit_code = exit_code_of([j.state for j in masters], self.main_error)
        outcome = {"exit_code": self.exit_code, "jobs": jobs, "error": self.main_error
                   or (None if jobs else "the application submitted no job")}
        for job in jobs:
            log.info("application job %s (%s) %s", job["jid"], job["name"], job["state"])
        log.info("application %s ended: exit code %d%s", self.script.name, self.exit_code,
                 f" ({outcome['error']})" if outcome["error"] else "")
        path = self.jm.cluster_dir / launch.RESULT_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(outcome))
        tmp.replace(path)
        self.jm.resource_manager.shutdown_task_managers()
        self.jm.endpoint.call_later(0.3, self.jm.stop)  # the shutdown messages leave first

    def final_exit_code(self) -> int:
        """After the JobManager stopped: the application's, or 2 if it was stopped before the end."""
        if self.exit_code is None:
            log.warning("the JobManager stopped before the application ended")
            return EXIT_NOT_FINISHED
        return self.exit_code
