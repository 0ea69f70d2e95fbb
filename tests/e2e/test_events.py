"""Job events on a real 2 x 2 cluster: what a subscriber sees, how soon wait() hears of the end,
and that dashboards cost the JobManager nothing more per dashboard."""
from __future__ import annotations

import time

import pandas as pd
import pytest
import zmq

from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from cluster.protocol.sockets import subscribe_to
from kernel_runtime import JobExecutionError, StreamEnvironment
from kernel_runtime.notebook.widgets.feed import JobFeed, _direct

from ..conftest import wait_for

CLIENT_OPS = ("request-job-status", "request-job-details", "request-cluster-overview", "request-job-snapshot",
              "list-jobs")


class Subscriber:
    """A bare SUB socket on the events address, as any holder of the cluster secret could open one."""

    def __init__(self, cluster, job_id: str):
        self.codec = Codec(cluster.info.secret)
        self.job_id = job_id
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        for topic in (f"job/{job_id}/".encode(), b"cluster/"):
            self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        subscribe_to(self.sock, cluster.info.events_address, self.codec)
        self.received: list[m.Message] = []
        # subscribed to both before connecting, so the first heartbeat says both are in place
        self.until(lambda msg: isinstance(msg, m.EventsHeartbeat), 10)

    def until(self, done, timeout: float) -> m.Message:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(100):
                topic, *frames = self.sock.recv_multipart()
                msg, _, _ = self.codec.decode(frames)
                self.received.append(msg)
                if done(msg):
                    return msg
        raise AssertionError(f"no such event within {timeout} s; got {[x.op for x in self.received]}")

    def statuses(self) -> list[m.JobStatusChanged]:
        return [x for x in self.received if isinstance(x, m.JobStatusChanged)]

    def close(self) -> None:
        self.sock.close(0)


def ended(msg) -> bool:
    return isinstance(msg, m.JobStatusChanged) and msg.state in ("FINISHED", "FAILED", "CANCELED")


def test_a_subscriber_sees_created_running_finished_in_order(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    env.from_generator(count=3_000, batch_size=100).collect()
    graph = env.get_job_graph("followed")
    sub = Subscriber(cluster, graph.job_id)  # before the job exists: its id is the client's
    try:
        client.submit(graph)
        sub.until(ended, 60)
        states = [s.state for s in sub.statuses()]
        # a state is published again when only why the job waits changed
        assert [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]] == ["CREATED", "RUNNING", "FINISHED"]
        # the job is watched (the JobManager saw the subscription): its final summary follows its end
        final = sub.until(lambda x: isinstance(x, m.JobSummaryUpdated) and x.summary["state"] == "FINISHED", 10)
        assert final.summary["jid"] == graph.job_id and len(final.summary["subtasks"]) == 2
        assert sum(s["metrics"]["records-in"] for s in final.summary["subtasks"] if "Source" in s["vertex"]) == 3_000
        sequences = [x.sequence for x in sub.received if isinstance(x, (m.JobStatusChanged, m.JobSummaryUpdated))]
        assert sequences == list(range(1, len(sequences) + 1))  # nothing lost, nothing reordered
    finally:
        sub.close()


def test_a_failing_job_publishes_failed_with_its_cause(cluster, client):
    def explode(df):
        if (df.seq > 300).any():
            raise ZeroDivisionError("user code divided by zero")
        return df

    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_generator(count=5_000, batch_size=100).map_batches(explode, name="explode").collect()
    graph = env.get_job_graph("fails")
    sub = Subscriber(cluster, graph.job_id)
    try:
        handle = client.submit(graph)
        failed = sub.until(ended, 60)
        assert failed.state == "FAILED"
        assert "ZeroDivisionError: user code divided by zero" in failed.failure
        assert "operator 'explode'" in failed.failure and "not restarted" in failed.failure
        assert [s.state for s in sub.statuses()][-2:] == ["FAILING", "FAILED"]
        with pytest.raises(JobExecutionError, match="user code divided by zero"):
            handle.wait(10)
    finally:
        sub.close()


def test_wait_returns_as_soon_as_the_job_ends(cluster, client):
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_generator(lambda seq: pd.DataFrame({"x": seq}), count=2_000, rate=2_000, batch_size=100).collect()
    handle = env.execute_async("prompt", client=client)
    stats_before = client.control_stats()
    result = handle.wait(60)
    returned_ms = time.time() * 1000
    asked = {op: client.control_stats().get(op, 0) - stats_before.get(op, 0) for op in CLIENT_OPS}
    # no polling: the one fetch after subscribing, and a second one only if an event was published
    # before the subscription reached the JobManager (the heartbeat then names a newer sequence)
    fetches = asked.pop("request-job-snapshot")
    assert 1 <= fetches <= 2 and asked == {op: 0 for op in asked}, (fetches, asked)
    end_ms = client.job_details(handle.job_id)["end-time"]
    assert result.state == "FINISHED" and len(result.to_pandas()) == 2_000
    # with no request asked meanwhile (above), only the job's events could have told wait() of the
    # end; how soon after it is bench/wait_latency.py's figure (a loaded machine moves it)
    print(f"wait() returned {returned_ms - end_ms:.0f} ms after the job's end")


def run_feeds(cluster, job_id: str, count: int, updates: int) -> tuple[dict, list[int]]:
    """``count`` dashboard feeds on one job until each has delivered ``updates`` more updates
    (a running job's summary comes once a second): the control requests the JobManager handled
    meanwhile (by op), and how many updates each feed delivered."""
    from kernel_runtime import JobClient
    deliveries = [0] * count

    def deliver(i):
        def count_it(snapshot):
            assert snapshot.details["jid"] == job_id and snapshot.taskmanagers
            deliveries[i] += 1
        return count_it

    stats = JobClient(cluster.info)
    try:
        feeds = [JobFeed(cluster.info, job_id, deliver(i), schedule=_direct).start() for i in range(count)]
        # past the first update's heartbeat: a fetch it may call for (a raced event) is done
        wait_for(lambda: min(deliveries) >= 2, 30, "every feed's second update")
        before, seen = stats.control_stats(), list(deliveries)
        wait_for(lambda: all(d >= s + updates for d, s in zip(deliveries, seen)), 60,
                 f"{updates} more updates of every feed")
        after = stats.control_stats()
        for feed in feeds:
            feed.stop()
    finally:
        stats.close()
    return {op: after.get(op, 0) - before.get(op, 0) for op in CLIENT_OPS}, deliveries


def test_five_dashboards_ask_the_jobmanager_no_more_than_one(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    env.from_generator(rate=2_000, batch_size=100).collect()
    handle = env.execute_async("watched", client=client)
    try:
        wait_for(lambda: handle.status == "RUNNING", 30, "the job running")
        one, one_updates = run_feeds(cluster, handle.job_id, 1, 3)
        five, five_updates = run_feeds(cluster, handle.job_id, 5, 3)
        # while they follow the job, three updates each, no dashboard asks anything: the events
        # bring every update
        assert sum(one.values()) == 0 and sum(five.values()) == 0, (one, five)
        assert min(five_updates) >= 5 and min(one_updates) >= 5, (one_updates, five_updates)
    finally:
        handle.cancel()
        wait_for(lambda: handle.status == "CANCELED", 15, "the job cancelled")
