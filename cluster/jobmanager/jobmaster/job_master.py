"""JobMaster: the networked face of one job.

Every decision (slots, deployment, task states, failover and restart, cancel, checkpoints,
the restore point) is the pure DefaultScheduler's (scheduler.py). The JobMaster turns messages,
timers and finished disk work into the scheduler's events (scheduler_events.py) and carries its
instructions (instructions.py) out:
messages to TaskManagers through their gateways, slot requests to the ResourceManager, timers
on the loop, and disk work (``_metadata``, restore reads, disposal) on the JobManager's storage
executor, whose results come back to the loop as events. Loop thread only.
"""
from __future__ import annotations

import logging
import shutil
import uuid
from collections import deque
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Callable, Optional

from cluster.checkpoint.coordinator import CompletedCheckpoint
from cluster.checkpoint.storage import CheckpointFormatError, completed_on_disk, read_metadata, write_metadata
from cluster.common import failures
from cluster.common.clock import now_ms
from cluster.connectors import submission_checks
from cluster.graph.deployment import (InputGateDescriptor, OutputDescriptor,
                                      TaskDeploymentDescriptor, channel_id)
from cluster.graph.execution_graph import Execution
from cluster.ha.services import NotLeader
from cluster.protocol.states import ExecutionState, JobState
from cluster.graph.job_graph import JobGraph, ShipStrategy
from cluster.protocol import messages as m
from cluster.protocol.endpoint import DeferredReply, Peer, RpcBusy, RpcEndpoint, RpcError
from cluster.checkpoint.inspection import StateQueryError, find_operator, operator_info, read_checkpoint_state

from cluster.jobmanager.jobmaster import instructions as ins, scheduler as s, scheduler_events as ev
from cluster.jobmanager.jobmaster.bottleneck import BottleneckHistory, current as current_bottleneck
from cluster.jobmanager.jobmaster.checkpointing import JobCheckpointing
from cluster.jobmanager.resourcemanager.resource_manager import ResourceManager
from cluster.jobmanager.resourcemanager.slot_manager import SlotAllocation

log = logging.getLogger(__name__)


def find_restore_point(candidates: tuple[tuple[int, str], ...], job_dir: str,
                       job_id: str) -> tuple[Optional[dict], Optional[str]]:
    """The newest checkpoint whose ``_metadata`` is there and sound (storage executor): the ones
    the scheduler knows, and any completed on disk; broken ones are skipped, logged."""
    known = dict(candidates)
    for checkpoint_id, directory in completed_on_disk(Path(job_dir)):
        known.setdefault(checkpoint_id, str(directory))
    for checkpoint_id in sorted(known, reverse=True):
        try:
            return read_metadata(Path(known[checkpoint_id])), known[checkpoint_id]
        except CheckpointFormatError as exc:
            log.warning("job %s: checkpoint %d skipped for recovery: %s", job_id, checkpoint_id, exc)
    return None, None


