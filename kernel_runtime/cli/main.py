"""The ``streamlab`` command: cluster start/stop/status, run, list, cancel."""
from __future__ import annotations

import os
import runpy
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from cluster.conf import ConfigError
from cluster.protocol.endpoint import RpcError

from cluster.protocol.job_context import (CONTEXT_ALLOW_NON_RESTORED, CONTEXT_CLUSTER_DIR, CONTEXT_DETACHED,
                                          CONTEXT_DRY_RUN, CONTEXT_SAVEPOINT, CONTEXT_VERBOSE)
from kernel_runtime.cli.options import dynamic_option, dynamic_properties
from kernel_runtime.client.job_client import JobClient
from kernel_runtime.client.job_handle import JobCancelledError, JobExecutionError
from kernel_runtime.client.cluster_info import ClusterInfo, ClusterNotRunning, default_cluster_dir
from kernel_runtime.deploy.local import LocalCluster, stop_cluster

# off a terminal rich would wrap at 80 columns and split job ids; scripts read this output
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
cluster_dir_option = click.option(
    "--cluster-dir", type=click.Path(path_type=Path), default=None,
    help="The cluster's directory (default: $STREAMLAB_CLUSTER_DIR or ~/.streamlab/cluster).")


@contextmanager
def connected(cluster_dir):
    """A JobClient for the command; expected failures become one-line errors, not tracebacks."""
    try:
        client = JobClient(ClusterInfo.load(cluster_dir))
    except ClusterNotRunning as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield client
    except (RpcError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()


@click.group()
def main() -> None:
    """streamlab: Flink's streaming runtime in Python, with Spark for the data work."""


@main.group()
def cluster() -> None:
    """Start, stop and inspect a standing local session cluster."""


@cluster.command("start")
@click.option("--taskmanagers", "-n", default=1, show_default=True, help="Number of TaskManagers.")
@click.option("--slots", "-s", default=1, show_default=True, help="Slots per TaskManager.")
@click.option("--ha", is_flag=True,
              help="High availability with ZooKeeper: several JobManagers, one leads, the others stand by; "
                   "a ZooKeeper of the cluster's own unless high-availability.zookeeper.quorum is configured.")
@click.option("--jobmanagers", type=click.IntRange(min=1), default=None,
              help="Number of JobManagers (with --ha; default 2).")
@click.option("--config", "-c", "config_file", type=click.Path(exists=True, path_type=Path),
              help="A YAML file of configuration keys (Flink's names).")
@dynamic_option
@cluster_dir_option
def cluster_start(taskmanagers, slots, ha, jobmanagers, config_file, dynamic, cluster_dir) -> None:
    import yaml
    config = yaml.safe_load(config_file.read_text()) if config_file else {}
    config.update(dynamic_properties(dynamic))
    try:
        local = LocalCluster(cluster_dir, taskmanagers=taskmanagers, slots=slots, config=config,
                             ha=ha, jobmanagers=jobmanagers or (2 if ha else 1))
        local.start()
    except (ConfigError, RuntimeError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    if local.ended_stale:
        console.print(f"Ended {len(local.ended_stale)} stale process(es) of a previous cluster in "
                      f"{local.cluster_dir}: pids {', '.join(map(str, local.ended_stale))}")
    console.print(f"Cluster started in {local.cluster_dir}: JobManager {local.info.rpc_address}, "
                  f"REST {local.info.rest_address}, {taskmanagers} TaskManager(s) x {slots} slot(s)")
    if local.ha:
        leader = local.jobmanager
        assert leader is not None  # started
        standbys = ", ".join(str(p.pid) for p in local.standbys) or "none"
        own = f" (the cluster's own, in {local.cluster_dir / 'zookeeper'})" if local.own_zookeeper else ""
        console.print(f"High availability: leader pid {leader.pid}, standby JobManager pid(s) {standbys}; "
                      f"ZooKeeper {local.quorum}{own}, cluster-id "
                      f"{local.conf['high-availability.cluster-id']}")


@cluster.command("stop")
@cluster_dir_option
def cluster_stop(cluster_dir) -> None:
    directory = cluster_dir or default_cluster_dir()
    if stop_cluster(directory):
        console.print(f"Cluster in {directory} stopped")
    else:
        console.print(f"No cluster in {directory}")


@cluster.command("status")
@cluster_dir_option
def cluster_status(cluster_dir) -> None:
    with connected(cluster_dir) as client:
        ov = client.cluster_overview()
    o = ov.overview
    console.print(f"JobManager {client.cluster.rpc_address}  REST {client.cluster.rest_address}")
    console.print(f"TaskManagers: {o['taskmanagers']}  slots: {o['slots-available']} free of "
                  f"{o['slots-total']}  jobs running: {o['jobs-running']}  finished: {o['jobs-finished']}  "
                  f"cancelled: {o['jobs-cancelled']}  failed: {o['jobs-failed']}")
    table = Table("TaskManager", "data address", "slots", "free", "tasks")
    for tm in ov.taskmanagers:
        table.add_row(tm["id"], tm["path"], str(tm["slotsNumber"]), str(tm["freeSlots"]), str(tm["assignedTasks"]))
    console.print(table)


@cluster.command("rest-token")
@cluster_dir_option
def cluster_rest_token(cluster_dir) -> None:
    """Print the REST API's bearer token (for curl, or Flink's client via FLINK_REST_CLIENT_HEADERS)."""
    try:
        info = ClusterInfo.load(cluster_dir)
    except ClusterNotRunning as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(info.rest_token)


@main.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--detached", "-d", is_flag=True, help="Submit and return the job id.")
@click.option("--fromSavepoint", "-s", "savepoint", help="Start from this savepoint (or retained checkpoint).")
@click.option("--allowNonRestoredState", "--allow-non-restored-state", "-n", "allow_non_restored", is_flag=True,
              help="Start from the savepoint even if some of its state fits no operator of the job: leave it out.")
@click.option("--dry-run", is_flag=True,
              help="With -s: print what starting from the savepoint would do with each operator's state "
                   "(restored, started empty, dropped, refused) and submit nothing; exit 1 if it would be refused.")
@cluster_dir_option
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(detached, savepoint, allow_non_restored, dry_run, cluster_dir, script, args) -> None:
    """Run a job script on the cluster (as `flink run`): its execute() submits there."""
    info = ClusterInfo.load(cluster_dir) if cluster_dir else None
    try:
        info = info or ClusterInfo.load()
    except ClusterNotRunning as exc:
        raise click.ClickException(str(exc)) from None
    os.environ[CONTEXT_CLUSTER_DIR] = str(info.cluster_dir)
    os.environ[CONTEXT_DETACHED] = "1" if detached else "0"
    os.environ[CONTEXT_VERBOSE] = "1"
    if allow_non_restored and not savepoint:
        raise click.UsageError("--allow-non-restored-state (-n) goes with --fromSavepoint (-s)")
    if dry_run and not savepoint:
        raise click.UsageError("--dry-run previews a start from a savepoint: give --fromSavepoint (-s)")
    os.environ[CONTEXT_DRY_RUN] = "1" if dry_run else "0"
    if savepoint:
        os.environ[CONTEXT_SAVEPOINT] = savepoint
        os.environ[CONTEXT_ALLOW_NON_RESTORED] = "1" if allow_non_restored else "0"
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent.resolve()))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except (JobExecutionError, JobCancelledError, RpcError) as exc:
        # a failed job: its cause, then the user's traceback (no client frames)
        raise click.ClickException(exc.failure if isinstance(exc, JobExecutionError) else str(exc)) from None


