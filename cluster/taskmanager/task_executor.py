"""TaskExecutor: the TaskManager process's endpoint.

It registers its slots with the ResourceManager (retrying until it is heard), heartbeats with
per-task metrics, accepts slot requests (offering the slot to the job's JobMaster), runs each
deployed task as a thread, reports task states, and cancels and frees on request. A task that
fails takes only its job down: the TaskExecutor reports and frees, and keeps serving.

Cancelling follows Flink's Task: the task's flag is set, the thread is interrupted (as far as
Python can: inside a user's function) at once and every ``task.cancellation.interval``, and a
task still running after ``task.cancellation.timeout`` is a fatal error of the TaskManager. Python
cannot kill a thread, so the process disconnects and re-executes itself (same pid, fresh id): its
slots come back, and the JobMaster sees the task gone at once.

The ResourceManager answers each heartbeat; silence for ``heartbeat.timeout`` means the JobManager
is lost: every task is cancelled, every slot freed, and the TaskExecutor registers again.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import psutil

from cluster.checkpoint.barriers import Barrier
from cluster.conf import Configuration, TaskConfig
from cluster.ha.services import ha_enabled
from cluster.common.launch import add_owner_arguments
from cluster.common.lifecycle import HARD_EXIT_AFTER_S, StopRequest, exit_within, follow_owner
from cluster.common.process_logging import configure_process_logging
from cluster.graph.deployment import TaskDeploymentDescriptor
from cluster.protocol.states import ExecutionState
from cluster.protocol import messages as m
from cluster.protocol.auth import load_secret
from cluster.protocol.curve import cluster_codec
from cluster.protocol.endpoint import Peer, RpcEndpoint
from cluster.protocol.gateways import JobManagerGateway

from cluster.spark.runner import SparkRunner

from cluster.taskmanager.network import NetworkEnvironment
from cluster.taskmanager.slot_table import (CancelTaskThread, ForgetTask, OfferSlot, ReleaseJobNetwork, ReportTaskState, StartTask, TaskSlotTable)
from cluster.taskmanager.stream_task import StreamTask
from cluster.conf.options import HeartbeatManagerOptions, HighAvailabilityOptions, MetricOptions, SparkOptions, TaskManagerOptions

log = logging.getLogger("streamlab.taskmanager")
REGISTRATION_RETRY_S = 1.0
FATAL_DISCONNECT_GRACE_S = 0.2  # for the disconnect to leave before the process re-executes


def hardware_info() -> dict:
    vm = psutil.virtual_memory()
    return {"cpuCores": os.cpu_count() or 1, "physicalMemory": vm.total, "freeMemory": vm.available}


class TaskExecutor:
    def __init__(self, conf: Configuration, secret: bytes, jobmanager_address: str, spark_config: TaskConfig,
                 task_manager_id: Optional[str] = None):
        self.conf = conf
        self.spark_config = spark_config  # prepare_spark's
        self.task_manager_id = task_manager_id or f"tm-{uuid.uuid4().hex[:12]}"
        codec = cluster_codec(conf, secret)
        self.endpoint = RpcEndpoint(self.task_manager_id, codec)
        self.jobmanager_address = jobmanager_address
        self._jobmanager_peer = self.endpoint.connect_dealer(jobmanager_address, self.task_manager_id.encode())
        self.jobmanager = JobManagerGateway(self.endpoint, self._jobmanager_peer)
        self.slot_table = TaskSlotTable(conf["taskmanager.numberOfTaskSlots"])
        self.network = NetworkEnvironment(conf.get(TaskManagerOptions.HOST), conf.get(TaskManagerOptions.DATA_PORT), codec,
                                          conf.get(TaskManagerOptions.NETWORK_BUFFERS_PER_CHANNEL),
                                          bind_host=conf.get(TaskManagerOptions.BIND_HOST))
        self.tasks: dict[str, StreamTask] = {}  # the threads of the table's tasks
        # writes checkpoint files while the tasks go on processing (the asynchronous part)
        self.snapshot_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="snapshot")
        self.registered = False
        self._heartbeating = False
        self._last_heard_from_rm = time.monotonic()  # registration or the last heartbeat answer
        self._registration_id = uuid.uuid4().hex  # this round of registration (RegisterTaskManager)
        self.heartbeat_timeout_s = conf.get(HeartbeatManagerOptions.HEARTBEAT_TIMEOUT) / 1000
        self.cancellation_interval_s = conf.get(TaskManagerOptions.TASK_CANCELLATION_INTERVAL) / 1000
        self.cancellation_timeout_s = conf.get(TaskManagerOptions.TASK_CANCELLATION_TIMEOUT) / 1000
        self._cancelling: set[str] = set()  # execution ids whose interrupter and watchdog run
        self.stopped = threading.Event()
        self.handlers: dict[type, Callable[[Any, Peer], Optional[m.Message]]] = {
            m.RegistrationSuccess: self.registration_success,
            m.RegistrationRejected: self.registration_rejected,
            m.RequestRegistration: self.request_registration,
            m.HeartbeatFromResourceManager: self.heartbeat_from_resource_manager,
            m.RequestSlot: self.request_slot,
            m.SubmitTask: self.submit_task,
            m.CancelTask: self.cancel_task,
            m.FreeSlot: self.free_slot,
            m.TriggerCheckpoint: self.trigger_checkpoint,
            m.NotifyCheckpointComplete: self.notify_checkpoint_complete,
            m.NotifyCheckpointAborted: self.notify_checkpoint_aborted,
            m.ShutdownTaskManager: self.shutdown_task_manager,
        }
        self.endpoint.handlers.update(self.handlers)

    def start(self) -> None:
        self.network.start()
        self.endpoint.start()
        self.endpoint.call_soon(self._register)
        # a heartbeat at once when its SparkSession queues, starts or is ready: the ResourceManager
        # gives slots to the TaskManagers furthest along (slot_manager.SPARK_ORDER)
        SparkRunner.on_phase = lambda phase: self.endpoint.call_soon(self._heartbeat)
        # a JVM that ended leaves every Spark task here failing: start again, with a new one
        SparkRunner.on_lost = lambda reason: self.endpoint.call_soon(self.fatal_error, reason)

    def stop(self, reason: str = "shut down") -> None:
        if self.stopped.is_set():
            return
        for task in list(self.tasks.values()):
            task.cancel()
        try:
            self.endpoint.call(lambda: self.jobmanager.disconnect_task_manager(self.task_manager_id, reason),
                               timeout=2)
        except Exception:
            pass
        try:
            self.endpoint.stop()
            self.network.stop()
            runner = SparkRunner.running()
            if runner is not None:
                runner.stop()
        finally:  # whatever failed above, the process ends (main waits for this)
            self.stopped.set()

    # ------------------------------------------------------------------ registration, heartbeats
    def _register(self) -> None:
        if self.registered or self.stopped.is_set():
            return
        self.jobmanager.register_task_manager(self.task_manager_id, self.network.data_address,
                                              len(self.slot_table), os.getpid(), hardware_info(),
                                              self._registration_id, SparkRunner.phase_now())
        self.endpoint.call_later(REGISTRATION_RETRY_S, self._register)

    def registration_success(self, msg: m.RegistrationSuccess, peer: Peer) -> None:
        if not self.registered:
            log.info("%s registered at the ResourceManager", self.task_manager_id)
        self.registered = True
        self._last_heard_from_rm = time.monotonic()
        if not self._heartbeating:
            self._heartbeating = True
            self._heartbeat()  # its SparkSession's phase, before a first job asks for slots
            # the heartbeat carries the task metrics, so it goes at least as often as they are due
            interval_ms = min(msg.heartbeat_interval_ms, self.conf.get(MetricOptions.METRIC_FETCHER_UPDATE_INTERVAL))
            self.endpoint.call_every(interval_ms / 1000, self._heartbeat)
            threading.Thread(target=self._sample_metrics, args=(interval_ms / 1000,), name="metrics",
                             daemon=True).start()
            self.endpoint.call_every(min(1.0, self.heartbeat_timeout_s / 4), self._check_job_manager)

    def registration_rejected(self, msg: m.RegistrationRejected, peer: Peer) -> None:
        log.error("registration rejected: %s", msg.reason)

    def request_registration(self, msg: m.RequestRegistration, peer: Peer) -> None:
        if self.registered:
            # it declared us lost, so its JobMasters count our tasks as gone: they must not go on
            log.warning("the ResourceManager does not know us (any more): cancelling every task, "
                        "registering again")
            self._job_manager_lost()
        else:
            self._register()

    def heartbeat_from_resource_manager(self, msg: m.HeartbeatFromResourceManager, peer: Peer) -> None:
        self._last_heard_from_rm = time.monotonic()

    def _check_job_manager(self) -> None:
        silent = time.monotonic() - self._last_heard_from_rm
        if self.registered and silent > self.heartbeat_timeout_s:
            log.warning("JobManager lost: no heartbeat answer for %.0f ms (heartbeat.timeout %.0f ms); "
                        "cancelling %d task(s), freeing every slot, registering again",
                        silent * 1000, self.heartbeat_timeout_s * 1000, len(self.tasks))
            self._job_manager_lost()

    def _job_manager_lost(self) -> None:
        """Cancel every task, free every slot, and register again."""
        self._run(self.slot_table.job_manager_lost())
        self.registered = False
        self._registration_id = uuid.uuid4().hex  # a new round: the ResourceManager drops our old slots
        self._register()

    def follow_leader(self, address: str) -> None:
        """HA: another JobManager leads now (loop thread). The old leader's tasks are cancelled
        and its slots freed, as on its heartbeat timeout; we register at the new one, which
        redeploys its recovered jobs."""
        if address == self.jobmanager_address:
            return
        log.warning("the leading JobManager is now at %s (was %s): cancelling %d task(s), registering there",
                    address, self.jobmanager_address, len(self.tasks))
        self._jobmanager_peer.socket.disconnect(self.jobmanager_address)
        self._jobmanager_peer.socket.connect(address)
        self.jobmanager_address = address
        if self.registered:
            self._job_manager_lost()

    def _heartbeat(self) -> None:
        if self.registered:
            self.jobmanager.heartbeat_from_task_manager(
                self.task_manager_id, [t.last_metrics for t in self.tasks.values()], SparkRunner.phase_now())

    def _sample_metrics(self, interval_s: float) -> None:
        """The metrics thread: each task's figures, for the heartbeats. Not on the loop: a Spark
        chain's figures ask its JVM, and a JVM busy collecting its heap, or gone, held the loop
        and so the heartbeats (the ResourceManager judged a live TaskManager lost)."""
        while not self.stopped.wait(interval_s):
            try:
                tasks = self.endpoint.call(lambda: list(self.tasks.values()))
            except Exception:  # the loop stopping, or too busy to answer now: the next round asks again
                continue
            for task in tasks:
                task.sample_metrics()

    # ------------------------------------------------------------------ slots and tasks
    def _run(self, instructions: list, deployment: Optional[TaskDeploymentDescriptor] = None) -> None:
        """Carry out the task table's instructions (loop thread only)."""
        self.endpoint.assert_loop_thread()
        for i in instructions:
            if isinstance(i, OfferSlot):
                self.jobmanager.offer_slots(self.task_manager_id, i.job_id, [i.allocation_id])
            elif isinstance(i, StartTask):
                if deployment is None:
                    raise ValueError(f"StartTask for execution {i.execution_id} without its deployment descriptor")
                task = StreamTask(deployment, self.network, self._report_from_task, self, self.snapshot_executor)
                self.tasks[i.execution_id] = task
                task.start()
            elif isinstance(i, CancelTaskThread):
                self._cancel(self.tasks[i.execution_id])
            elif isinstance(i, ForgetTask):
                self.tasks.pop(i.execution_id, None)
            elif isinstance(i, ReportTaskState):
                reporting = self.tasks.get(i.execution_id)
                metrics = reporting.reported_metrics if reporting is not None else {}
                if i.state == ExecutionState.FAILED:
                    log.warning("task %s failed:\n%s", reporting.name if reporting else i.execution_id, i.error)
                self.jobmanager.update_task_execution_state(i.job_id, i.execution_id, i.state, i.error, metrics)
                if i.state in ExecutionState.TERMINAL:
                    self.tasks.pop(i.execution_id, None)
            elif isinstance(i, ReleaseJobNetwork):
                self.network.release_job(i.job_id)

    # ------------------------------------------------------------------ cancellation
    def _cancel(self, task: StreamTask) -> None:
        """Flink's TaskCanceler, TaskInterrupter and TaskCancelerWatchDog, on the loop's timers."""
        task.cancel()
        if task.execution_id in self._cancelling:
            return
        self._cancelling.add(task.execution_id)
        task.interrupt()
        self.endpoint.call_later(self.cancellation_interval_s, self._interrupt_again, task)
        if self.cancellation_timeout_s > 0:
            self.endpoint.call_later(self.cancellation_timeout_s, self._cancellation_timed_out, task)

    def _interrupt_again(self, task: StreamTask) -> None:
        if not task.is_alive():
            self._cancelling.discard(task.execution_id)
            return
        if task.interrupt():
            log.info("task %s still running after cancel: interrupt raised in its user function "
                     "(not seen while it is blocked in C code or a sleep)", task.name)
        self.endpoint.call_later(self.cancellation_interval_s, self._interrupt_again, task)

    def _cancellation_timed_out(self, task: StreamTask) -> None:
        if task.is_alive():
            self.fatal_error(f"task {task.name} ({task.execution_id}) did not stop within "
                             f"{self.cancellation_timeout_s * 1000:.0f} ms of its cancel (task.cancellation.timeout)")

    def fatal_error(self, reason: str) -> None:
        """Flink's onFatalError: this process cannot go on. A thread cannot be killed, so the
        process replaces itself: disconnect (the JobMaster fails our tasks at once), then
        re-execute the same command line with a fresh id, which registers all its slots anew."""
        self.endpoint.assert_loop_thread()
        log.critical("fatal error, restarting the TaskManager process: %s", reason)
        self.jobmanager.disconnect_task_manager(self.task_manager_id, f"fatal error: {reason}")
        self.registered = False
        self.endpoint.call_later(FATAL_DISCONNECT_GRACE_S, self._reexecute)

    def _reexecute(self) -> None:
        argv = restart_command_line(sys.orig_argv, f"tm-{uuid.uuid4().hex[:12]}")
        log.critical("re-executing as %s", argv[argv.index("--id") + 1])
        logging.shutdown()
        # file descriptors other than 0-2 are close-on-exec (sockets, the Spark JVM's stdin pipe,
        # so that JVM exits too); the stuck threads end with the old program
        os.execv(sys.executable, [sys.executable, *argv[1:]])

    def request_slot(self, msg: m.RequestSlot, peer: Peer) -> None:
        instructions = self.slot_table.request_slot(msg.slot_index, msg.job_id, msg.allocation_id)
        if not instructions:
            log.warning("slot %d requested for job %s is not free", msg.slot_index, msg.job_id)
        self._run(instructions)

    def submit_task(self, msg: m.SubmitTask, peer: Peer) -> None:
        try:
            tdd = TaskDeploymentDescriptor.from_dict(msg.deployment)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("malformed task deployment dropped: %s", exc)
            return
        self._run(self.slot_table.submit_task(tdd.job_id, tdd.execution_id, tdd.allocation_id), tdd)

    def cancel_task(self, msg: m.CancelTask, peer: Peer) -> None:
        self._run(self.slot_table.cancel_task(msg.execution_id))

    def free_slot(self, msg: m.FreeSlot, peer: Peer) -> None:
        self._run(self.slot_table.free_slot(msg.allocation_id))

    # ------------------------------------------------------------------ checkpoints
    def trigger_checkpoint(self, msg: m.TriggerCheckpoint, peer: Peer) -> None:
        task = self.tasks.get(msg.execution_id)
        if task is None:
            self.jobmanager.decline_checkpoint(msg.job_id, msg.execution_id, msg.checkpoint_id,
                                               f"task {msg.execution_id} is not running on {self.task_manager_id}")
            return
        task.trigger_checkpoint(Barrier.of(msg))

    def notify_checkpoint_complete(self, msg: m.NotifyCheckpointComplete, peer: Peer) -> None:
        for task in self._tasks_of(msg.job_id):
            task.notify_checkpoint_complete(msg.checkpoint_id)

    def notify_checkpoint_aborted(self, msg: m.NotifyCheckpointAborted, peer: Peer) -> None:
        for task in self._tasks_of(msg.job_id):
            task.notify_checkpoint_aborted(msg.checkpoint_id)

    def _tasks_of(self, job_id: str) -> list[StreamTask]:
        return [self.tasks[e] for e in self.slot_table.tasks_of(job_id) if e in self.tasks]

    # the CheckpointResponder of the tasks: any thread; the loop thread owns the socket
    def acknowledge_checkpoint(self, task: StreamTask, checkpoint_id: int, state: dict) -> None:
        self.endpoint.call_soon(self.jobmanager.acknowledge_checkpoint, task.tdd.job_id, task.execution_id,
                                checkpoint_id, state)

    def decline_checkpoint(self, task: StreamTask, checkpoint_id: int, reason: str) -> None:
        self.endpoint.call_soon(self.jobmanager.decline_checkpoint, task.tdd.job_id, task.execution_id,
                                checkpoint_id, reason)

    def end_of_input(self, task: StreamTask) -> None:
        self.endpoint.call_soon(self.jobmanager.end_of_input, task.tdd.job_id, task.execution_id)

    def shutdown_task_manager(self, msg: m.ShutdownTaskManager, peer: Peer) -> None:
        threading.Thread(target=self.stop, args=("the cluster is shutting down",), daemon=True).start()

    def _report_from_task(self, task: StreamTask, state: ExecutionState, error: Optional[str]) -> None:
        # Called on the task's thread: hand over to the loop thread, which owns the table and socket.
        self.endpoint.call_soon(lambda: self._run(self.slot_table.task_state_changed(task.execution_id, state,
                                                                                     error)))


