"""``streamlab run-application``: a cluster for one application, as Flink's ``flink run-application``.

The command makes a cluster directory (config.yaml: the package's config.yaml, then -D, then
``resourcemanager.provider: process``; a new secret) and starts a JobManager in application mode
there (cluster/jobmanager/application.py): the JobManager runs the job script's ``main()`` itself,
its ResourceManager starts the TaskManagers the job asks for, and it shuts the cluster down and
exits when the job ended. Attached, the command waits for that and exits with the JobManager's
exit code (0 FINISHED, 1 FAILED, 2 CANCELED or main() raised); ``--detached`` returns once the
job is RUNNING.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import click
import yaml

from cluster.common import launch
from cluster.conf import ConfigError, Configuration, check_slot_bounds
from cluster.protocol.states import JobState
from cluster.protocol.auth import create_secret
from cluster.protocol.endpoint import RpcError
from cluster.conf.options import ResourceManagerOptions

from kernel_runtime.deploy import processes
from kernel_runtime.client.job_client import JobClient
from kernel_runtime.cli.options import dynamic_option, dynamic_properties
from kernel_runtime.client.cluster_info import ClusterInfo, ClusterNotRunning
from kernel_runtime.deploy.local import wait_for_jobmanager

JOB_SCRIPT, PACKAGE_CONFIG = "job.py", "config.yaml"


def read_package(package: Path) -> tuple[Path, dict[str, Any]]:
    """The job script and the configuration of a package folder (DIR/job.py, DIR/config.yaml if
    there), or of a lone script (no configuration)."""
    if package.is_dir():
        script = package / JOB_SCRIPT
        if not script.is_file():
            raise click.BadParameter(f"{package} has no {JOB_SCRIPT}", param_hint="DIR|job.py")
        config_file = package / PACKAGE_CONFIG
        try:
            config = yaml.safe_load(config_file.read_text()) or {} if config_file.exists() else {}
        except yaml.YAMLError as exc:
            raise click.ClickException(f"{config_file} is not valid YAML: {exc}") from None
        if not isinstance(config, dict):
            raise click.ClickException(f"{config_file} must be a map of configuration keys")
        return script, config
    return package, {}


def application_configuration(config: dict[str, Any], dynamic: dict[str, Any], source: str,
                              taskmanagers: Optional[int], slots: Optional[int]) -> Configuration:
    # a cluster of its own: any free ports, unless the configuration names them
    conf = Configuration({"jobmanager.rpc.port": 0, "rest.port": 0}, "run-application")
    conf.update(config, source).update(dynamic, "-D")
    if slots is not None:
        conf.update({"taskmanager.numberOfTaskSlots": slots}, "--slots")
    conf.update({"resourcemanager.provider": "process"}, "run-application")
    if taskmanagers is not None:  # started up front and kept while the application runs
        conf.update({"slotmanager.number-of-slots.min": taskmanagers * conf["taskmanager.numberOfTaskSlots"]},
                    "--taskmanagers")
    check_slot_bounds(conf.get(ResourceManagerOptions.MIN_SLOT_NUM), conf.get(ResourceManagerOptions.MAX_SLOT_NUM))
    return conf


@click.command("run-application", context_settings={"ignore_unknown_options": True})
@click.option("--taskmanagers", "-n", type=click.IntRange(1), default=None,
              help="TaskManagers started up front (default: the ones the job asks for, when it asks).")
@click.option("--slots", "-s", type=click.IntRange(1, 1024), default=None,
              help="Slots per TaskManager (default: taskmanager.numberOfTaskSlots).")
@dynamic_option
@click.option("--detached", "-d", is_flag=True, help="Return once the job is RUNNING.")
@click.option("--cluster-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The application cluster's directory (default: a new temporary one).")
@click.option("--timeout", default=120.0, show_default=True,
              help="Seconds to wait for the JobManager to start (and, detached, for the job to run).")
@click.argument("package", type=click.Path(exists=True, path_type=Path), metavar="DIR|job.py")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_application(taskmanagers, slots, dynamic, detached, cluster_dir, timeout, package, args) -> None:
    """Run a job package in a cluster of its own (Flink's application mode): the JobManager runs
    its main(), starts the TaskManagers it needs and shuts down when the job ends. ARGS (after --)
    go to the script's main()."""
    script, config = read_package(package)
    try:
        conf = application_configuration(config, dynamic_properties(dynamic), str(package / PACKAGE_CONFIG),
                                         taskmanagers, slots)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    cluster_dir = (cluster_dir or Path(tempfile.mkdtemp(prefix="streamlab-application-"))).resolve()
    try:
        ClusterInfo.load(cluster_dir)
        raise click.ClickException(f"a cluster is already running in {cluster_dir}")
    except ClusterNotRunning:
        pass
    (cluster_dir / "log").mkdir(mode=0o700, parents=True, exist_ok=True)
    for stale in ("jobmanager.json", launch.RESULT_FILE):
        (cluster_dir / stale).unlink(missing_ok=True)
    create_secret(cluster_dir / "secret")
    conf.write(cluster_dir / "config.yaml")
    app_args = [f"--application-arg={a}" for a in args]  # "=": an argument may start with "-"
    jobmanager = launch.spawn("cluster.jobmanager", "jobmanager", cluster_dir,
                              "--application", str(script.resolve()), *app_args)
    # `streamlab cluster stop --cluster-dir` finds it; it stops the TaskManagers it started itself
    (cluster_dir / processes.PIDS_FILE).write_text(json.dumps({"jobmanager": jobmanager.pid, "taskmanagers": []}))
    deadline = time.monotonic() + timeout
    try:
        info = wait_for_jobmanager(cluster_dir, jobmanager, timeout)
    except (RuntimeError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Application {script} started in {cluster_dir}: JobManager {info.rpc_address} "
               f"(pid {jobmanager.pid}), REST {info.rest_address}")
    if detached:
        job = _wait_running(info, jobmanager, deadline)
        if job is None:
            sys.exit(_report_end(jobmanager, cluster_dir))
        click.echo(f"Job has been submitted with JobID {job['jid']} ({job['name']}): RUNNING")
        click.echo(f"Cluster directory: {cluster_dir}")
        click.echo(f"REST: {info.rest_address}")
        return
    try:
        jobmanager.wait()
    except KeyboardInterrupt:
        raise click.ClickException(f"the application goes on in {cluster_dir}; stop it with "
                                   f"streamlab cluster stop --cluster-dir {cluster_dir}") from None
    sys.exit(_report_end(jobmanager, cluster_dir))


def _wait_running(info: ClusterInfo, jobmanager, deadline: float) -> Optional[dict]:
    """The application's first RUNNING job, or None if the JobManager ended before it ran."""
    client = JobClient(info, timeout=5)
    try:
        while jobmanager.poll() is None:
            try:
                running = [j for j in client.list_jobs() if j["state"] == JobState.RUNNING]
            except (RpcError, TimeoutError):
                running = []  # the JobManager is shutting down: its exit says how it ended
            if running:
                return running[0]
            if time.monotonic() > deadline:
                raise click.ClickException(f"no job of the application running after the timeout; "
                                           f"it goes on in {info.cluster_dir}")
            time.sleep(0.1)
        return None
    finally:
        client.close()


def _report_end(jobmanager, cluster_dir: Path) -> int:
    """Print how the application ended (its jobs' final states, the failure) and return the exit code."""
    code = jobmanager.wait()
    result_file = cluster_dir / launch.RESULT_FILE
    if result_file.exists():
        outcome = json.loads(result_file.read_text())
        for job in outcome["jobs"]:
            click.echo(f"Job '{job['name']}' ({job['jid']}) {job['state']}")
            if job["failure"]:
                click.echo(job["failure"], err=True)
        if outcome["error"]:
            click.echo(f"The application ended with an error: {outcome['error']}", err=True)
    else:
        click.echo(launch.exit_report(jobmanager, cluster_dir, "jobmanager"), err=True)
    click.echo(f"Application ended, JobManager exit code {code}; main()'s output is in "
               f"{launch.log_path(cluster_dir, 'jobmanager', '.out')}")
    for leftover in ("jobmanager.json", processes.PIDS_FILE):
        (cluster_dir / leftover).unlink(missing_ok=True)
    return code
