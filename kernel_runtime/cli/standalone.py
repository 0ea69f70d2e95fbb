"""``streamlab jobmanager|taskmanager start|start-foreground|stop``: Flink's jobmanager.sh and
taskmanager.sh, so a cluster can be assembled process by process, on several hosts or in
containers (the Kubernetes manifests of cluster/k8s run ``start-foreground``).

Each process runs from a cluster directory (``--cluster-dir``): ``-c config.yaml`` and ``-D
key=value`` become its config.yaml, ``--secret-file`` is copied in as its secret (0600). A JobManager
makes a new secret only when it is given none and its directory has none; every TaskManager needs
the JobManager's. ``start`` runs the process in the background and records its pid in the
directory's cluster.json; ``stop`` ends the processes of that role recorded there.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Optional

import click

from cluster.common import launch
from cluster.conf import ConfigError, Configuration
from cluster.protocol.auth import create_secret, parse_secret, write_secret
from cluster.conf.options import HighAvailabilityOptions

from kernel_runtime.deploy import processes
from kernel_runtime.cli.options import dynamic_option, dynamic_properties
from kernel_runtime.client.cluster_info import ClusterInfo, default_cluster_dir
from kernel_runtime.deploy.local import published_pid, standing_by, wait_for_jobmanager

START_TIMEOUT_S = 60.0
REGISTERED = "registered at the ResourceManager"  # the TaskManager's log line once it is


def jobmanager_address(value: str) -> str:
    """``HOST:PORT`` (a host name, e.g. a Kubernetes Service, or an address) as a ZeroMQ
    endpoint. ZeroMQ resolves a name when it connects, and again on each reconnect."""
    match = re.fullmatch(r"(?:tcp://)?(?P<host>[^\s:/]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})", value.strip())
    if not match or not 0 < int(match["port"]) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. jobmanager-host:6123)",
                                 param_hint="--jobmanager")
    return f"tcp://{match['host']}:{match['port']}"


def process_configuration(cluster_dir: Path, config_file: Optional[Path], dynamic: tuple[str, ...]) -> Configuration:
    """The configuration a process started from ``cluster_dir`` gets: ``-c`` (else the directory's
    config.yaml), then ``-D``."""
    existing = cluster_dir / "config.yaml"
    try:
        if config_file is not None:
            conf = Configuration.from_file(config_file)
        elif existing.exists():  # a JobManager and TaskManagers on one host share one directory
            conf = Configuration.from_file(existing)
        else:
            conf = Configuration()
        conf.update(dynamic_properties(dynamic), "-D")
    except (ConfigError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    return conf


def prepare_cluster_dir(cluster_dir: Path, config_file: Optional[Path], secret_file: Optional[Path],
                        dynamic: tuple[str, ...], may_create_secret: bool) -> Configuration:
    """Write the process's config.yaml and secret into ``cluster_dir``; return the configuration."""
    conf = process_configuration(cluster_dir, config_file, dynamic)
    cluster_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (cluster_dir / "log").mkdir(mode=0o700, exist_ok=True)
    conf.write(cluster_dir / "config.yaml")
    secret_path = cluster_dir / "secret"
    if secret_file is not None:
        # A Kubernetes Secret volume file is group-readable (fsGroup) and owned by root: it is
        # checked as a secret, and the directory's copy is the owner's alone (0600).
        try:
            write_secret(secret_path, parse_secret(secret_file.read_text(), secret_file))
        except (OSError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    elif not secret_path.exists():
        if not may_create_secret:
            raise click.ClickException(
                f"no cluster secret in {cluster_dir}: give the JobManager's with --secret-file "
                "(a TaskManager must hold the secret of the cluster it joins)")
        create_secret(secret_path)
    return conf


def _stop(cluster_dir: Path, role: str, what: str) -> None:
    procs = processes.stale_processes(cluster_dir, role)
    # the standby JobManagers before the leader: a standby left running would win and recover
    # the jobs that stopping the leader ends
    leader = [p for p in procs if p.pid == published_pid(cluster_dir / "jobmanager.json")]
    for batch in ([p for p in procs if p not in leader], leader):
        if not processes.stop([p.pid for p in batch], timeout=10):
            raise click.ClickException(f"could not stop the {what} processes {[p.pid for p in batch]}")
    if role == "jobmanager":
        processes.record_pids(cluster_dir, keep_jobmanagers=False)
        (cluster_dir / "jobmanager.json").unlink(missing_ok=True)
    else:
        processes.record_pids(cluster_dir, keep_taskmanagers=False)
    click.echo(f"Stopped {len(procs)} {what} process(es) of {cluster_dir}" if procs
               else f"No {what} running from {cluster_dir}")


cluster_dir_option = click.option(
    "--cluster-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="The process's directory: config, secret, logs, pids (default: $STREAMLAB_CLUSTER_DIR "
         "or ~/.streamlab/cluster).")
config_option = click.option("--config", "-c", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                             help="A YAML file of configuration keys (Flink's names).")
secret_option = click.option("--secret-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                             help="The cluster secret (hex) to use; copied into the cluster directory.")
timeout_option = click.option("--timeout", default=START_TIMEOUT_S, show_default=True,
                              help="Seconds to wait for the process to be up.")


# ---------------------------------------------------------------------- jobmanager
@click.group()
def jobmanager() -> None:
    """Start or stop a JobManager on this host (Flink's jobmanager.sh)."""


def _prepare_jobmanager(cluster_dir, config_file, secret_file, dynamic) -> tuple[Path, Configuration, str]:
    """The JobManager's directory, configuration and log name. With high availability several
    JobManagers may run from one directory (one leads, the others stand by), each its own log."""
    cluster_dir = (cluster_dir or default_cluster_dir()).resolve()
    ha = process_configuration(cluster_dir, config_file, dynamic).get(HighAvailabilityOptions.HA_MODE) == "zookeeper"
    # by its command line, not only a live pid: a container restarted in its pod keeps the
    # emptyDir, and the pid its JobManager had (1) is now this process's
    running = processes.stale_processes(cluster_dir, "jobmanager")
    if running and not ha:
        raise click.ClickException(f"a JobManager (pid {running[0].pid}) is already running from {cluster_dir}; "
                                   "stop it first (streamlab jobmanager stop)")
    conf = prepare_cluster_dir(cluster_dir, config_file, secret_file, dynamic, may_create_secret=True)
    name = "jobmanager"
    if running:
        index = 1
        while launch.log_path(cluster_dir, f"jobmanager-{index}").exists():
            index += 1
        name = f"jobmanager-{index}"
    else:  # a leader's jobmanager.json is the running one's to replace
        (cluster_dir / "jobmanager.json").unlink(missing_ok=True)
    return cluster_dir, conf, name


def _wait_for_ha_jobmanager(cluster_dir: Path, conf: Configuration, proc: subprocess.Popen, name: str,
                            timeout: float) -> str:
    """Until the HA JobManager ``proc`` leads (its jobmanager.json) or stands by (it joined the
    election and ZooKeeper names another leader): what to say about it."""
    from kernel_runtime.client.leader import LeaderWatch
    deadline = time.monotonic() + timeout
    retriever = None
    try:
        while True:
            if published_pid(cluster_dir / "jobmanager.json") == proc.pid:
                info = ClusterInfo.load(cluster_dir)
                return f"leader, rpc {info.rpc_address}, REST {info.rest_address}"
            if retriever is None and standing_by(cluster_dir, name):
                retriever = LeaderWatch.of(conf)  # ZooKeeper answers: the JobManager reached it
            if retriever is not None:
                try:
                    leader = retriever.leader(timeout=0.1)
                except TimeoutError:
                    leader = {}
                if leader.get("pid") not in (None, proc.pid):
                    return f"standby, the leader is at rpc {leader['rpc']} (pid {leader['pid']})"
            if proc.poll() is not None:
                raise RuntimeError(launch.exit_report(proc, cluster_dir, name))
            if time.monotonic() > deadline:
                raise TimeoutError(f"the JobManager neither leads nor stands by within {timeout:g} s; "
                                   f"see {launch.log_path(cluster_dir, name)}")
            time.sleep(0.05)
    finally:
        if retriever is not None:
            retriever.release()


@jobmanager.command("start")
@cluster_dir_option
@config_option
@secret_option
@dynamic_option
@timeout_option
def jobmanager_start(cluster_dir, config_file, secret_file, dynamic, timeout) -> None:
    """Start a JobManager in the background; return once it listens (with high availability:
    once it leads, or stands by for leadership)."""
    cluster_dir, conf, name = _prepare_jobmanager(cluster_dir, config_file, secret_file, dynamic)
    proc = launch.spawn("cluster.jobmanager", name, cluster_dir)
    processes.record_pids(cluster_dir, add_jobmanagers=[proc.pid])
    try:
        if conf.get(HighAvailabilityOptions.HA_MODE) == "zookeeper":
            state = _wait_for_ha_jobmanager(cluster_dir, conf, proc, name, timeout)
        else:
            info = wait_for_jobmanager(cluster_dir, proc, timeout, name)
            state = f"rpc {info.rpc_address}, REST {info.rest_address}"
    except (RuntimeError, TimeoutError) as exc:
        processes.stop([proc.pid])
        processes.record_pids(cluster_dir, drop=[proc.pid])
        raise click.ClickException(str(exc)) from None
    click.echo(f"JobManager started from {cluster_dir} (pid {proc.pid}): {state}")


@jobmanager.command("start-foreground")
@cluster_dir_option
@config_option
@secret_option
@dynamic_option
def jobmanager_start_foreground(cluster_dir, config_file, secret_file, dynamic) -> None:
    """Run a JobManager in this process (logging to stderr), as a container's main process."""
    cluster_dir, _, _ = _prepare_jobmanager(cluster_dir, config_file, secret_file, dynamic)
    processes.record_pids(cluster_dir, add_jobmanagers=[os.getpid()])  # exec keeps the pid
    launch.exec_foreground("cluster.jobmanager", cluster_dir)


@jobmanager.command("stop")
@cluster_dir_option
def jobmanager_stop(cluster_dir) -> None:
    """Stop the JobManager started from the cluster directory."""
    _stop((cluster_dir or default_cluster_dir()).resolve(), "jobmanager", "JobManager")


@jobmanager.command("create-secret")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def jobmanager_create_secret(path) -> None:
    """Write a new cluster secret to PATH (mode 0600): for --secret-file, and the file the
    Kubernetes manifests' secretGenerator reads (cluster/k8s/*/cluster-secret)."""
    if path.exists():
        raise click.ClickException(f"{path} exists; a cluster secret is not overwritten (remove it first)")
    create_secret(path)
    click.echo(f"Cluster secret written to {path}")


# ---------------------------------------------------------------------- taskmanager
FOLLOW_LEADER = "zk"  # cluster.taskmanager's --jobmanager for "the leader in ZooKeeper"


def _checked_jobmanager(ctx, param, value: Optional[str]) -> Optional[str]:
    """--jobmanager as given: checked before anything else is (the directory, its secret)."""
    return value if value is None or value.strip() == FOLLOW_LEADER else jobmanager_address(value)


@click.group()
def taskmanager() -> None:
    """Start or stop TaskManagers on this host (Flink's taskmanager.sh)."""


taskmanager_options = [
    click.option("--jobmanager", "jobmanager_at", metavar="HOST:PORT|zk", callback=_checked_jobmanager,
                 help="The JobManager's rpc address (jobmanager.rpc.address:jobmanager.rpc.port); 'zk', "
                      "the default where the configuration has high availability: the leader in ZooKeeper "
                      "(the high-availability.* keys), followed on every change."),
    cluster_dir_option, config_option, secret_option, dynamic_option,
]


def with_taskmanager_options(command):
    for option in reversed(taskmanager_options):
        command = option(command)
    return command


def taskmanager_target(jobmanager_at: Optional[str], conf: Configuration, cluster_dir: Path) -> str:
    """What a TaskManager is told to connect to: the JobManager's address (checked by
    _checked_jobmanager), or the leader that the HA keys of its configuration name (``zk``, or no
    --jobmanager on an HA cluster)."""
    ha = conf.get(HighAvailabilityOptions.HA_MODE) == "zookeeper"
    if jobmanager_at is None or jobmanager_at.strip() == FOLLOW_LEADER:
        if ha:
            return FOLLOW_LEADER
        given = "--jobmanager zk" if jobmanager_at is not None else "without --jobmanager, a TaskManager"
        raise click.UsageError(f"{given} follows the leader in ZooKeeper, but {cluster_dir / 'config.yaml'} "
                               "has high-availability.type: none; give the JobManager as --jobmanager HOST:PORT, "
                               "or the HA keys (-D high-availability.type=zookeeper "
                               "-D high-availability.zookeeper.quorum=HOST:PORT)")
    return jobmanager_at


def _taskmanager_id() -> str:
    return f"tm-{os.uname().nodename.split('.')[0]}-{os.urandom(3).hex()}"


@taskmanager.command("start")
@with_taskmanager_options
@timeout_option
def taskmanager_start(jobmanager_at, cluster_dir, config_file, secret_file, dynamic, timeout) -> None:
    """Start a TaskManager in the background; return once it registered at the JobManager."""
    cluster_dir = (cluster_dir or default_cluster_dir()).resolve()
    conf = prepare_cluster_dir(cluster_dir, config_file, secret_file, dynamic, may_create_secret=False)
    address = taskmanager_target(jobmanager_at, conf, cluster_dir)
    # several TaskManagers may share a directory: each its own log and output files
    index = 0
    while launch.log_path(cluster_dir, f"taskmanager-{index}").exists():
        index += 1
    name = f"taskmanager-{index}"
    tm_id = _taskmanager_id()
    proc = launch.spawn("cluster.taskmanager", name, cluster_dir, "--jobmanager", address, "--id", tm_id)
    processes.record_pids(cluster_dir, add_taskmanagers=[proc.pid])
    log_file = launch.log_path(cluster_dir, name)
    where = "the leader in ZooKeeper" if address == FOLLOW_LEADER else address
    deadline = time.monotonic() + timeout
    while not (log_file.exists() and REGISTERED in log_file.read_text(errors="replace")):
        if proc.poll() is not None:
            raise click.ClickException(launch.exit_report(proc, cluster_dir, name))
        if time.monotonic() > deadline:
            # as Flink's, it goes on trying (the JobManager may come later); stop ends it
            raise click.ClickException(
                f"TaskManager {tm_id} (pid {proc.pid}) did not register at {where} within "
                f"{timeout:g} s (is the JobManager up, and is the secret its?); it goes on "
                f"trying: see {log_file}, end it with: streamlab taskmanager stop --cluster-dir {cluster_dir}")
        time.sleep(0.1)
    click.echo(f"TaskManager {tm_id} started from {cluster_dir} (pid {proc.pid}), registered at {where}")


@taskmanager.command("start-foreground")
@with_taskmanager_options
def taskmanager_start_foreground(jobmanager_at, cluster_dir, config_file, secret_file, dynamic) -> None:
    """Run a TaskManager in this process (logging to stderr), as a container's main process."""
    cluster_dir = (cluster_dir or default_cluster_dir()).resolve()
    conf = prepare_cluster_dir(cluster_dir, config_file, secret_file, dynamic, may_create_secret=False)
    address = taskmanager_target(jobmanager_at, conf, cluster_dir)
    processes.record_pids(cluster_dir, add_taskmanagers=[os.getpid()])
    launch.exec_foreground("cluster.taskmanager", cluster_dir, "--jobmanager", address, "--id", _taskmanager_id())


@taskmanager.command("stop")
@cluster_dir_option
def taskmanager_stop(cluster_dir) -> None:
    """Stop every TaskManager started from the cluster directory."""
    _stop((cluster_dir or default_cluster_dir()).resolve(), "taskmanagers", "TaskManager")


def add_standalone_commands(group: click.Group) -> None:
    group.add_command(jobmanager)
    group.add_command(taskmanager)
