"""ResourceManager: TaskManager registration, heartbeats and the slot table.

Standalone (``resourcemanager.provider: standalone``, the default), it hands out the slots of the
TaskManagers it has: a job's request waits until enough are free. Active (``process``), it also
starts TaskManager processes when requests wait and stops idle ones it started
(active_resources.py). A TaskManager silent for ``heartbeat.timeout`` is declared lost; its slots
leave the table and the JobMasters that used them are told.

The decisions are ``ResourceManagerState``'s, a pure class over the SlotManager (a method per
event, instructions out, the clock an argument), and ``ActiveResourceState``'s; ``ResourceManager``
is their networked shell: every method of it is for the JobManager's loop thread (checked), but
``stop_started_task_managers`` (shutdown).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from cluster.protocol import messages as m
from cluster.protocol.endpoint import Peer, RpcEndpoint
from cluster.protocol.gateways import TaskExecutorGateway

from cluster.jobmanager.resourcemanager.active_resources import (ActiveResourceState, ProcessTaskManagerProvider, SlotDemand, SlotLimitReached, StartsGivenUp, StartTaskManager, StopTaskManager)
from cluster.jobmanager.resourcemanager.slot_manager import SlotAllocation, SlotManager, TaskManagerRegistration
from cluster.conf.options import ClusterOptions, HeartbeatManagerOptions, ResourceManagerOptions

log = logging.getLogger(__name__)


class SlotListener(Protocol):
    def on_slots_allocated(self, allocations: list[SlotAllocation]) -> None: ...


# --------------------------------------------------------------------------- instructions
@dataclass(frozen=True)
class AcceptRegistration:
    task_manager_id: str
    new: bool


@dataclass(frozen=True)
class RejectRegistration:
    task_manager_id: str
    reason: str


@dataclass(frozen=True)
class AskToRegister:
    """A heartbeat from a TaskManager we do not know (declared lost, or we restarted)."""
    task_manager_id: str


@dataclass(frozen=True)
class RequestSlotAt:
    allocation: SlotAllocation


@dataclass(frozen=True)
class FreeSlotAt:
    allocation: SlotAllocation


@dataclass(frozen=True)
class GrantSlots:
    job_id: str
    allocations: tuple[SlotAllocation, ...]


@dataclass(frozen=True)
class DeclareLost:
    task_manager_id: str
    reason: str


@dataclass(frozen=True)
class AnswerHeartbeat:
    task_manager_id: str


@dataclass(frozen=True)
class ForwardMetrics:
    tasks: tuple[dict, ...]


class ResourceManagerState:
    """Registration, heartbeat expiry and slot allocation; pure, for the loop thread only."""

    def __init__(self, heartbeat_timeout_s: float, spread_out: bool = False):
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.slot_manager = SlotManager(spread_out)
        # TaskManagers we stopped: one still alive for a moment must not come back. Asked to
        # register by a heartbeat that came after its release, it did, and its entry outlived its
        # process until the heartbeat timeout. Flink's active ResourceManager refuses unknown workers.
        self.released: set[str] = set()

    def register_task_manager(self, reg: TaskManagerRegistration, connection_id: bytes) -> list:
        if connection_id != reg.task_manager_id.encode():
            return [RejectRegistration(reg.task_manager_id, "task manager id does not match the connection")]
        if reg.number_of_slots < 1:
            return [RejectRegistration(reg.task_manager_id, "a TaskManager needs at least one slot")]
        if reg.task_manager_id in self.released:
            return [RejectRegistration(reg.task_manager_id, "released by the ResourceManager, which stops it")]
        out: list = []
        known = self.slot_manager.task_managers.get(reg.task_manager_id)
        if known is not None and known.registration_id != reg.registration_id:
            # Flink's "Replacing old registration of TaskExecutor": a new round means it gave us up
            # and cancelled its tasks, which its slots here would otherwise go on holding forever
            out += self.lose(reg.task_manager_id, f"TaskManager {reg.task_manager_id} registered again: it had "
                                                  "lost the JobManager and cancelled its tasks")
        new = self.slot_manager.register(reg)
        return [*out, AcceptRegistration(reg.task_manager_id, new), *self._allocate()]

    def heartbeat_from_task_manager(self, tm_id: str, tasks: list, now: float, spark: str = "") -> list:
        if not self.slot_manager.heartbeat(tm_id, now, tasks, spark):
            return [] if tm_id in self.released else [AskToRegister(tm_id)]
        return [AnswerHeartbeat(tm_id), ForwardMetrics(tuple(tasks))]

    def check_heartbeats(self, now: float) -> list:
        out: list = []
        for tm_id in self.slot_manager.expired(now, self.heartbeat_timeout_s):
            out += self.lose(tm_id, f"TaskManager {tm_id} lost: no heartbeat for "
                                    f"{self.heartbeat_timeout_s * 1000:.0f} ms (heartbeat.timeout)")
        return out

    def lose(self, tm_id: str, reason: str) -> list:
        if tm_id not in self.slot_manager.task_managers:
            return []
        self.slot_manager.unregister(tm_id)
        return [DeclareLost(tm_id, reason), *self._allocate()]

    def release(self, tm_id: str) -> list:
        """A TaskManager we stop (it is idle): its slots leave the table, no JobMaster is told."""
        self.slot_manager.unregister(tm_id)
        self.released.add(tm_id)
        return []

    def request_slots(self, job_id: str, count: int) -> list:
        self.slot_manager.request(job_id, count)
        return self._allocate()

    def cancel_slot_request(self, job_id: str) -> list:
        self.slot_manager.cancel_request(job_id)
        return []

    def release_slots(self, job_id: str) -> list:
        return [*(FreeSlotAt(a) for a in self.slot_manager.free(job_id)), *self._allocate()]

    def _allocate(self) -> list:
        out: list = []
        for allocations in self.slot_manager.allocate_pending():
            out += [RequestSlotAt(a) for a in allocations]
            out.append(GrantSlots(allocations[0].job_id, tuple(allocations)))
        return out


def task_manager_provider(conf, cluster_dir, jobmanager_address: str) -> Optional[ProcessTaskManagerProvider]:
    """What starts TaskManagers for ``resourcemanager.provider`` (None: standalone, nothing does)."""
    if conf.get(ResourceManagerOptions.PROVIDER) == "process":
        return ProcessTaskManagerProvider(cluster_dir, jobmanager_address)
    return None


class ResourceManager:
    def __init__(self, endpoint: RpcEndpoint, conf, clock: Callable[[], float] = time.monotonic,
                 provider: Optional[ProcessTaskManagerProvider] = None):
        self.endpoint = endpoint
        self.clock = clock
        self.heartbeat_interval_ms = conf.get(HeartbeatManagerOptions.HEARTBEAT_INTERVAL)
        self.state = ResourceManagerState(conf.get(HeartbeatManagerOptions.HEARTBEAT_TIMEOUT) / 1000, conf.get(ClusterOptions.EVENLY_SPREAD_OUT_SLOTS))
        self._peers: dict[str, Peer] = {}
        self._listeners: dict[str, SlotListener] = {}
        self.task_manager_lost_listeners: list[Callable[[str, str], None]] = []
        self.task_metrics_listeners: list[Callable[[list[dict]], None]] = []
        self.handlers = {
            m.RegisterTaskManager: self.register_task_manager,
            m.HeartbeatFromTaskManager: self.heartbeat_from_task_manager,
            m.DisconnectTaskManager: self.disconnect_task_manager,
        }
        # the instructions' results, if any, are not used
        self._execute: dict[type, Callable[[Any], object]] = {
            AcceptRegistration: self._accepted,
            RejectRegistration: self._rejected,
            AskToRegister: lambda i: self._send(i.task_manager_id, m.RequestRegistration()),
            AnswerHeartbeat: lambda i: self._send(i.task_manager_id, m.HeartbeatFromResourceManager()),
            RequestSlotAt: lambda i: self._send(i.allocation.task_manager_id, m.RequestSlot(
                i.allocation.slot_index, i.allocation.job_id, i.allocation.allocation_id)),
            FreeSlotAt: lambda i: self._send(i.allocation.task_manager_id, m.FreeSlot(i.allocation.allocation_id)),
            GrantSlots: self._granted,
            DeclareLost: self._declared_lost,
            ForwardMetrics: lambda i: [listener(list(i.tasks)) for listener in self.task_metrics_listeners],
        }
        self._pending_peers: dict[str, Peer] = {}  # the sender of the message being handled
        check_every = min(1.0, self.state.heartbeat_timeout_s / 4)
        endpoint.call_every(check_every, lambda: self._run(self.state.check_heartbeats(self.clock())))
        self.provider = provider
        self.active: Optional[ActiveResourceState] = None
        if provider is not None:
            self.active = ActiveResourceState(
                slots_per_task_manager=conf["taskmanager.numberOfTaskSlots"],
                max_slots=conf.get(ResourceManagerOptions.MAX_SLOT_NUM),
                min_slots=conf.get(ResourceManagerOptions.MIN_SLOT_NUM),
                idle_timeout_s=conf.get(ResourceManagerOptions.TASK_MANAGER_TIMEOUT) / 1000,
                registration_timeout_s=conf.get(ResourceManagerOptions.TASK_MANAGER_REGISTRATION_TIMEOUT) / 1000)
            self._execute |= {
                StartTaskManager: self._start_task_manager,
                StopTaskManager: self._stop_task_manager,
                SlotLimitReached: lambda i: log.warning(
                    "%d slots wanted, slotmanager.number-of-slots.max is %d: no more TaskManagers started",
                    i.wanted, i.max_slots),
                StartsGivenUp: lambda i: log.error(i.reason),
            }
            endpoint.call_every(min(1.0, self.active.idle_timeout_s / 4), self._check_task_manager_processes)
            endpoint.call_soon(self._run, [])  # the minimum of slots, before any request

    @property
    def slot_manager(self) -> SlotManager:
        return self.state.slot_manager

    def _run(self, instructions: list, sender: Optional[tuple[str, Peer]] = None) -> None:
        """Carry the instructions out; ``sender`` (TaskManager id, its connection) is where an
        answer to a TaskManager we do not know yet (or no longer) goes."""
        self.endpoint.assert_loop_thread()
        if sender is not None:
            self._pending_peers[sender[0]] = sender[1]
        try:
            for instruction in instructions:
                self._execute[type(instruction)](instruction)
            if self.active is not None:
                for instruction in self.active.reconcile(self._slot_demand(), self.clock()):
                    self._execute[type(instruction)](instruction)
        finally:
            if sender is not None:
                self._pending_peers.pop(sender[0], None)

    def _slot_demand(self) -> SlotDemand:
        sm = self.slot_manager
        return SlotDemand(pending=sum(sm.pending().values()), free=sm.free_slots, total=sm.total_slots,
                          busy=frozenset(t for t, reg in sm.task_managers.items()
                                         if sm.free_slots_of(t) < reg.number_of_slots))

    def _send(self, tm_id: str, msg: m.Message) -> None:
        peer = self._peers.get(tm_id) or self._pending_peers.get(tm_id)
        if peer is not None:
            self.endpoint.send(peer, msg)

    # ------------------------------------------------------------------ handlers
    def register_task_manager(self, msg: m.RegisterTaskManager, peer: Peer) -> None:
        now = self.clock()
        reg = TaskManagerRegistration(msg.task_manager_id, msg.data_address, msg.number_of_slots, msg.pid, now,
                                      now, dict(msg.hardware), registration_id=msg.registration_id, spark=msg.spark)
        self._run(self.state.register_task_manager(reg, peer.identity or b""), (msg.task_manager_id, peer))

    def sent_by(self, tm_id: str, peer: Peer, msg: m.Message) -> bool:
        """Whether ``peer`` is the connection of TaskManager ``tm_id``: the identity it registered
        with (and the ROUTER keeps it from being taken over). A message that speaks for another
        TaskManager is dropped, and logged rate-limited."""
        if peer.identity == tm_id.encode():
            return True
        self.endpoint.drops.drop("message for another TaskManager", peer.identity, f"{msg.op} speaks for {tm_id}")
        return False

    def heartbeat_from_task_manager(self, msg: m.HeartbeatFromTaskManager, peer: Peer) -> None:
        if not self.sent_by(msg.task_manager_id, peer, msg):
            return
        self._run(self.state.heartbeat_from_task_manager(msg.task_manager_id, msg.tasks, self.clock(), msg.spark),
                  (msg.task_manager_id, peer))

    def disconnect_task_manager(self, msg: m.DisconnectTaskManager, peer: Peer) -> None:
        if not self.sent_by(msg.task_manager_id, peer, msg):
            return
        self._run(self.state.lose(msg.task_manager_id,
                                  f"TaskManager {msg.task_manager_id} disconnected: {msg.reason}"))

    # ------------------------------------------------------------------ instructions
    def _accepted(self, i: AcceptRegistration) -> None:
        self._peers[i.task_manager_id] = self._pending_peers[i.task_manager_id]
        if i.new:
            reg = self.slot_manager.task_managers[i.task_manager_id]
            if self.active is not None:
                self.active.task_manager_registered(i.task_manager_id, reg.pid)
            log.info("TaskManager %s registered with %d slots (data %s)", i.task_manager_id, reg.number_of_slots,
                     reg.data_address)
        self._send(i.task_manager_id, m.RegistrationSuccess(self.heartbeat_interval_ms))

    def _rejected(self, i: RejectRegistration) -> None:
        log.warning("registration of %s refused: %s", i.task_manager_id, i.reason)
        self._send(i.task_manager_id, m.RegistrationRejected(i.reason))

    def _granted(self, i: GrantSlots) -> None:
        listener = self._listeners.get(i.job_id)
        if listener:
            listener.on_slots_allocated(list(i.allocations))

    def _declared_lost(self, i: DeclareLost) -> None:
        log.warning(i.reason)
        self._peers.pop(i.task_manager_id, None)
        if self.active is not None:
            self.active.task_manager_lost(i.task_manager_id, self.clock())
        for listener in self.task_manager_lost_listeners:
            listener(i.task_manager_id, i.reason)

    # ------------------------------------------------------------------ slots, for JobMasters
    def request_slots(self, job_id: str, count: int, listener: SlotListener) -> None:
        self._listeners[job_id] = listener
        if self.active is not None:
            self.active.slots_requested()
        self._run(self.state.request_slots(job_id, count))

    def cancel_slot_request(self, job_id: str) -> None:
        self._run(self.state.cancel_slot_request(job_id))

    def release_slots(self, job_id: str) -> None:
        self._listeners.pop(job_id, None)
        self._run(self.state.release_slots(job_id))

    def task_executor_gateway(self, tm_id: str):
        peer = self._peers.get(tm_id)
        return TaskExecutorGateway(self.endpoint, peer) if peer else None

    def data_address(self, tm_id: str) -> str:
        return self.slot_manager.task_managers[tm_id].data_address

    def shutdown_task_managers(self) -> None:
        for tm_id in list(self._peers):
            self.task_executor_gateway(tm_id).shutdown()

    # ------------------------------------------------------------------ started TaskManagers
    def _start_task_manager(self, i: StartTaskManager) -> None:
        assert self.active is not None and self.provider is not None  # active mode only
        try:
            pid = self.provider.start(i.worker_id)
        except OSError as exc:
            log.error("TaskManager %s could not be started: %s", i.worker_id, exc)
            self._run(self.active.process_exited(i.worker_id, str(exc)))
            return
        self.active.process_started(i.worker_id, pid)
        log.info("TaskManager %s started (pid %d) for slots requested", i.worker_id, pid)

    def _stop_task_manager(self, i: StopTaskManager) -> None:
        assert self.active is not None and self.provider is not None  # active mode only
        log.info("stopping TaskManager %s: %s", i.worker_id, i.reason)
        if i.task_manager_id is not None:
            self._peers.pop(i.task_manager_id, None)
            self.state.release(i.task_manager_id)
        self.provider.stop(i.worker_id)

    def _check_task_manager_processes(self) -> None:
        self.endpoint.assert_loop_thread()
        assert self.active is not None and self.provider is not None
        out: list = []
        for worker_id, why in self.provider.poll_exited():
            log.warning("TaskManager %s exited: %s", worker_id, why)
            out += self.active.process_exited(worker_id, why)
        self._run(out)  # and the idle and registration timeouts

    def stop_started_task_managers(self, timeout: float = 10.0) -> None:
        """Stop every TaskManager process this ResourceManager started and wait until they are gone.
        For JobManager shutdown, from any thread once the loop has stopped (or from the loop itself
        as its last act)."""
        if self.provider is not None:
            self.provider.stop_all(timeout)