@main.command("list")
@cluster_dir_option
def list_jobs(cluster_dir) -> None:
    """List the cluster's jobs."""
    with connected(cluster_dir) as client:
        jobs = client.list_jobs()
    table = Table("JobID", "name", "state", "started", "reason")
    for job in jobs:
        started = datetime.fromtimestamp(job["start-time"] / 1000).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(job["jid"], job["name"], job["state"], started, job["reason"] or "")
    console.print(table if jobs else "No jobs.")


@main.command("cancel")
@click.argument("job_id")
@cluster_dir_option
def cancel(job_id, cluster_dir) -> None:
    """Cancel a job."""
    with connected(cluster_dir) as client:
        client.cancel(job_id)
    console.print(f"Cancelling job {job_id}")


@main.command("savepoint")
@click.argument("job_id", required=False)
@click.argument("target_directory", required=False)
@click.option("--dispose", "-d", "dispose", metavar="PATH", help="Delete this savepoint instead.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for it.")
@cluster_dir_option
def savepoint(job_id, target_directory, dispose, timeout, cluster_dir) -> None:
    """Take a savepoint of a running job (or dispose of one), as `flink savepoint`."""
    if bool(job_id) == bool(dispose):
        raise click.UsageError("give a JOB_ID, or --dispose PATH")
    with connected(cluster_dir) as client:
        if dispose:
            client.dispose_savepoint(dispose)
            console.print(f"Savepoint {dispose} disposed")
        else:
            location = client.trigger_savepoint(job_id, target_directory, timeout=timeout)
            console.print(f"Savepoint completed. Path: file:{location}")


@main.command("stop")
@click.argument("job_id")
@click.option("--savepointPath", "-p", "target_directory", help="Where the final savepoint goes.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for it.")
@cluster_dir_option
def stop(job_id, target_directory, timeout, cluster_dir) -> None:
    """Stop a job with a savepoint (it ends FINISHED), as `flink stop`."""
    with connected(cluster_dir) as client:
        location = client.trigger_savepoint(job_id, target_directory, stop=True, timeout=timeout)
    console.print(f"Savepoint completed. Path: file:{location}")


# each command module registers here (issue 11's design: one line per part, no merge knots)
from kernel_runtime.cli.application import run_application  # noqa: E402
from kernel_runtime.cli.export import export  # noqa: E402
from kernel_runtime.cli.kafka import kafka  # noqa: E402
from kernel_runtime.cli.standalone import add_standalone_commands  # noqa: E402

main.add_command(export)
main.add_command(run_application)
main.add_command(kafka)
add_standalone_commands(main)

if __name__ == "__main__":
    main()
