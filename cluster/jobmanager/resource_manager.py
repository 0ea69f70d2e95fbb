"""ResourceManager: TaskManager registration, heartbeats and the slot table (standalone mode).

It hands out the slots of the TaskManagers it has: a job's request waits until enough are free.
A TaskManager silent for ``heartbeat.timeout`` is declared lost; its slots leave the table and
the JobMasters that used them are told.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Protocol

from cluster.protocol import messages as m
from cluster.protocol.endpoint import Peer, RpcEndpoint
from cluster.protocol.gateways import TaskExecutorGateway

from .slot_manager import SlotAllocation, SlotManager, TaskManagerRegistration

log = logging.getLogger(__name__)


class SlotListener(Protocol):
    def on_slots_allocated(self, allocations: list[SlotAllocation]) -> None: ...


class ResourceManager:
    def __init__(self, endpoint: RpcEndpoint, conf, clock: Callable[[], float] = time.monotonic):
        self.endpoint = endpoint
        self.clock = clock
        self.heartbeat_interval_ms = conf["heartbeat.interval"]
        self.heartbeat_timeout_s = conf["heartbeat.timeout"] / 1000
        self.slot_manager = SlotManager()
        self._peers: dict[str, Peer] = {}
        self._listeners: dict[str, SlotListener] = {}
        self.task_manager_lost_listeners: list[Callable[[str, str], None]] = []
        self.task_metrics_listeners: list[Callable[[list[dict]], None]] = []
        self.handlers = {
            m.RegisterTaskManager: self.register_task_manager,
            m.HeartbeatFromTaskManager: self.heartbeat_from_task_manager,
            m.DisconnectTaskManager: self.disconnect_task_manager,
        }
        check_every = min(1.0, self.heartbeat_timeout_s / 4)
        endpoint.call_every(check_every, self._check_heartbeats)

    # ------------------------------------------------------------------ handlers
    def register_task_manager(self, msg: m.RegisterTaskManager, peer: Peer) -> None:
        if peer.identity != msg.task_manager_id.encode():
            log.warning("registration of %s from a peer named %r refused", msg.task_manager_id, peer.identity)
            self.endpoint.send(peer, m.RegistrationRejected("task manager id does not match the connection"))
            return
        if msg.number_of_slots < 1:
            self.endpoint.send(peer, m.RegistrationRejected("a TaskManager needs at least one slot"))
            return
        now = self.clock()
        new = self.slot_manager.register(TaskManagerRegistration(
            msg.task_manager_id, msg.data_address, msg.number_of_slots, msg.pid, now, now, dict(msg.hardware)))
        self._peers[msg.task_manager_id] = peer
        if new:
            log.info("TaskManager %s registered with %d slots (data %s)",
                     msg.task_manager_id, msg.number_of_slots, msg.data_address)
        self.endpoint.send(peer, m.RegistrationSuccess(self.heartbeat_interval_ms))
        self._try_allocate()

    def heartbeat_from_task_manager(self, msg: m.HeartbeatFromTaskManager, peer: Peer) -> None:
        if not self.slot_manager.heartbeat(msg.task_manager_id, self.clock(), msg.tasks):
            # Unknown to us (declared lost, or we restarted): it must register again.
            self.endpoint.send(peer, m.RequestRegistration())
            return
        for listener in self.task_metrics_listeners:
            listener(msg.tasks)

    def disconnect_task_manager(self, msg: m.DisconnectTaskManager, peer: Peer) -> None:
        self._lose(msg.task_manager_id, f"TaskManager {msg.task_manager_id} disconnected: {msg.reason}")

    # ------------------------------------------------------------------ heartbeats
    def _check_heartbeats(self) -> None:
        for tm_id in self.slot_manager.expired(self.clock(), self.heartbeat_timeout_s):
            self._lose(tm_id, f"TaskManager {tm_id} lost: no heartbeat for "
                              f"{self.heartbeat_timeout_s * 1000:.0f} ms (heartbeat.timeout)")

    def _lose(self, tm_id: str, reason: str) -> None:
        if tm_id not in self.slot_manager.task_managers:
            return
        log.warning(reason)
        self.slot_manager.unregister(tm_id)
        self._peers.pop(tm_id, None)
        for listener in self.task_manager_lost_listeners:
            listener(tm_id, reason)
        self._try_allocate()

    # ------------------------------------------------------------------ slots, for JobMasters
    def request_slots(self, job_id: str, count: int, listener: SlotListener) -> None:
        self._listeners[job_id] = listener
        self.slot_manager.request(job_id, count)
        self._try_allocate()

    def cancel_slot_request(self, job_id: str) -> None:
        self.slot_manager.cancel_request(job_id)

    def release_slots(self, job_id: str) -> None:
        for alloc in self.slot_manager.free(job_id):
            gateway = self.task_executor_gateway(alloc.task_manager_id)
            if gateway:
                gateway.free_slot(alloc.allocation_id)
        self._listeners.pop(job_id, None)
        self._try_allocate()

    def _try_allocate(self) -> None:
        for allocations in self.slot_manager.allocate_pending():
            for alloc in allocations:
                self.task_executor_gateway(alloc.task_manager_id).request_slot(
                    alloc.slot_index, alloc.job_id, alloc.allocation_id)
            listener = self._listeners.get(allocations[0].job_id)
            if listener:
                listener.on_slots_allocated(allocations)

    def task_executor_gateway(self, tm_id: str):
        peer = self._peers.get(tm_id)
        return TaskExecutorGateway(self.endpoint, peer) if peer else None

    def data_address(self, tm_id: str) -> str:
        return self.slot_manager.task_managers[tm_id].data_address

    def shutdown_task_managers(self) -> None:
        for tm_id in list(self._peers):
            self.task_executor_gateway(tm_id).shutdown()
