"""A StreamTask on its own thread, with a real data socket: how it reads its job's configuration."""
import queue
import secrets
from concurrent.futures import ThreadPoolExecutor

import pytest

from cluster.graph.deployment import TaskDeploymentDescriptor
from cluster.protocol.states import ExecutionState
from cluster.protocol.codec import Codec
from cluster.taskmanager.network import NetworkEnvironment
from cluster.taskmanager.stream_task import StreamTask

TERMINAL = (ExecutionState.FINISHED, ExecutionState.FAILED, ExecutionState.CANCELED)


class Responder:
    def __init__(self, events: queue.Queue):
        self.events = events

    def acknowledge_checkpoint(self, task, checkpoint_id, state):
        self.events.put(("ack", checkpoint_id))

    def decline_checkpoint(self, task, checkpoint_id, reason):
        self.events.put(("decline", checkpoint_id))

    def end_of_input(self, task):
        self.events.put(("end-of-input", None))
        task.cancel()  # no JobManager here to run the final checkpoint


@pytest.fixture
def network():
    env = NetworkEnvironment("127.0.0.1", 0, Codec(secrets.token_bytes(32)), 2)
    env.start()
    yield env
    env.stop()


def generator_to_print(job_config: dict) -> TaskDeploymentDescriptor:
    """A task of ten generated rows into a print sink."""
    return TaskDeploymentDescriptor(
        job_id="job", job_name="test", attempt=0, execution_id="e1", allocation_id="a1",
        vertex={"id": "v", "name": "v", "parallelism": 1, "max_parallelism": 128, "operators": [
            {"uid": "src", "kind": "generator-source", "name": "gen", "call_site": "t.py:1",
             "params": {"count": 10, "batch_size": 5}, "udf": None},
            {"uid": "out", "kind": "print-sink", "name": "print", "call_site": "t.py:2", "params": {}, "udf": None}]},
        subtask=0, inputs=[], outputs=[], job_config=job_config)


def run_task(network, job_config: dict) -> tuple[str, str, list]:
    """Run a generator -> print-sink task to its end: (final state, error, other events)."""
    tdd = generator_to_print(job_config)
    events: queue.Queue = queue.Queue()
    with ThreadPoolExecutor(1) as executor:
        task = StreamTask(tdd, network, lambda t, state, error: events.put((state, error)), Responder(events), executor)
        task.start()
        seen = []
        while True:
            event = events.get(timeout=30)
            if event[0] in TERMINAL:
                return event[0], event[1], seen
            seen.append(event[0])


def test_a_bad_value_in_the_job_configuration_fails_the_task_naming_the_key(network):
    state, error, _ = run_task(network, {"execution.batch-size": "lots"})
    assert state == ExecutionState.FAILED
    assert "invalid value 'lots' for 'execution.batch-size' in the configuration of job job" in error


def test_the_task_reads_checkpointing_from_the_job_configuration(network):
    state, _, seen = run_task(network, {})
    assert state == ExecutionState.FINISHED and "end-of-input" not in seen
    # with checkpoints a bounded source waits for a final checkpoint instead of finishing
    state, _, seen = run_task(network, {"execution.checkpointing.interval": "1 s"})
    assert state == ExecutionState.CANCELED and "end-of-input" in seen


def test_a_source_reads_only_once_its_consumers_have_opened(network):
    """Their opening checks what it can (a Spark chain's plan): a failure there must find no row read."""
    from cluster.graph.deployment import OutputDescriptor
    from cluster.taskmanager.network import InputGate
    channel = "job/0/e1->e2"
    tdd = TaskDeploymentDescriptor(
        job_id="job", job_name="test", attempt=0, execution_id="e1", allocation_id="a1",
        vertex={"id": "v", "name": "v", "parallelism": 1, "max_parallelism": 128, "operators": [
            {"uid": "src", "kind": "generator-source", "name": "gen", "call_site": "t.py:1",
             "params": {"count": 10, "batch_size": 5}, "udf": None}]},
        subtask=0, inputs=[], outputs=[OutputDescriptor(0, "FORWARD", [], 128, [(channel, network.data_address)])],
        job_config={})
    states: queue.Queue = queue.Queue()
    with ThreadPoolExecutor(1) as executor:
        task = StreamTask(tdd, network, lambda t, state, error: states.put(state), Responder(queue.Queue()), executor)
        task.start()
        assert states.get(timeout=30) == ExecutionState.INITIALIZING
        with pytest.raises(queue.Empty):
            states.get(timeout=0.5)
        assert task.detail == "waiting for the downstream tasks to open"
        assert task.metrics_snapshot()["records-in"] == 0
        gate = InputGate([channel])  # the consumer opens: it registers the channel and grants credit
        network.register_gate(gate)
        network.credit_account(channel).add(4)
        assert states.get(timeout=30) == ExecutionState.RUNNING
        assert states.get(timeout=30) == ExecutionState.FINISHED
        assert task.metrics_snapshot()["records-in"] == 10


def test_a_state_report_carries_the_figures_the_task_thread_read_and_a_failed_read_keeps_the_last(network, caplog):
    """The TaskManager's loop sends what the task read (its heartbeats, its state reports) and never
    reads a Spark chain's figures itself: a JVM busy collecting, or gone, held its heartbeats."""
    import logging
    reported: dict = {}

    def report(task, state, error):
        reported[state] = task.reported_metrics
    with ThreadPoolExecutor(1) as executor:
        task = StreamTask(generator_to_print({}), network, report, Responder(queue.Queue()), executor)
        task.start()
        task._thread.join(30)
    assert reported[ExecutionState.FINISHED]["records-in"] == 10  # as the task thread read them at its end
    assert reported[ExecutionState.INITIALIZING]["records-in"] == 0

    def broken():
        raise ConnectionRefusedError(111, "Connection refused")
    task.metrics_snapshot = broken
    with caplog.at_level(logging.WARNING):
        assert task.sample_metrics()["records-in"] == 10
        assert task.sample_metrics()["records-in"] == 10
    warned = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert warned == ["v (1/1): its metrics could not be read (ConnectionRefusedError: "
                      "[Errno 111] Connection refused); they keep their last values"]
