"""Dispatcher: accepts jobs, starts one JobMaster each, lists and cancels them.

It also routes the JobMaster's own messages (slot offers, task states) to the JobMaster of the
job they name, and keeps ended jobs with their final status (Flink's job store): without their
user code, at most ``jobstore.max-capacity`` of them, each for ``jobstore.expiration-time``.
"""
from __future__ import annotations

import logging
import shutil
from collections import OrderedDict
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Callable, Optional

from cluster.common.clock import now_ms
from cluster.checkpoint.storage import CheckpointStorage, local_path, read_metadata
from cluster.conf import ConfigError
from cluster.graph.job_graph import CLUSTER_WIDE_KEYS, JOB_SCOPED_PREFIXES, MAX_SIZE_KEY, GraphValidationError, JobGraph
from cluster.protocol import messages as m
from cluster.protocol.endpoint import DeferredReply, Peer, RpcEndpoint, RpcError

from cluster.jobmanager.jobmaster.job_master import JobMaster, find_restore_point
from cluster.jobmanager.resourcemanager.resource_manager import ResourceManager
from cluster.jobmanager.rest.views import job_json, overview_json, subtasks_json, taskmanagers_json
from cluster.conf.options import CheckpointingOptions, JobManagerOptions, StateRecoveryOptions

log = logging.getLogger(__name__)


def dispose_savepoint(directory: Path) -> None:
    """Delete a savepoint folder (storage executor); never one that is not a savepoint."""
    read_metadata(directory)
    shutil.rmtree(directory)