def restart_command_line(argv: list[str], new_id: str) -> list[str]:
    """The command line the process started with, under a fresh TaskManager id: the ResourceManager
    must not take the restarted process for the one that failed."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--id":
            skip = True
        elif not arg.startswith("--id="):
            out.append(arg)
    return [*out, "--id", new_id]


def prepare_spark(conf: Configuration, cluster_dir: Path) -> TaskConfig:
    """The TaskManager's SparkRunner settings and, with taskmanager.spark.startup eager, its session
    started (in the background): before the TaskManager looks for its JobManager, so that its JVM
    starts while the JobManager does, and its registration says whether it starts or waits its turn."""
    SparkRunner.lock_dir = cluster_dir  # JVM starts of this machine's TaskManagers take turns
    config = SparkRunner.taskmanager_config = TaskConfig.from_configuration(conf)
    if conf.get(SparkOptions.STARTUP) == "eager":
        SparkRunner.get(config)
    return config


def published_address(path: Path, timeout_s: float = 120.0) -> str:
    """The JobManager's address from its jobmanager.json, waiting for it: a local cluster starts
    its TaskManagers beside its JobManager (kernel_runtime.deploy.local)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return json.loads(path.read_text())["rpc"]
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise SystemExit(f"no JobManager published its address in {path} within {timeout_s:g} s")
            time.sleep(0.02)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.taskmanager")
    parser.add_argument("--cluster-dir", required=True, type=Path)
    parser.add_argument("--jobmanager", help="JobManager address (default: from the cluster dir); zk: the leader in "
                        "ZooKeeper (the cluster dir's high-availability.* keys), followed on every change")
    parser.add_argument("--id", help="TaskManager id (default: a random one)")
    parser.add_argument("--log-file", type=Path, help="rolling log file (default: stderr)")
    add_owner_arguments(parser)
    args = parser.parse_args(argv)
    follow_owner(args.owner_pid, args.parent_death_signal)
    conf = Configuration.from_file(args.cluster_dir / "config.yaml")
    configure_process_logging(args.log_file, conf)
    spark_config = prepare_spark(conf, args.cluster_dir)
    leader = None
    if args.jobmanager == "zk" or ha_enabled(conf):
        # the leader's address comes from ZooKeeper, and again on every change of leader
        from cluster.ha.services import LeaderRetriever
        leader = LeaderRetriever(conf)
        address = args.jobmanager if args.jobmanager not in (None, "zk") else leader.leader(
            conf.get(HighAvailabilityOptions.ZOOKEEPER_CONNECTION_TIMEOUT) / 1000 + 60)["rpc"]
    else:
        address = args.jobmanager or published_address(args.cluster_dir / "jobmanager.json")
    tm = TaskExecutor(conf, load_secret(args.cluster_dir / "secret"), address, spark_config, args.id)
    stop = StopRequest(args.owner_pid)
    stop.install()
    tm.start()
    gc.freeze()  # the modules and the TaskManager's own objects: full collections skip them (see SparkRunner)
    if leader is not None:
        leader.on_change = lambda info: tm.endpoint.call_soon(tm.follow_leader, info["rpc"])
        tm.endpoint.call_soon(tm.follow_leader, leader.leader()["rpc"])  # a change before the line above
    log.info("TaskManager %s with %d slots, data at %s", tm.task_manager_id, len(tm.slot_table),
             tm.network.data_address)
    reason = stop.wait(tm.stopped)
    if reason is not None:
        log.info("TaskManager %s stopping: %s", tm.task_manager_id, reason)
        exit_within(HARD_EXIT_AFTER_S, f"TaskManager {tm.task_manager_id}")
        tm.stop(reason)
    log.info("TaskManager %s stopped", tm.task_manager_id)
