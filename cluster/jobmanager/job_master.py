"""JobMaster: runs one job, from slot request to its globally terminal state.

It turns the JobGraph into an ExecutionGraph, asks the ResourceManager for slots (one per
subtask index: slot sharing), deploys each subtask to the TaskManager that offered the slot,
follows task states, and on a failure cancels what still runs, then restarts or fails the job
as the restart strategy says. Runs on the JobManager's loop thread, like every component there.
"""
from __future__ import annotations

import logging
from typing import Optional

from cluster.clock import now_ms
from cluster.graph.deployment import (InputGateDescriptor, OutputDescriptor,
                                      TaskDeploymentDescriptor, channel_id)
from cluster.graph.execution_graph import Execution, ExecutionGraph, ExecutionState, JobState
from cluster.graph.job_graph import JobGraph
from cluster.protocol import messages as m
from cluster.protocol.endpoint import DeferredReply, Peer, RpcEndpoint

from .checkpointing import JobCheckpointing
from .resource_manager import ResourceManager
from .restart_strategy import RestartStrategy
from .slot_manager import SlotAllocation

log = logging.getLogger(__name__)


class JobMaster:
    def __init__(self, job_graph: JobGraph, conf, endpoint: RpcEndpoint, resource_manager: ResourceManager,
                 result_address: Optional[str]):
        self.job_graph = job_graph
        self.job_id = job_graph.job_id
        self.conf = conf
        self.endpoint = endpoint
        self.rm = resource_manager
        self.result_address = result_address
        self.graph = ExecutionGraph(job_graph, now_ms(), clock=now_ms)
        self.restart_strategy = RestartStrategy.from_config(conf)
        self.reason: Optional[str] = None
        self._allocations: list[SlotAllocation] = []
        self._offered: set[str] = set()
        self._slot_timer = None
        self._restart_timer = None
        self.checkpointing = JobCheckpointing(self)
        self.handlers = {
            m.OfferSlots: self.offer_slots,
            m.UpdateTaskExecutionState: self.update_task_execution_state,
            m.AcknowledgeCheckpoint: lambda msg, peer: self.checkpointing.acknowledge_checkpoint(msg),
            m.DeclineCheckpoint: lambda msg, peer: self.checkpointing.decline_checkpoint(msg),
            m.EndOfInput: lambda msg, peer: self.checkpointing.end_of_input(msg),
            m.AcknowledgeCollect: self.acknowledge_collect,
        }

    @property
    def state(self) -> str:
        return self.graph.state

    # ------------------------------------------------------------------ scheduling
    def start(self) -> None:
        """Raises RpcError (the submission is refused) when the savepoint to start from is unusable."""
        if self.conf["execution.savepoint.path"]:
            self.checkpointing.restore_from_path(self.conf["execution.savepoint.path"])
        self._request_slots()

    def _request_slots(self) -> None:
        needed = self.graph.required_slots
        sm = self.rm.slot_manager
        self.reason = (f"waiting for {needed} free slot(s); the cluster has {sm.free_slots} free of "
                       f"{sm.total_slots}")
        timeout_ms = self.conf["slot.request.timeout"]
        self._slot_timer = self.endpoint.call_later(timeout_ms / 1000, self._slot_request_timed_out)
        self.rm.request_slots(self.job_id, needed, self)

    def _slot_request_timed_out(self) -> None:
        if self._allocations or self.graph.is_globally_terminal or self.state != JobState.CREATED:
            return
        sm = self.rm.slot_manager
        self.rm.cancel_slot_request(self.job_id)
        self._fail_globally(
            f"NoResourceAvailableException: Could not acquire the minimum required resources: the job "
            f"needs {self.graph.required_slots} slot(s) but only {sm.free_slots} of {sm.total_slots} "
            f"were free within slot.request.timeout ({self.conf['slot.request.timeout']} ms)")

    def on_slots_allocated(self, allocations: list[SlotAllocation]) -> None:
        self.endpoint.cancel_timer(self._slot_timer)
        if self.state != JobState.CREATED:  # cancelled meanwhile
            self.rm.release_slots(self.job_id)
            return
        self._allocations = allocations
        self._offered = set()
        for execution in self.graph.executions.values():
            self.graph.set_state(execution, ExecutionState.SCHEDULED)
        self.reason = "deploying: waiting for TaskManagers to offer the allocated slots"

    def offer_slots(self, msg: m.OfferSlots, peer: Peer) -> None:
        expected = {a.allocation_id for a in self._allocations}
        self._offered.update(a for a in msg.allocation_ids if a in expected)
        if self.state == JobState.CREATED and expected and self._offered == expected:
            self._deploy()

    def _deploy(self) -> None:
        self.graph.transition(JobState.RUNNING, now_ms())
        self.reason = None
        # the wire form of every vertex and the configuration, once for all subtasks
        vertices = {v["id"]: v for v in self.job_graph.to_dict()["vertices"]}
        job_config = self.conf.to_dict()
        for execution in self.graph.executions.values():
            alloc = self._allocations[execution.subtask]
            execution.task_manager_id = alloc.task_manager_id
            execution.allocation_id = alloc.allocation_id
            gateway = self.rm.task_executor_gateway(alloc.task_manager_id)
            if gateway is None:
                self._task_failed(execution, f"TaskManager {alloc.task_manager_id} is gone")
                return
            self.graph.set_state(execution, ExecutionState.DEPLOYING)
            gateway.submit_task(self._deployment(execution, alloc, vertices[execution.vertex.id], job_config).to_dict())
        log.info("job %s (%s) deployed, attempt %d%s", self.job_id, self.job_graph.name, self.graph.attempt,
                 f" from checkpoint {self.checkpointing.restore['checkpoint_id']}" if self.checkpointing.restore else "")
        self.checkpointing.on_running()

    def _address_of_subtask(self, subtask: int) -> str:
        return self.rm.data_address(self._allocations[subtask].task_manager_id)

    def _deployment(self, execution: Execution, alloc: SlotAllocation, vertex: dict,
                    job_config: dict) -> TaskDeploymentDescriptor:
        g, attempt, s = self.job_graph, self.graph.attempt, execution.subtask
        inputs, outputs = [], []
        for idx, edge in g.inputs_of(execution.vertex.id):
            producers = [s] if edge.ship_strategy == "FORWARD" else range(g.vertex(edge.source).parallelism)
            inputs.append(InputGateDescriptor(idx, edge.ship_strategy, [
                (channel_id(self.job_id, attempt, idx, p, s), self._address_of_subtask(p)) for p in producers]))
        for idx, edge in g.outputs_of(execution.vertex.id):
            consumers = [s] if edge.ship_strategy == "FORWARD" else range(g.vertex(edge.target).parallelism)
            outputs.append(OutputDescriptor(idx, edge.ship_strategy, list(edge.key),
                                            g.vertex(edge.target).max_parallelism, [
                (channel_id(self.job_id, attempt, idx, s, c), self._address_of_subtask(c)) for c in consumers],
                edge.side_output))
        return TaskDeploymentDescriptor(
            job_id=self.job_id, job_name=g.name, attempt=attempt, execution_id=execution.execution_id,
            allocation_id=alloc.allocation_id, vertex=vertex, subtask=s, inputs=inputs, outputs=outputs,
            job_config=job_config, result_address=self.result_address, restore=self.checkpointing.restore)

    # ------------------------------------------------------------------ task reports
    def update_task_execution_state(self, msg: m.UpdateTaskExecutionState, peer: Peer) -> None:
        execution = self.graph.update_execution(msg.execution_id, msg.state, msg.error)
        if execution is None:
            return
        if msg.metrics:
            execution.metrics = dict(msg.metrics)
        if msg.state == ExecutionState.FAILED:
            self._task_failed(execution, msg.error or "unknown error")
        elif self.graph.all_terminal():
            self._all_terminal()

    def on_task_metrics(self, tasks: list[dict]) -> None:
        for task in tasks:
            execution = self.graph.executions.get(task.get("execution_id"))
            if execution is not None and not execution.is_terminal:
                execution.metrics = task

    def on_task_manager_lost(self, tm_id: str, reason: str) -> None:
        if self.graph.is_globally_terminal:
            return
        if self.state == JobState.CREATED and any(a.task_manager_id == tm_id for a in self._allocations):
            # lost between allocation and deployment: ask again
            self._allocations, self._offered = [], set()
            self.rm.release_slots(self.job_id)
            self._request_slots()
            return
        lost = [e for e in self.graph.non_terminal() if e.task_manager_id == tm_id]
        for execution in lost:
            self.graph.update_execution(execution.execution_id, ExecutionState.FAILED, reason)
        if lost:
            self._task_failed(lost[0], reason)

    def _task_failed(self, execution: Execution, error: str) -> None:
        if execution.state != ExecutionState.FAILED:
            self.graph.update_execution(execution.execution_id, ExecutionState.FAILED, error)
        if self.state in (JobState.RUNNING, JobState.CREATED):
            self.graph.failure = (f"Task '{execution.name}' failed on TaskManager "
                                  f"{execution.task_manager_id}:\n{error}")
            log.warning("job %s: %s", self.job_id, self.graph.failure.splitlines()[0])
            self.graph.transition(JobState.FAILING, now_ms())
            self.checkpointing.on_stopped("the job is failing")
            self._cancel_running_tasks()
        if self.graph.all_terminal():
            self._all_terminal()

    def _cancel_running_tasks(self) -> None:
        for execution in self.graph.non_terminal():
            if execution.state in (ExecutionState.CREATED, ExecutionState.SCHEDULED) or \
                    execution.task_manager_id is None:
                self.graph.update_execution(execution.execution_id, ExecutionState.CANCELED)
                continue
            gateway = self.rm.task_executor_gateway(execution.task_manager_id)
            if gateway is None:  # its TaskManager is gone: nothing left to cancel
                self.graph.update_execution(execution.execution_id, ExecutionState.CANCELED)
            else:
                self.graph.set_state(execution, ExecutionState.CANCELING)
                gateway.cancel_task(execution.execution_id)

    def _all_terminal(self) -> None:
        self.checkpointing.on_stopped("the job ended")
        state = self.state
        if state == JobState.RUNNING and self.graph.all_finished():
            self.graph.transition(JobState.FINISHED, now_ms())
            self._release_and_report()
        elif state == JobState.CANCELLING:
            self.graph.transition(JobState.CANCELED, now_ms())
            self._release_and_report()
        elif state == JobState.FAILING:
            self._allocations = []
            self.rm.release_slots(self.job_id)
            delay = self.restart_strategy.next_delay_ms()
            if delay is None:
                self.graph.failure = f"{self.graph.failure}\n\nThe job was not restarted: " \
                                     f"{self.restart_strategy.describe()}."
                self.graph.transition(JobState.FAILED, now_ms())
                self._release_and_report()
                return
            self.graph.transition(JobState.RESTARTING, now_ms())
            self.reason = f"restarting in {delay} ms (restart {self.restart_strategy.restarts})"
            self._restart_timer = self.endpoint.call_later(delay / 1000, self._restart)

    def _restart(self) -> None:
        if self.state != JobState.RESTARTING:
            return
        self.checkpointing.find_restore_point()
        self.graph.reset_executions()
        self.graph.transition(JobState.CREATED, now_ms())
        self._request_slots()

    # ------------------------------------------------------------------ cancel
    def cancel(self) -> None:
        if self.graph.is_globally_terminal or self.state == JobState.CANCELLING:
            return
        self.endpoint.cancel_timer(self._slot_timer)
        self.endpoint.cancel_timer(self._restart_timer)
        self.rm.cancel_slot_request(self.job_id)
        if self.state == JobState.RESTARTING:
            self.graph.transition(JobState.CANCELED, now_ms())
            self._release_and_report()
            return
        self.graph.transition(JobState.CANCELLING, now_ms())
        self.checkpointing.on_stopped("the job was cancelled")
        self._cancel_running_tasks()
        if self.graph.all_terminal():
            self._all_terminal()

    def acknowledge_collect(self, msg: m.AcknowledgeCollect, peer: Peer) -> m.Acknowledge:
        self.checkpointing.acknowledge_collect(msg)
        return m.Acknowledge()  # a client may send it as a request

    def trigger_savepoint(self, target: Optional[str], stop: bool) -> DeferredReply:
        pending = self.checkpointing.trigger_savepoint(target, stop)
        reply = DeferredReply()
        pending.on_done.append(lambda done, reason: reply.resolve(m.SavepointCompleted(self.job_id, done.directory))
                               if done else reply.fail(f"the savepoint of job {self.job_id} failed: {reason}"))
        return reply

    def _fail_globally(self, reason: str) -> None:
        self.graph.failure = reason
        for execution in self.graph.non_terminal():
            self.graph.update_execution(execution.execution_id, ExecutionState.CANCELED)
        self.graph.transition(JobState.FAILED, now_ms())
        self._release_and_report()

    def _release_and_report(self) -> None:
        self.reason = None
        self.rm.release_slots(self.job_id)
        # the job stays in the Dispatcher with its final status (Flink's archived job)
        log.info("job %s (%s) is %s", self.job_id, self.job_graph.name, self.state)

    # ------------------------------------------------------------------ views
    @property
    def status_reason(self) -> Optional[str]:
        """Why the job waits: its own reason, or what a starting task waits for (e.g. Spark)."""
        if self.reason:
            return self.reason
        for e in self.graph.non_terminal():
            if e.metrics.get("detail"):
                return f"{e.metrics['detail']} (TaskManager {e.task_manager_id})"
        return None

    def status(self) -> m.JobStatus:
        return m.JobStatus(self.job_id, self.job_graph.name, self.state, self.graph.attempt,
                           self.status_reason, self.graph.failure)
