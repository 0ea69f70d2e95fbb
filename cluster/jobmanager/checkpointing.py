"""A job's checkpoints, as the JobMaster runs them around the pure CheckpointCoordinator.

Triggers barriers at the source tasks (periodically, for a savepoint, or once every source has
read all of its input: the final checkpoint, after which the sources end), collects the tasks'
acknowledgements (and the client's, for collect sinks: a checkpoint covers only rows the client
holds), writes ``_metadata`` last, tells the tasks so the sinks commit, and finds the newest
checkpoint that is really there when the job restarts.
"""
from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from cluster.clock import now_ms
from cluster.checkpoint.coordinator import CheckpointCoordinator, CompletedCheckpoint, PendingCheckpoint
from cluster.checkpoint.storage import (CheckpointFormatError, CheckpointStorage, dispose, local_path,
                                        read_metadata, write_metadata)
from cluster.graph.execution_graph import ExecutionState
from cluster.protocol import messages as m
from cluster.protocol.endpoint import RpcError

if TYPE_CHECKING:
    from .job_master import JobMaster

log = logging.getLogger(__name__)
FINAL_RETRY_S = 0.2


def restore_plan(body: dict, directory: Path) -> dict:
    """What the tasks need from a checkpoint's metadata: every subtask's handles per operator."""
    return {"checkpoint_id": body["checkpoint_id"], "directory": str(directory),
            "operators": {uid: op["subtasks"] for uid, op in body["operators"].items()}}


