"""The JobManager's event publisher, on the real Dispatcher, ResourceManager and JobMaster of an
endpoint that is never started: the test plays the TaskManager's messages into the handlers,
takes the published events from ``send`` and runs the loop's deferred calls itself. The last
test puts the publisher on its real XPUB socket with five subscribers."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from cluster.conf import Configuration
from cluster.jobmanager.dispatcher import Dispatcher
from cluster.jobmanager.events import CLUSTER_TOPIC, EventSocket, JobEventPublisher, job_topic
from cluster.jobmanager.resourcemanager.resource_manager import ResourceManager
from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from cluster.protocol.endpoint import Peer, RpcEndpoint
from cluster.protocol.sockets import subscribe_to
from kernel_runtime import StreamEnvironment
from tests.conftest import wait_for

TM = "tm-1"


class Harness:
    def __init__(self, tmp_path, publisher_send=None):
        conf = Configuration({"execution.checkpointing.dir": str(tmp_path / "checkpoints"),
                              "state.savepoints.dir": str(tmp_path / "savepoints"),
                              "taskmanager.numberOfTaskSlots": 2})
        self.endpoint = RpcEndpoint("jm-test", Codec(b"s" * 32))
        # the JobManager's own socket towards the TaskManager: with nobody connected as the
        # TaskManager, what the JobManager sends it is dropped unread
        self.endpoint.bind_router(f"inproc://events-test-{id(self)}")
        self.tm_socket = self.endpoint._sockets[-1]
        self.rm = ResourceManager(self.endpoint, conf)
        self.storage = ThreadPoolExecutor(max_workers=1)  # only a savepoint or checkpoint would use it
        self.dispatcher = Dispatcher(self.endpoint, self.rm, conf, lambda: None, self.storage)
        self.sent: list[tuple[bytes, m.Message]] = []
        self.deferred: list = []
        self.publisher = JobEventPublisher(self.dispatcher, 1000, publisher_send or self._send, self.deferred.append)
        tm = self.tm_peer = Peer(self.tm_socket, TM.encode())
        self.rm.register_task_manager(m.RegisterTaskManager(TM, "tcp://127.0.0.1:1", 2, 1, {}, "r1", ""), tm)

    def _send(self, topic: bytes, msg: m.Message) -> None:
        self.sent.append((topic, msg))

    def run_deferred(self) -> None:
        while self.deferred:
            self.deferred.pop(0)()

    def submit(self, name: str = "job") -> str:
        env = StreamEnvironment(parallelism=1)
        env.from_generator(count=10).collect()
        graph = env.get_job_graph(name)
        self.dispatcher.submit_job(m.SubmitJob(graph.to_dict(), None), None)
        return graph.job_id

    def deploy(self, job_id: str) -> None:
        allocations = [a.allocation_id for a in self.rm.slot_manager.allocations_of(job_id)]
        self.dispatcher.handlers[m.OfferSlots](m.OfferSlots(TM, job_id, allocations), self.tm_peer)
        self.run_deferred()

    def report(self, job_id: str, state: str, error=None, metrics=None) -> None:
        for execution_id in list(self.dispatcher.jobs[job_id].graph.executions):
            self.dispatcher.handlers[m.UpdateTaskExecutionState](
                m.UpdateTaskExecutionState(job_id, execution_id, state, error, metrics or {}), self.tm_peer)
        self.run_deferred()

    def metrics(self, job_id: str, **values) -> None:
        self.dispatcher._task_metrics([{"execution_id": e, "job_id": job_id} | values
                                       for e in self.dispatcher.jobs[job_id].graph.executions])

    def events(self, kind, job_id=None) -> list:
        return [msg for topic, msg in self.sent if isinstance(msg, kind)
                and (job_id is None or topic == job_topic(job_id))]


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.tm_socket.close(0)
    h.storage.shutdown()


def test_status_changes_go_out_in_order_with_consecutive_sequence_numbers(harness):
    job_id = harness.submit()
    harness.deploy(job_id)
    harness.report(job_id, "RUNNING")
    harness.report(job_id, "FINISHED")
    statuses = harness.events(m.JobStatusChanged, job_id)
    assert [s.state for s in statuses] == ["CREATED", "RUNNING", "FINISHED"]
    assert [s.sequence for s in statuses] == [1, 2, 3]
    # each carries the reason as settled once its handler finished: none once deployed
    assert "offer the allocated slots" in statuses[0].reason and statuses[1].reason is None
    assert statuses[2].timestamp == harness.dispatcher.jobs[job_id].graph.timestamps["FINISHED"]


def test_a_failed_job_publishes_failing_then_failed_with_its_cause(harness):
    job_id = harness.submit()
    harness.deploy(job_id)
    harness.report(job_id, "FAILED", error="ValueError: the user's function broke")
    failing, failed = harness.events(m.JobStatusChanged, job_id)[-2:]
    assert (failing.state, failed.state) == ("FAILING", "FAILED")
    assert "ValueError: the user's function broke" in failing.failure
    assert "ValueError: the user's function broke" in failed.failure and "not restarted" in failed.failure


def test_a_summary_goes_out_once_per_tick_only_when_changed_and_only_if_watched(harness):
    job_id = harness.submit()
    harness.deploy(job_id)
    harness.report(job_id, "RUNNING")
    harness.metrics(job_id, **{"records-in": 10, "idleTimeMsPerSecond": 1000.0})
    harness.publisher.tick()
    assert harness.events(m.JobSummaryUpdated) == [] and harness.publisher.summaries_built == 0  # nobody watches

    harness.publisher.subscription_changed(job_topic(job_id), True)
    for n in range(5):  # five heartbeats between two ticks: coalesced into one summary
        harness.metrics(job_id, **{"records-in": 100 + n, "idleTimeMsPerSecond": 1000.0})
    harness.publisher.tick()
    (summary,) = harness.events(m.JobSummaryUpdated, job_id)
    (subtask,) = summary.summary["subtasks"]
    assert subtask["metrics"] == {"records-in": 104, "idleTimeMsPerSecond": 1000.0}
    assert summary.summary["state"] == "RUNNING" and summary.summary["vertices"][0]["status"] == "RUNNING"

    time.sleep(0.01)  # only the clock moves: its duration is no change worth an event
    harness.publisher.tick()
    assert len(harness.events(m.JobSummaryUpdated, job_id)) == 1
    harness.metrics(job_id, **{"records-in": 200, "idleTimeMsPerSecond": 1000.0})
    harness.publisher.tick()
    latest = harness.events(m.JobSummaryUpdated, job_id)
    assert len(latest) == 2 and harness.publisher.summaries_built == 3
    # status and summary share the job's sequence; the heartbeat names the latest
    sequences = [msg.sequence for msg in harness.events(m.JobStatusChanged, job_id) + latest]
    assert sorted(sequences) == list(range(1, len(sequences) + 1))
    heartbeat = harness.events(m.EventsHeartbeat)[-1]
    assert heartbeat.job_sequences == {job_id: max(sequences)} and heartbeat.interval_ms == 1000


def test_why_a_job_waits_is_published_when_it_changes_without_a_state_change(harness):
    job_id = harness.submit()
    harness.deploy(job_id)
    harness.metrics(job_id, detail="starting Spark")  # a task waits for its SparkSession
    harness.publisher.tick()
    harness.publisher.tick()
    latest = harness.events(m.JobStatusChanged, job_id)
    assert [s.state for s in latest] == ["CREATED", "RUNNING", "RUNNING"]
    assert latest[-1].reason.startswith("starting Spark (TaskManager tm-1)")


def test_the_slot_table_is_published_when_it_changes(harness):
    harness.publisher.tick()
    (first,) = harness.events(m.ClusterOverviewChanged)
    assert first.overview["slots-available"] == 2 and first.sequence == 1
    harness.publisher.tick()
    assert len(harness.events(m.ClusterOverviewChanged)) == 1  # unchanged: nothing
    job_id = harness.submit()
    harness.publisher.tick()
    second = harness.events(m.ClusterOverviewChanged)[-1]
    assert second.sequence == 2 and second.overview["slots-available"] == 1
    assert second.taskmanagers[0]["slots"][0]["job_id"] == job_id


def test_a_snapshot_counts_every_change_it_shows(harness):
    job_id = harness.submit()
    harness.deploy(job_id)
    harness.report(job_id, "RUNNING")
    harness.dispatcher.jobs[job_id].cancel()  # a change whose event is not out yet
    snapshot = harness.publisher.request_job_snapshot(m.RequestJobSnapshot(job_id), None)
    statuses = harness.events(m.JobStatusChanged, job_id)
    assert statuses[-1].state == "CANCELLING" and snapshot.sequence == statuses[-1].sequence
    assert snapshot.status["state"] == "CANCELLING" and snapshot.plan["nodes"]
    assert snapshot.summary["subtasks"] and snapshot.overview["slots-total"] == 2


def test_one_message_per_update_for_every_subscriber_however_many(tmp_path):
    ctx = zmq.Context.instance()
    codec = Codec(b"s" * 32)
    socket = EventSocket(ctx, codec, "tcp://127.0.0.1:0")
    harness = Harness(tmp_path, publisher_send=socket.send)
    subscribers = []
    receivers = {}
    try:
        job_id = harness.submit()
        harness.deploy(job_id)
        harness.report(job_id, "RUNNING")
        for _ in range(5):
            sub = ctx.socket(zmq.SUB)
            receivers[sub] = Codec(b"s" * 32)  # a process of its own each: its own replay window, from before it subscribed
            sub.setsockopt(zmq.SUBSCRIBE, job_topic(job_id))
            subscribe_to(sub, socket.address, codec)
            subscribers.append(sub)
        changes = []
        deadline = time.monotonic() + 10
        while not changes and time.monotonic() < deadline:  # the first subscriber's arrives; the others' are folded
            changes = socket.subscriptions()
            time.sleep(0.01)
        assert changes == [(True, job_topic(job_id))]
        for subscribed, topic in changes:
            harness.publisher.subscription_changed(topic, subscribed)
        # every subscription has reached the socket (nothing tells a PUB when): probes on the
        # job's topic until each subscriber has heard one (later probes still on their way come
        # before the updates: one socket's messages to a subscriber keep their order)
        heard: set[int] = set()

        def every_subscriber_heard() -> bool:
            socket.send(job_topic(job_id), m.Acknowledge())
            for i, sub in enumerate(subscribers):
                while sub.poll(0):
                    sub.recv_multipart()
                    heard.add(i)
            return len(heard) == len(subscribers)
        wait_for(every_subscriber_heard, 10, "every subscription at the socket")

        for n in range(3):
            harness.metrics(job_id, **{"records-in": n + 1})
            harness.publisher.tick()
        assert harness.publisher.summaries_built == 3  # built once per update, not once per subscriber
        harness.publisher.tick()  # a heartbeat's turn with nothing changed: the cluster's topic only
        socket.send(job_topic(job_id), m.ErrorResponse("end of the test"))  # the last on the topic
        for sub in subscribers:
            got = []
            receiver = receivers[sub]
            while not (got and isinstance(got[-1], m.ErrorResponse)) and sub.poll(10_000):
                topic, *frames = sub.recv_multipart()
                msg, _, _ = receiver.decode(frames)
                if got or not isinstance(msg, m.Acknowledge):  # probes still on their way come first
                    got.append(msg)
            # the three updates, and nothing else on a job's topic before the end: the heartbeat is the cluster's
            assert [(type(g), g.summary["subtasks"][0]["metrics"]["records-in"]) for g in got[:-1]] == \
                [(m.JobSummaryUpdated, 1), (m.JobSummaryUpdated, 2), (m.JobSummaryUpdated, 3)], got
            assert got[-1] == m.ErrorResponse("end of the test")
    finally:
        for sub in subscribers:
            sub.close(0)
        socket.close()
        harness.tm_socket.close(0)


def test_the_cluster_topic_is_no_job_topic():
    assert not job_topic("c").startswith(CLUSTER_TOPIC) and not job_topic("ab").startswith(job_topic("a"))


def _handshake_of(sock: zmq.Socket, monitor: zmq.Socket, timeout_s: float = 10.0) -> int:
    """The first handshake outcome ``sock``'s monitor (made before it connected) reports."""
    outcomes = (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_DISCONNECTED)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if monitor.poll(100):
                event = recv_monitor_message(monitor)["event"]
                if event in outcomes:
                    return event
        raise AssertionError("no handshake outcome reported")
    finally:
        sock.disable_monitor()
        monitor.close(0)