class JobMaster:
    def __init__(self, job_graph: JobGraph, conf, endpoint: RpcEndpoint, resource_manager: ResourceManager,
                 result_address: Optional[str], storage_executor: Executor,
                 on_terminated: Callable[["JobMaster"], None] = lambda jm: None):
        self.job_graph = job_graph
        self.job_id = job_graph.job_id
        self.conf = conf
        self.endpoint = endpoint
        self.rm = resource_manager
        self.result_address = result_address
        self.storage_executor = storage_executor
        self.on_terminated = on_terminated
        self.ha: Optional[Any] = None  # ZooKeeperHaServices in HA mode: checkpoint pointer and id counter
        sm = resource_manager.slot_manager
        self.scheduler = s.DefaultScheduler(job_graph, conf, now_ms, result_address,
                                            lambda: (sm.free_slots, sm.total_slots))
        self._timers: dict[str, Any] = {}
        self.bottlenecks = BottleneckHistory()  # what each metrics report showed (GET /jobs/<id>/bottleneck)
        self._savepoint_replies: dict[str, DeferredReply] = {}
        # a checkpoint requested for a state query: request id -> what to do once it ends
        self._checkpoint_requests: dict[str, Callable[[Optional[CompletedCheckpoint], Optional[str]], None]] = {}
        self._events: deque = deque()
        # checkpoint folders being read for a state query -> readers; a retained checkpoint that
        # is subsumed meanwhile is deleted once its last reader is done (Flink's shared state
        # registry keeps files alive while referenced, the same idea)
        self._pinned: dict[str, int] = {}
        self._dispose_when_unpinned: set[str] = set()
        self._handling = False
        self.handlers: dict[type, Callable[[Any, Peer], Optional[m.Message]]] = {
            m.OfferSlots: lambda msg, peer: self._feed(ev.SlotsOffered(tuple(msg.allocation_ids))),
            m.UpdateTaskExecutionState: lambda msg, peer: self._feed(
                ev.TaskStateReported(msg.execution_id, msg.state, msg.error, msg.metrics)),
            m.AcknowledgeCheckpoint: lambda msg, peer: self._feed(
                ev.CheckpointAcknowledged(msg.checkpoint_id, msg.execution_id, msg.state)),
            m.DeclineCheckpoint: lambda msg, peer: self._feed(
                ev.CheckpointDeclined(msg.checkpoint_id, msg.execution_id, msg.reason)),
            m.EndOfInput: lambda msg, peer: self._feed(ev.SourceExhausted(msg.execution_id)),
            m.AcknowledgeCollect: self.acknowledge_collect,
        }
        # the instructions' results, if any, are not used
        self._execute: dict[type, Callable[[Any], object]] = {
            ins.RequestSlots: lambda i: self.rm.request_slots(self.job_id, i.count, self),
            ins.CancelSlotRequest: lambda i: self.rm.cancel_slot_request(self.job_id),
            ins.ReleaseSlots: lambda i: self.rm.release_slots(self.job_id),
            ins.DeployTasks: self._deploy,
            ins.CancelTask: self._cancel_task,
            ins.StartTimer: self._start_timer,
            ins.CancelTimer: lambda i: self.endpoint.cancel_timer(self._timers.pop(i.name, None)),
            ins.TriggerCheckpoint: self._trigger_checkpoint,
            ins.WriteMetadata: self._write_metadata,
            ins.NotifyCheckpointComplete: self._notify_complete,
            ins.NotifyCheckpointAborted: lambda i: self._each_gateway(
                i.task_managers, lambda g: g.notify_checkpoint_aborted(self.job_id, i.checkpoint_id)),
            ins.DisposeCheckpoint: lambda i: self._dispose(i.directory),
            ins.FindRestorePoint: self._find_restore_point,
            ins.SavepointFinished: self._savepoint_finished,
            ins.CheckpointFinished: lambda i: self._checkpoint_requests.pop(i.request_id)(i.completed, i.failure),
            ins.JobTerminated: self._terminated,
        }

    def _notify_complete(self, i: ins.NotifyCheckpointComplete) -> None:
        # Flink's line: the act that lets sinks commit, so a log says which leader did it and when
        log.info("Completed checkpoint %d for job %s (%s)", i.checkpoint_id, self.job_id, self.job_graph.name)
        self._each_gateway(i.task_managers, lambda g: g.notify_checkpoint_complete(self.job_id, i.checkpoint_id))

    # ------------------------------------------------------------------ views (loop thread)
    @property
    def graph(self):
        return self.scheduler.graph

    @property
    def checkpointing(self) -> JobCheckpointing:
        return self.scheduler.checkpointing

    @property
    def state(self) -> JobState:
        return self.scheduler.state

    @property
    def status_reason(self) -> Optional[str]:
        return self.scheduler.status_reason

    def status(self) -> m.JobStatus:
        return m.JobStatus(self.job_id, self.job_graph.name, self.state, self.graph.attempt,
                           self.status_reason, self.graph.current_failure)

    # ------------------------------------------------------------------ events in
    def _feed(self, event: ev.Event) -> None:
        """Hand an event to the scheduler and carry out its instructions. Events that the
        instructions cause (a slot allocation answered at once) queue behind, never nest."""
        self.endpoint.assert_loop_thread()
        self._events.append(event)
        if self._handling:
            return
        self._handling = True
        try:
            while self._events:
                for instruction in self.scheduler.handle(self._events.popleft()):
                    self._execute[type(instruction)](instruction)
        finally:
            self._handling = False

    def start(self, savepoint: Optional[tuple[dict, str]] = None, is_savepoint: bool = True) -> None:
        """Begin scheduling, from a savepoint's metadata if given (raises RpcError, before anything
        happened, if the savepoint does not fit this job)."""
        if savepoint is not None:
            try:
                self.scheduler.restore_from_savepoint(*savepoint, is_savepoint=is_savepoint)
            except ev.SchedulerError as exc:
                raise RpcError(f"cannot start from savepoint {savepoint[1]}: {exc}") from None
        if not submission_checks.needs_checks(self.job_graph):
            self._feed(ev.StartScheduling())
            return

        def checked(_result, error: Optional[BaseException]) -> None:
            if error is None:
                self._feed(ev.StartScheduling())
            elif failures.restart_cannot_fix(error):
                log.info("job %s fails before its deployment: %s", self.job_id, error)
                self._feed(ev.InitializationFailed(f"{type(error).__name__}: {error}"))
            else:  # the check itself went wrong: the tasks find out whatever it is
                log.warning("job %s: the checks before deployment failed: %r", self.job_id, error)
                self._feed(ev.StartScheduling())
        self.endpoint.run_blocking(submission_checks.CHECKS_EXECUTOR, submission_checks.check_before_deployment,
                                   self.job_graph, then=checked)

    def on_slots_allocated(self, allocations: list[SlotAllocation]) -> None:
        self._feed(ev.SlotsAllocated(tuple(allocations)))

    def on_task_metrics(self, tasks: list[dict]) -> None:
        self._feed(ev.TaskMetricsReported(tuple(tasks)))
        if self.state == JobState.RUNNING:
            limit = current_bottleneck(self.job_graph, self.task_metrics())
            self.bottlenecks.observe(now_ms(), None if limit is None else limit.vertex_id)

    def task_metrics(self) -> dict[tuple[str, int], dict]:
        """Each subtask's latest metrics, by (vertex id, subtask)."""
        return {(e.vertex.id, e.subtask): e.metrics for e in self.graph.executions.values()}

    def on_task_manager_lost(self, tm_id: str, reason: str) -> None:
        self._feed(ev.TaskManagerLost(tm_id, reason))

    def cancel(self) -> None:
        self._feed(ev.CancelRequested())

    def acknowledge_collect(self, msg: m.AcknowledgeCollect, peer: Peer) -> m.Acknowledge:
        if msg.attempt == self.graph.attempt:
            self._feed(ev.CheckpointAcknowledged(msg.checkpoint_id, f"collect/{msg.sink}/{msg.subtask}"))
        return m.Acknowledge()  # a client may send it as a request

    def trigger_savepoint_async(self, target: Optional[str], stop: bool) -> str:
        """Flink's asynchronous operation: returns the request id; its status is in
        ``checkpointing.savepoint_requests``. Raises RpcError when the job cannot take one now."""
        request_id = uuid.uuid4().hex
        try:
            self._feed(ev.SavepointRequested(request_id, target, stop))
        except ev.TooManySavepoints as exc:
            raise RpcBusy(str(exc)) from None
        except ev.SchedulerError as exc:
            raise RpcError(str(exc)) from None
        return request_id

    def trigger_savepoint(self, target: Optional[str], stop: bool) -> DeferredReply:
        """The control-message form: answered once the savepoint completes or fails."""
        reply = DeferredReply()
        self._savepoint_replies[self.trigger_savepoint_async(target, stop)] = reply
        return reply

    def request_keyed_state(self, operator: str, key: Optional[bytes], fresh: bool,
                            done: Callable[[Optional[m.KeyedState], Optional[BaseException]], None]) -> None:
        """Read ``operator``'s keyed state at the newest completed checkpoint, or at one triggered
        now (``fresh``); ``done(answer, error)`` is called on the loop thread. Raises RpcError at
        once for a request that cannot be served (unknown operator, no checkpoint)."""
        self.endpoint.assert_loop_thread()
        operators = [op for v in self.job_graph.vertices for op in v.operators]
        try:
            spec = find_operator(operators, operator, f"'{self.job_graph.name}' ({self.job_id})")
        except StateQueryError as exc:
            raise RpcError(str(exc)) from None
        coordinator = self.checkpointing.coordinator
        if not fresh:
            latest = coordinator.latest()
            if latest is None:
                raise RpcError(f"job '{self.job_graph.name}' ({self.job_id}) has no completed checkpoint yet: "
                               "enable checkpointing (execution.checkpointing.interval) or pass fresh=True "
                               "(?fresh=true) to take one now")
            self._read_keyed_state(spec, key, latest.directory, done)
            return

        def checkpointed(completed, failure: Optional[str]) -> None:
            # the scheduler's CheckpointFinished, carried out before the instructions that follow
            # the completion (disposals): pinned before anything can subsume it
            newest = coordinator.latest()
            if completed is None and newest is not None and newest.checkpoint_id > before:
                completed = newest  # subsumed by a checkpoint that completed after the request
            if completed is None:
                self.endpoint.call_soon(done, None, RpcError(f"the checkpoint taken for the state query failed: {failure}"))
            else:
                self._read_keyed_state(spec, key, completed.directory, done)
        before = latest.checkpoint_id if (latest := coordinator.latest()) else 0
        request_id = uuid.uuid4().hex
        self._checkpoint_requests[request_id] = checkpointed
        try:
            self._feed(ev.CheckpointRequested(request_id))
        except ev.SchedulerError as exc:
            del self._checkpoint_requests[request_id]
            raise RpcError(str(exc)) from None

    def _read_keyed_state(self, spec, key: Optional[bytes], directory: str,
                          done: Callable[[Optional[m.KeyedState], Optional[BaseException]], None]) -> None:
        self._pinned[directory] = self._pinned.get(directory, 0) + 1
        names = {op.uid: op.name for v in self.job_graph.vertices for op in v.operators}

        def read(result, error: Optional[BaseException]) -> None:
            self._unpin(directory)
            if error is not None:
                done(None, RpcError(f"reading the state of '{spec.name}' at {directory} failed: {error}"))
                return
            entries, positions, checkpoint_id = result
            sources = {names.get(uid, uid): subtasks for uid, subtasks in positions.items()}
            done(m.KeyedState(self.job_id, checkpoint_id, operator_info(spec), sources, entries), None)
        self.endpoint.run_blocking(self.storage_executor, read_checkpoint_state, Path(directory), spec.uid, key,
                                   then=read)

    def _unpin(self, directory: str) -> None:
        left = self._pinned.pop(directory) - 1
        if left:
            self._pinned[directory] = left
        elif directory in self._dispose_when_unpinned:
            self._dispose_when_unpinned.discard(directory)
            self._dispose(directory)

    def _dispose(self, directory: str) -> None:
        if directory in self._pinned:
            self._dispose_when_unpinned.add(directory)
        else:
            self.storage_executor.submit(shutil.rmtree, directory, True)

    # ------------------------------------------------------------------ instructions out
    def _deploy(self, i: ins.DeployTasks) -> None:
        gone = next(((e, a) for e, a in i.placements if self.rm.task_executor_gateway(a.task_manager_id) is None),
                    None)
        if gone is not None:  # lost since the allocation; its loss event may still be on its way
            self._feed(ev.DeploymentFailed(gone[0].execution_id, f"TaskManager {gone[1].task_manager_id} is gone"))
            return
        if self.ha is not None:
            try:
                self.ha.attempt_deployed(self.job_id, i.attempt)
            except NotLeader as exc:  # deposed, and not yet told: another leader runs the job
                log.warning("job %s: attempt %d not deployed: %s", self.job_id, i.attempt, exc)
                return
        # the wire form of every vertex and the configuration, once for all subtasks
        vertices = {v["id"]: v for v in self.job_graph.to_dict()["vertices"]}
        job_config = self.conf.to_dict()
        address_of_subtask = {e.subtask: self.rm.data_address(a.task_manager_id) for e, a in i.placements}
        for execution, alloc in i.placements:
            tdd = self._deployment(i, execution, alloc, vertices[execution.vertex.id], job_config,
                                   address_of_subtask)
            self.rm.task_executor_gateway(alloc.task_manager_id).submit_task(tdd.to_dict())
        log.info("job %s (%s) deployed, attempt %d%s", self.job_id, self.job_graph.name, i.attempt,
                 f" from checkpoint {i.restore['checkpoint_id']}" if i.restore else "")

    def _deployment(self, i: ins.DeployTasks, execution: Execution, alloc: SlotAllocation, vertex: dict,
                    job_config: dict, address_of_subtask: dict[int, str]) -> TaskDeploymentDescriptor:
        g, attempt, sub = self.job_graph, i.attempt, execution.subtask
        inputs, outputs = [], []
        for idx, edge in g.inputs_of(execution.vertex.id):
            producers = [sub] if edge.ship_strategy == ShipStrategy.FORWARD else range(g.vertex(edge.source).parallelism)
            inputs.append(InputGateDescriptor(idx, edge.ship_strategy, [
                (channel_id(self.job_id, attempt, idx, p, sub), address_of_subtask[p]) for p in producers]))
        for idx, edge in g.outputs_of(execution.vertex.id):
            consumers = [sub] if edge.ship_strategy == ShipStrategy.FORWARD else range(g.vertex(edge.target).parallelism)
            outputs.append(OutputDescriptor(idx, edge.ship_strategy, list(edge.key),
                                            g.vertex(edge.target).max_parallelism, [
                (channel_id(self.job_id, attempt, idx, sub, c), address_of_subtask[c]) for c in consumers],
                edge.side_output))
        return TaskDeploymentDescriptor(
            job_id=self.job_id, job_name=g.name, attempt=attempt, execution_id=execution.execution_id,
            allocation_id=alloc.allocation_id, vertex=vertex, subtask=sub, inputs=inputs, outputs=outputs,
            job_config=job_config, result_address=self.result_address, restore=i.restore, cells=g.cells)

    def _cancel_task(self, i: ins.CancelTask) -> None:
        gateway = self.rm.task_executor_gateway(i.task_manager_id)
        if gateway is None:  # its TaskManager is gone: nothing left to cancel
            self._feed(ev.TaskStateReported(i.execution_id, ExecutionState.CANCELED))
        else:
            gateway.cancel_task(i.execution_id)

    def _start_timer(self, i: ins.StartTimer) -> None:
        self.endpoint.cancel_timer(self._timers.get(i.name))
        self._timers[i.name] = self.endpoint.call_later(i.delay_ms / 1000, self._feed, ev.TimerFired(i.name))

    def _trigger_checkpoint(self, i: ins.TriggerCheckpoint) -> None:
        if self.ha is not None:
            self.ha.checkpoint_triggered(self.job_id, i.checkpoint_id)
        for tm_id, execution_id in i.sources:
            gateway = self.rm.task_executor_gateway(tm_id)
            if gateway is not None:
                gateway.trigger_checkpoint(self.job_id, execution_id, i.checkpoint_id, i.timestamp, i.kind,
                                           i.directory)

    def _write_metadata(self, i: ins.WriteMetadata) -> None:
        def written(_result, error: Optional[BaseException]) -> None:
            self._feed(ev.MetadataWritten(i.checkpoint_id, None if error is None else str(error)))
        self.endpoint.run_blocking(self.storage_executor, self._store_checkpoint, i, then=written)

    def _store_checkpoint(self, i: ins.WriteMetadata) -> None:
        """``_metadata``, then in HA mode the pointer in ZooKeeper (storage executor): both before
        the sinks are told to commit, so a new leader restores no older checkpoint than they did."""
        write_metadata(Path(i.directory), i.body)
        if self.ha is not None:
            self.ha.checkpoint_completed(self.job_id, i.checkpoint_id, i.directory)

    def _find_restore_point(self, i: ins.FindRestorePoint) -> None:
        def found(result, error: Optional[BaseException]) -> None:
            if error is not None:
                log.error("job %s: looking for a checkpoint to restore failed: %s", self.job_id, error)
                result = (None, None)
            self._feed(ev.RestorePointFound(*result))
        self.endpoint.run_blocking(self.storage_executor, find_restore_point, i.candidates, i.job_dir,
                                   self.job_id, then=found)

    def _savepoint_finished(self, i: ins.SavepointFinished) -> None:
        reply = self._savepoint_replies.pop(i.request_id, None)
        if reply is not None:
            if i.location is not None:
                reply.resolve(m.SavepointCompleted(self.job_id, i.location))
            else:
                reply.fail(i.failure or "the savepoint failed")

    def _terminated(self, i: ins.JobTerminated) -> None:
        for timer in self._timers.values():
            self.endpoint.cancel_timer(timer)
        self._timers.clear()
        # the job stays in the Dispatcher with its final status (Flink's archived job)
        log.info("job %s (%s) is %s", self.job_id, self.job_graph.name, i.state)
        self.on_terminated(self)

    def _each_gateway(self, tm_ids, send: Callable) -> None:
        for tm_id in tm_ids:
            gateway = self.rm.task_executor_gateway(tm_id)
            if gateway is not None:
                send(gateway)