class JobCheckpointing:
    def __init__(self, job_master: "JobMaster"):
        self.jm = job_master
        conf = job_master.conf
        self.interval_ms = conf["execution.checkpointing.interval"]
        self.coordinator = CheckpointCoordinator(
            self.interval_ms, conf["execution.checkpointing.timeout"], conf["execution.checkpointing.min-pause"],
            conf["execution.checkpointing.max-concurrent-checkpoints"], conf["state.checkpoints.num-retained"])
        self.storage = CheckpointStorage(conf["execution.checkpointing.dir"], conf["state.savepoints.dir"],
                                         job_master.job_id)
        self.restore: Optional[dict] = None  # what the next deployment starts from
        self.savepoint_requests: dict[str, dict] = {}  # REST trigger id -> status
        self._timer = None
        self._exhausted: set[str] = set()

    # ------------------------------------------------------------------ lifecycle
    def on_running(self) -> None:
        self._exhausted.clear()
        if self.interval_ms > 0:
            self._timer = self.jm.endpoint.call_later(self.interval_ms / 1000, self._tick)

    def on_stopped(self, reason: str) -> None:
        self.jm.endpoint.cancel_timer(self._timer)
        self._timer = None
        self.coordinator.abort_all(reason, now_ms())

    def _tick(self) -> None:
        self._timer = self.jm.endpoint.call_later(self.interval_ms / 1000, self._tick)
        for expired in self.coordinator.expire(now_ms()):
            log.warning("job %s: checkpoint %d %s", self.jm.job_id, expired.checkpoint_id,
                        self.coordinator.records[expired.checkpoint_id].failure)
            self._notify_aborted(expired.checkpoint_id)
        if self._all_running() and self.coordinator.why_not_trigger(now_ms()) is None:
            self.trigger("checkpoint")

    def _all_running(self) -> bool:
        return self.jm.state == "RUNNING" and all(
            e.state == ExecutionState.RUNNING for e in self.jm.graph.executions.values())

    # ------------------------------------------------------------------ triggering
    def _participants(self) -> list[str]:
        participants = list(self.jm.graph.executions)
        if self.jm.result_address is not None:
            for v in self.jm.job_graph.vertices:
                for op in v.operators:
                    if op.kind == "collect-sink":
                        participants += [f"collect/{op.uid}/{s}" for s in range(v.parallelism)]
        return participants

    def trigger(self, kind: str, directory: Optional[Path] = None) -> PendingCheckpoint:
        pending = self.coordinator.trigger(
            now_ms(), self._participants(), lambda n: str(directory or self.storage.checkpoint_dir(n)), kind)
        for e in self.jm.graph.executions.values():
            if e.vertex.is_source:
                gateway = self.jm.rm.task_executor_gateway(e.task_manager_id)
                if gateway is not None:
                    gateway.trigger_checkpoint(self.jm.job_id, e.execution_id, pending.checkpoint_id,
                                               pending.trigger_ms, kind, pending.directory)
        return pending

    def trigger_savepoint(self, target: Optional[str], stop: bool) -> PendingCheckpoint:
        if not self._all_running():
            raise RpcError(f"job {self.jm.job_id} is {self.jm.state}: a savepoint needs every task RUNNING")
        return self.trigger("stop" if stop else "savepoint", self.storage.new_savepoint_dir(target))

    def trigger_savepoint_async(self, target: Optional[str], stop: bool) -> str:
        """For REST: Flink's asynchronous operation, polled by its trigger id."""
        trigger_id = uuid.uuid4().hex
        pending = self.trigger_savepoint(target, stop)
        self.savepoint_requests[trigger_id] = {"status": "IN_PROGRESS"}

        def done(completed: Optional[CompletedCheckpoint], reason: Optional[str]) -> None:
            self.savepoint_requests[trigger_id] = (
                {"status": "COMPLETED", "location": completed.directory} if completed
                else {"status": "COMPLETED", "failure": reason})
        pending.on_done.append(done)
        return trigger_id

    # ------------------------------------------------------------------ acknowledgements
    def acknowledge_checkpoint(self, msg: m.AcknowledgeCheckpoint) -> None:
        if msg.execution_id in self.jm.graph.executions:
            self._ack(msg.checkpoint_id, msg.execution_id, msg.state)

    def acknowledge_collect(self, msg: m.AcknowledgeCollect) -> None:
        if msg.attempt == self.jm.graph.attempt:
            self._ack(msg.checkpoint_id, f"collect/{msg.sink}/{msg.subtask}", {})

    def _ack(self, checkpoint_id: int, participant: str, state: dict) -> None:
        pending = self.coordinator.acknowledge(checkpoint_id, participant, state, now_ms())
        if pending is not None:
            self._complete(pending)

    def decline_checkpoint(self, msg: m.DeclineCheckpoint) -> None:
        if self.coordinator.decline(msg.checkpoint_id, msg.execution_id, msg.reason, now_ms()) is not None:
            log.warning("job %s: checkpoint %d declined: %s", self.jm.job_id, msg.checkpoint_id, msg.reason)
            self._notify_aborted(msg.checkpoint_id)

    def end_of_input(self, msg: m.EndOfInput) -> None:
        self._exhausted.add(msg.execution_id)
        sources = {e.execution_id for e in self.jm.graph.executions.values() if e.vertex.is_source}
        if sources <= self._exhausted:
            self._trigger_final()

    def _trigger_final(self) -> None:
        if self.jm.state != "RUNNING":
            return
        if any(p.kind == "final" for p in self.coordinator.pending.values()):
            return
        pending = self.trigger("final")

        def retry(completed, reason) -> None:
            if completed is None:
                self.jm.endpoint.call_later(FINAL_RETRY_S, self._trigger_final)
        pending.on_done.append(retry)

    # ------------------------------------------------------------------ completion
    def _complete(self, pending: PendingCheckpoint) -> None:
        operators: dict[str, dict] = {}
        size = 0
        tasks: dict[str, dict] = {}
        for participant, state in pending.acks.items():
            execution = self.jm.graph.executions.get(participant)
            if execution is None:
                continue  # a client's collect acknowledgement carries no state
            stats = tasks.setdefault(execution.vertex.id, {"num_subtasks": execution.vertex.parallelism,
                                                           "num_acknowledged_subtasks": 0, "size": 0,
                                                           "latest_ack": 0})
            stats["num_acknowledged_subtasks"] += 1
            stats["size"] += sum(int(h.get("bytes", 0)) for h in state.values())
            stats["latest_ack"] = max(stats["latest_ack"], pending.ack_times[participant])
            for uid, handle in state.items():
                entry = operators.setdefault(uid, {"vertex": execution.vertex.name,
                                                   "max_parallelism": execution.vertex.max_parallelism,
                                                   "subtasks": []})
                entry["subtasks"].append(dict(handle, subtask=execution.subtask,
                                              parallelism=execution.vertex.parallelism))
                size += int(handle.get("bytes", 0))
        body = {"job_id": self.jm.job_id, "job_name": self.jm.job_graph.name, "checkpoint_id": pending.checkpoint_id,
                "kind": pending.kind, "timestamp": pending.trigger_ms, "operators": operators}
        try:
            write_metadata(Path(pending.directory), body)
        except OSError as exc:
            self.coordinator.abort(pending.checkpoint_id, f"writing _metadata failed: {exc}", now_ms())
            self._notify_aborted(pending.checkpoint_id)
            return
        completed, dropped = self.coordinator.complete(pending, now_ms(), size)
        self.coordinator.records[completed.checkpoint_id].tasks = tasks
        for old in dropped:
            dispose(Path(old.directory))
        log.info("job %s: %s %d complete (%d bytes, %d ms)", self.jm.job_id, completed.kind, completed.checkpoint_id,
                 size, completed.end_ms - completed.trigger_ms)
        for gateway in self._gateways():
            gateway.notify_checkpoint_complete(self.jm.job_id, completed.checkpoint_id)

    def _notify_aborted(self, checkpoint_id: int) -> None:
        for gateway in self._gateways():
            gateway.notify_checkpoint_aborted(self.jm.job_id, checkpoint_id)

    def _gateways(self) -> list:
        tms = {e.task_manager_id for e in self.jm.graph.executions.values() if e.task_manager_id}
        return [g for g in (self.jm.rm.task_executor_gateway(t) for t in sorted(tms)) if g is not None]

    # ------------------------------------------------------------------ restore
    def find_restore_point(self) -> Optional[dict]:
        """The newest checkpoint whose _metadata is there and sound; broken ones are skipped, logged."""
        candidates = [(c.checkpoint_id, Path(c.directory)) for c in reversed(self.coordinator.completed)]
        seen = {cid for cid, _ in candidates}
        candidates += [(cid, d) for cid, d in self.storage.completed_on_disk() if cid not in seen]
        for checkpoint_id, directory in sorted(candidates, key=lambda c: c[0], reverse=True):
            try:
                body = read_metadata(directory)
            except CheckpointFormatError as exc:
                log.warning("job %s: checkpoint %d skipped for recovery: %s", self.jm.job_id, checkpoint_id, exc)
                continue
            return self._restored(body, directory, is_savepoint=False)
        return self.restore  # none taken yet: start again from where the job first started

    def restore_from_path(self, path: str) -> dict:
        directory = Path(local_path(path))
        try:
            body = read_metadata(directory)
        except CheckpointFormatError as exc:
            raise RpcError(f"cannot start from savepoint {path}: {exc}") from None
        plan = self._restored(body, directory, is_savepoint=True)
        unknown = set(plan["operators"]) - {o.uid for v in self.jm.job_graph.vertices for o in v.operators}
        if unknown:
            raise RpcError(f"cannot start from savepoint {path}: it has state for {len(unknown)} operator(s) this "
                           f"job does not have (was the pipeline changed?)")
        return plan

    def _restored(self, body: dict, directory: Path, is_savepoint: bool) -> dict:
        self.coordinator.start_ids_after(body["checkpoint_id"])
        self.coordinator.restored = (body["checkpoint_id"], now_ms(), str(directory), is_savepoint)
        self.restore = restore_plan(body, directory)
        return self.restore
