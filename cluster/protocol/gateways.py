"""Typed faces of remote endpoints, named after Flink's gateways.

A gateway turns a method call into a message to one peer; it never waits for an answer (replies
come back as messages to the caller's own handlers).
"""
from __future__ import annotations

from cluster.protocol.endpoint import Peer, RpcEndpoint
from cluster.protocol import messages as m
from cluster.protocol.states import ExecutionState


class TaskExecutorGateway:
    """The JobManager's handle on one TaskManager."""

    def __init__(self, endpoint: RpcEndpoint, peer: Peer):
        self._endpoint, self._peer = endpoint, peer

    def _send(self, msg: m.Message) -> None:
        self._endpoint.send(self._peer, msg)

    def request_slot(self, slot_index: int, job_id: str, allocation_id: str) -> None:
        self._send(m.RequestSlot(slot_index, job_id, allocation_id))

    def submit_task(self, deployment: dict) -> None:
        self._send(m.SubmitTask(deployment))

    def cancel_task(self, execution_id: str) -> None:
        self._send(m.CancelTask(execution_id))

    def free_slot(self, allocation_id: str) -> None:
        self._send(m.FreeSlot(allocation_id))

    def trigger_checkpoint(self, job_id: str, execution_id: str, checkpoint_id: int, timestamp: int,
                           kind: str, directory: str) -> None:
        self._send(m.TriggerCheckpoint(job_id, execution_id, checkpoint_id, timestamp, kind, directory))

    def notify_checkpoint_complete(self, job_id: str, checkpoint_id: int) -> None:
        self._send(m.NotifyCheckpointComplete(job_id, checkpoint_id))

    def notify_checkpoint_aborted(self, job_id: str, checkpoint_id: int) -> None:
        self._send(m.NotifyCheckpointAborted(job_id, checkpoint_id))

    def request_registration(self) -> None:
        self._send(m.RequestRegistration())

    def shutdown(self) -> None:
        self._send(m.ShutdownTaskManager())


class JobManagerGateway:
    """A TaskManager's handle on the JobManager (ResourceManager and JobMasters behind one address)."""

    def __init__(self, endpoint: RpcEndpoint, peer: Peer):
        self._endpoint, self._peer = endpoint, peer

    def _send(self, msg: m.Message) -> None:
        self._endpoint.send(self._peer, msg)

    def register_task_manager(self, tm_id: str, data_address: str, slots: int, pid: int, hardware: dict,
                              registration_id: str, spark: str) -> None:
        self._send(m.RegisterTaskManager(tm_id, data_address, slots, pid, hardware, registration_id, spark))

    def heartbeat_from_task_manager(self, tm_id: str, tasks: list[dict], spark: str) -> None:
        self._send(m.HeartbeatFromTaskManager(tm_id, tasks, spark))

    def offer_slots(self, tm_id: str, job_id: str, allocation_ids: list[str]) -> None:
        self._send(m.OfferSlots(tm_id, job_id, allocation_ids))

    def update_task_execution_state(self, job_id: str, execution_id: str, state: ExecutionState,
                                    error=None, metrics=None) -> None:
        self._send(m.UpdateTaskExecutionState(job_id, execution_id, state, error, metrics or {}))

    def acknowledge_checkpoint(self, job_id: str, execution_id: str, checkpoint_id: int, state: dict) -> None:
        self._send(m.AcknowledgeCheckpoint(job_id, execution_id, checkpoint_id, state))

    def decline_checkpoint(self, job_id: str, execution_id: str, checkpoint_id: int, reason: str) -> None:
        self._send(m.DeclineCheckpoint(job_id, execution_id, checkpoint_id, reason))

    def end_of_input(self, job_id: str, execution_id: str) -> None:
        self._send(m.EndOfInput(job_id, execution_id))

    def disconnect_task_manager(self, tm_id: str, reason: str) -> None:
        self._send(m.DisconnectTaskManager(tm_id, reason))