class Dispatcher:
    def __init__(self, endpoint: RpcEndpoint, resource_manager: ResourceManager, conf,
                 on_shutdown: Callable[[], None], storage_executor: Executor):
        self.endpoint = endpoint
        self.storage_executor = storage_executor  # every blocking disk operation, off the loop
        self.rm = resource_manager
        self.conf = conf
        self.on_shutdown = on_shutdown
        self.started_at_ms = now_ms()
        self.jobs: dict[str, JobMaster] = {}
        # ended jobs, oldest first: Flink's job store, bounded by jobstore.max-capacity and
        # jobstore.expiration-time (running jobs are never dropped)
        self.archived: OrderedDict[str, None] = OrderedDict()
        self.job_added_listeners: list[Callable[[JobMaster], None]] = []  # e.g. the event publisher
        self.ha: Optional[Any] = None  # ZooKeeperHaServices when this JobManager leads an HA cluster
        resource_manager.task_manager_lost_listeners.append(self._task_manager_lost)
        resource_manager.task_metrics_listeners.append(self._task_metrics)
        self.handlers = {
            m.SubmitJob: self.submit_job,
            m.RequestJobStatus: self.request_job_status,
            m.ListJobs: self.list_jobs,
            m.CancelJob: self.cancel_job,
            m.RequestClusterOverview: self.request_cluster_overview,
            m.RequestJobDetails: self.request_job_details,
            m.TriggerSavepoint: self.trigger_savepoint,
            m.DisposeSavepoint: self.dispose_savepoint,
            m.RequestKeyedState: self.request_keyed_state,
            m.ShutdownCluster: self.shutdown_cluster,
        }
        for op in (m.OfferSlots, m.UpdateTaskExecutionState, m.AcknowledgeCheckpoint, m.DeclineCheckpoint,
                   m.EndOfInput, m.AcknowledgeCollect):
            self.handlers[op] = self._route_to_job_master

    # ------------------------------------------------------------------ client handlers
    def submit_job(self, msg: m.SubmitJob, peer: Peer) -> DeferredReply:
        try:
            graph = JobGraph.from_dict(msg.job_graph)
            graph.check_size(self.conf[MAX_SIZE_KEY])  # for clients that do not check it themselves
        except GraphValidationError as exc:
            raise RpcError(f"job rejected: {exc}") from None
        if graph.job_id in self.jobs:
            raise RpcError(f"job rejected: a job with id {graph.job_id} exists already")
        bad = [k for k in graph.config if not k.startswith(JOB_SCOPED_PREFIXES) or k in CLUSTER_WIDE_KEYS]
        if bad:
            raise RpcError(f"job rejected: configuration key {bad[0]!r} is cluster-wide and cannot be set per job")
        try:
            conf = self._job_conf(graph)
        except ConfigError as exc:
            raise RpcError(f"job rejected: {exc}") from None
        reply = DeferredReply()
        if self.ha is not None:  # stored before it starts: a new leader recovers what was accepted
            def stored(_result, error: Optional[BaseException]) -> None:
                if error is not None:
                    reply.fail(f"job rejected: storing it for high availability failed: {error}")
                else:
                    self._start_submitted(graph, conf, msg.result_address, reply)
            self.endpoint.run_blocking(self.storage_executor, self.ha.put_job_graph, graph.job_id,
                                       {"job_graph": msg.job_graph, "result_address": msg.result_address},
                                       then=stored)
            return reply
        self._start_submitted(graph, conf, msg.result_address, reply)
        return reply

    def _job_conf(self, graph: JobGraph):
        return self.conf.copy().update(graph.config, f"the configuration of job '{graph.name}'")

    def _start_submitted(self, graph: JobGraph, conf, result_address: Optional[str], reply: DeferredReply) -> None:
        savepoint = conf.get(StateRecoveryOptions.SAVEPOINT_PATH)
        if not savepoint:
            self._start_job(graph, conf, result_address, None, reply)
            return

        def read(body, error: Optional[BaseException]) -> None:
            if error is not None:
                reply.fail(f"job rejected: cannot start from savepoint {savepoint}: {error}")
            else:
                self._start_job(graph, conf, result_address, (body, str(local_path(savepoint))), reply)
        self.endpoint.run_blocking(self.storage_executor, read_metadata, Path(local_path(savepoint)), then=read)

    def _start_job(self, graph: JobGraph, conf, result_address: Optional[str],
                   savepoint: Optional[tuple[dict, str]], reply: DeferredReply, is_savepoint: bool = True,
                   checkpoint_ids_after: int = 0, attempts_after: int = 0) -> None:
        if graph.job_id in self.jobs:  # submitted twice while its savepoint was read
            reply.fail(f"job rejected: a job with id {graph.job_id} exists already")
            return
        master = JobMaster(graph, conf, self.endpoint, self.rm, result_address, self.storage_executor,
                           on_terminated=self._job_terminated)
        master.ha = self.ha
        master.checkpointing.coordinator.start_ids_after(checkpoint_ids_after)
        if attempts_after:  # a recovered job: its next attempt is a number no old task has
            master.graph.attempt = attempts_after
            master.graph.reset_executions()
        try:
            master.start(savepoint, is_savepoint)  # refuses an unusable savepoint before the job is registered
        except RpcError as exc:
            reply.fail(f"job rejected: {exc}")
            return
        self.jobs[graph.job_id] = master
        for listener in self.job_added_listeners:
            listener(master)
        log.info("job %s (%s) submitted", graph.job_id, graph.name)
        reply.resolve(m.JobSubmitted(graph.job_id))

    # ------------------------------------------------------------------ HA recovery
    def recover_jobs(self) -> None:
        """A new leader starts every job the last one ran, each from its latest completed
        checkpoint (Flink's JobGraphStore and CompletedCheckpointStore, read off the loop)."""
        def recovered(jobs, error: Optional[BaseException]) -> None:
            if error is not None:
                log.error("recovering the jobs stored in ZooKeeper failed: %s", error)
                return
            for graph, conf, result_address, restore, is_savepoint, counter, attempt in jobs:
                reply = DeferredReply()  # nobody waits for it: the outcome is logged
                self._start_job(graph, conf, result_address, restore, reply, is_savepoint, counter, attempt)
                log.info("job %s (%s) recovered%s", graph.job_id, graph.name,
                         f" from {restore[1]}" if restore else " from the start (no completed checkpoint)")
        self.endpoint.run_blocking(self.storage_executor, self._read_recoverable_jobs, then=recovered)

    def _read_recoverable_jobs(self) -> list:
        """Storage executor: each stored job with its restore point (the pointer in ZooKeeper,
        or a newer checkpoint completed on disk; else the savepoint it was submitted with)."""
        assert self.ha is not None
        jobs = []
        for job_id, submission in self.ha.job_graphs().items():
            graph = JobGraph.from_dict(submission["job_graph"])
            conf = self._job_conf(graph)
            pointer = self.ha.latest_checkpoint(job_id)
            job_dir = CheckpointStorage(conf.get(CheckpointingOptions.CHECKPOINTS_DIRECTORY), conf.get(CheckpointingOptions.SAVEPOINT_DIRECTORY), job_id).job_dir
            body, directory = find_restore_point((pointer,) if pointer else (), str(job_dir), job_id)
            restore, is_savepoint = ((body, directory), False) if body is not None else (None, True)
            if restore is None and conf.get(StateRecoveryOptions.SAVEPOINT_PATH):
                savepoint = str(local_path(conf.get(StateRecoveryOptions.SAVEPOINT_PATH)))
                restore = (read_metadata(Path(savepoint)), savepoint)
            jobs.append((graph, conf, submission["result_address"], restore, is_savepoint,
                         self.ha.checkpoint_counter(job_id), self.ha.last_attempt(job_id)))
        return jobs

    def request_job_status(self, msg: m.RequestJobStatus, peer: Peer) -> m.JobStatus:
        return self.job(msg.job_id).status()

    def list_jobs(self, msg: m.ListJobs, peer: Peer) -> m.JobList:
        return m.JobList([
            {"jid": j.job_id, "name": j.job_graph.name, "state": j.state,
             "start-time": j.graph.start_ms, "reason": j.status_reason}
            for j in self.jobs.values()])

    def cancel_job(self, msg: m.CancelJob, peer: Peer) -> m.Acknowledge:
        self.job(msg.job_id).cancel()
        return m.Acknowledge()

    def request_cluster_overview(self, msg: m.RequestClusterOverview, peer: Peer) -> m.ClusterOverview:
        return m.ClusterOverview(overview_json(self), taskmanagers_json(self)["taskmanagers"])

    def request_job_details(self, msg: m.RequestJobDetails, peer: Peer) -> m.JobDetails:
        self.job(msg.job_id)  # an unknown job is an error answer, not a KeyError
        return m.JobDetails(job_json(self, msg.job_id) | {"subtasks": subtasks_json(self, msg.job_id)})

    def trigger_savepoint(self, msg: m.TriggerSavepoint, peer: Peer):
        return self.job(msg.job_id).trigger_savepoint(msg.target_directory, msg.stop)

    def request_keyed_state(self, msg: m.RequestKeyedState, peer: Peer) -> DeferredReply:
        reply = DeferredReply()

        def done(answer: Optional[m.KeyedState], error: Optional[BaseException]) -> None:
            reply.resolve(answer) if answer is not None else reply.fail(str(error))
        self.job(msg.job_id).request_keyed_state(msg.operator, msg.key, msg.fresh, done)
        return reply

    def dispose_savepoint(self, msg: m.DisposeSavepoint, peer: Peer) -> DeferredReply:
        reply = DeferredReply()

        def done(_result, error: Optional[BaseException]) -> None:
            reply.resolve(m.Acknowledge()) if error is None else reply.fail(f"not disposed: {error}")
        self.endpoint.run_blocking(self.storage_executor, dispose_savepoint, Path(local_path(msg.location)),
                                   then=done)
        return reply

    def shutdown_cluster(self, msg: m.ShutdownCluster, peer: Peer) -> m.Acknowledge:
        log.info("shutdown requested")
        for job in self.jobs.values():
            job.cancel()
        self.rm.shutdown_task_managers()
        self.endpoint.call_later(0.3, self.on_shutdown)
        return m.Acknowledge()

    def _job_terminated(self, master: JobMaster) -> None:
        """An ended job keeps what REST and the CLI show of it (names, states, times, failure,
        checkpoint history), not its pickled functions; the oldest ended jobs beyond
        jobstore.max-capacity go, and each goes after jobstore.expiration-time."""
        master.job_graph.drop_user_code()
        if self.ha is not None:  # globally terminal: no later leader recovers it
            self.storage_executor.submit(self.ha.remove_job, master.job_id)
        self.archived[master.job_id] = None
        while len(self.archived) > self.conf.get(JobManagerOptions.JOB_STORE_MAX_CAPACITY):
            self._forget(next(iter(self.archived)))
        self.endpoint.call_later(self.conf.get(JobManagerOptions.JOB_STORE_EXPIRATION_TIME), self._forget, master.job_id)

    def _forget(self, job_id: str) -> None:
        if job_id in self.archived:  # not dropped already for the capacity
            del self.archived[job_id]
            self.jobs.pop(job_id, None)
            log.info("job %s removed from the job store", job_id)

    # ------------------------------------------------------------------ routing
    def job(self, job_id: str) -> JobMaster:
        master = self.jobs.get(job_id)
        if master is None:
            raise RpcError(f"no job with id {job_id!r}")
        return master

    def _route_to_job_master(self, msg, peer: Peer) -> Optional[m.Message]:
        master = self.jobs.get(msg.job_id)
        if master is None:
            log.warning("%s for unknown job %s dropped", msg.op, msg.job_id)
            return None
        if not self._sent_by_holder(master, msg, peer):
            return None
        return master.handlers[type(msg)](msg, peer)

    def _sent_by_holder(self, master: JobMaster, msg, peer: Peer) -> bool:
        """Only the TaskManager that holds a slot offers it, and only the one an execution was
        deployed to reports for it. (Collect acknowledgements come from clients.)"""
        if isinstance(msg, m.OfferSlots):
            holders = {a.allocation_id: a.task_manager_id for a in self.rm.slot_manager.allocations_of(msg.job_id)}
            offerer = msg.task_manager_id
            foreign = next((a for a in msg.allocation_ids if holders.get(a, offerer) != offerer), None)
            if foreign is not None:
                self.endpoint.drops.drop("offer of another TaskManager's slot", peer.identity,
                                         f"{offerer} offered allocation {foreign} of {holders[foreign]}")
                return False
            return self.rm.sent_by(offerer, peer, msg)
        if isinstance(msg, m.AcknowledgeCollect):
            return True
        execution = master.graph.executions.get(msg.execution_id)
        return execution is None or execution.task_manager_id is None or \
            self.rm.sent_by(execution.task_manager_id, peer, msg)

    def _task_manager_lost(self, tm_id: str, reason: str) -> None:
        for master in list(self.jobs.values()):
            master.on_task_manager_lost(tm_id, reason)

    def _task_metrics(self, tasks: list[dict]) -> None:
        by_job: dict[str, list[dict]] = {}
        for task in tasks:
            if isinstance(task.get("job_id"), str):
                by_job.setdefault(task["job_id"], []).append(task)
        for job_id, job_tasks in by_job.items():
            master = self.jobs.get(job_id)
            if master is not None:
                master.on_task_metrics(job_tasks)