def test_only_holders_of_the_cluster_secret_can_read_the_events():
    # the events leave signed but a publisher sends to whoever subscribes: without the handshake
    # anyone on the host read job names, state changes and the TaskManager table
    ctx = zmq.Context.instance()
    codec = Codec(b"s" * 32)
    socket = EventSocket(ctx, codec, "tcp://127.0.0.1:0")
    receiver = Codec(b"s" * 32)
    plain, stranger, member = (ctx.socket(zmq.SUB) for _ in range(3))
    try:
        monitors = {}
        for sub in (plain, stranger, member):
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            monitors[sub] = sub.get_monitor_socket()
        plain.connect(socket.address)  # as any process could
        subscribe_to(stranger, socket.address, Codec(b"o" * 32))  # another cluster's secret
        subscribe_to(member, socket.address, codec)
        assert _handshake_of(member, monitors[member]) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert _handshake_of(plain, monitors[plain]) != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert _handshake_of(stranger, monitors[stranger]) != zmq.EVENT_HANDSHAKE_SUCCEEDED

        def member_heard() -> bool:
            socket.send(CLUSTER_TOPIC, m.Acknowledge())
            return member.poll(50) != 0
        wait_for(member_heard, 10, "the member to hear the events")
        topic, *frames = member.recv_multipart()
        assert topic == CLUSTER_TOPIC and receiver.decode(frames)[0] == m.Acknowledge()
        assert not plain.poll(0) and not stranger.poll(0)
    finally:
        for sub in (plain, stranger, member):
            sub.close(0)
        socket.close()
