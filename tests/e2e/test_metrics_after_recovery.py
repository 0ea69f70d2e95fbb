"""The figures of a job that lost a TaskManager once: per job, consistent, kept after its end.

One job (a bounded generator, a rebalanced pandas step, a keyed count into the collect sink,
checkpoints every 300 ms) on a cluster of its own; a TaskManager is killed with SIGKILL while it
runs, and the job recovers from its latest checkpoint on the remaining slots. A dashboard
follows it all along, as in a notebook.
"""
from __future__ import annotations

import html
import os
import re
import signal
import time

import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.notebook.widgets import Dashboard
from tests.conftest import rest, start_cluster, wait_for

pytestmark = pytest.mark.slow

N = 40_000
SHARES = ("busyTimeMsPerSecond", "backPressuredTimeMsPerSecond", "idleTimeMsPerSecond")


def running_shares(details: dict) -> list[float]:
    """The sum of the three per-second shares of every running subtask that reported them."""
    return [sum(s["metrics"][k] for k in SHARES) for s in details["subtasks"]
            if s["status"] == "RUNNING" and all(k in s["metrics"] for k in SHARES)]


def vertex_totals(details: dict, key: str) -> dict[str, int]:
    totals: dict[str, int] = {}
    for s in details["subtasks"]:
        totals[s["vertex_id"]] = totals.get(s["vertex_id"], 0) + s["metrics"].get(key, 0)
    return totals


@pytest.fixture
def own_cluster(tmp_path):
    # spread out: every job here has tasks on both TaskManagers, whichever one a test kills
    local = start_cluster(tmp_path / "c", **{"taskmanager.spark.startup": "lazy",
                                             "cluster.evenly-spread-out-slots": True})
    yield local
    local.stop()


def test_figures_after_a_taskmanager_loss_are_the_jobs_whole_and_add_up(own_cluster):
    client = JobClient(own_cluster.info)
    env = StreamEnvironment(parallelism=2, cluster=own_cluster.cluster_dir, config={
        "execution.checkpointing.interval": "300 ms", "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.delay": "100 ms"})
    (env.from_generator(count=N, rate=4_000, batch_size=100, name="events")
        .rebalance().map_batches(lambda df: df, name="step")
        .key_by("seq").count(name="per seq").collect())
    graph = env.get_job_graph("recovers")
    submitted_ms = time.time() * 1000
    handle = client.submit(graph)
    board = Dashboard(handle, poll_interval=0.2)
    try:
        wait_for(lambda: handle.row_count() > 4_000, 30, "rows flowing")
        # while it runs, every subtask's busy, back-pressured and idle time make up each second
        sums = []
        for _ in range(10):
            sums += running_shares(client.job_details(handle.job_id))
            time.sleep(0.1)
        assert sums and all(abs(total - 1000) <= 0.5 for total in sums), sums
        wait_for(lambda: len((ck := client.job_details(handle.job_id)["checkpoints"])["history"]) > 0
                 and ck["counts"]["completed"] >= 2, 30, "completed checkpoints")

        victim = own_cluster.taskmanagers[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(5)
        wait_for(lambda: handle.job_status().attempt == 2, 30, "the restart")
        # from the restart on, the job's figures start from what its checkpoint covered, not zero
        source = next(v for v in graph.vertices if v.is_source)
        read_after_restart = []
        while handle.job_status().state not in ("FINISHED", "FAILED", "CANCELED"):
            read_after_restart.append(vertex_totals(client.job_details(handle.job_id), "records-in").get(source.id, 0))
            time.sleep(0.1)
        assert read_after_restart and min(read_after_restart) > 0, read_after_restart
        handle.wait(90)

        assert handle.job_status().state == "FINISHED" and handle.job_status().attempt == 2
        details = client.job_details(handle.job_id)
        assert details["attempt"] == 2 and details["failure-cause"] is None
        # the duration is the job's, from its start (not the last attempt's), so it covers the restart
        start, timestamps = details["start-time"], details["timestamps"]
        assert submitted_ms - 1000 <= start < timestamps["RESTARTING"] < timestamps["FINISHED"], (start, timestamps)
        assert details["duration"] == details["end-time"] - start == timestamps["FINISHED"] - start
        # per job: the source read every row once, whatever the attempt that replayed part of them
        records_in, records_out = vertex_totals(details, "records-in"), vertex_totals(details, "records-out")
        assert records_in[source.id] == N
        # at rest, what an upstream vertex sent is what its downstream vertex received
        for edge in graph.edges:
            assert records_out[edge.source] == records_in[edge.target], (edge, records_out, records_in)
        assert all(records_in[v.id] == N for v in graph.vertices)
        # the final figures stay: no subtask reads zero, and each one's shares still add up
        for s in details["subtasks"]:
            assert s["status"] == "FINISHED" and s["metrics"]["records-in"] > 0, s
            assert abs(sum(s["metrics"][k] for k in SHARES) - 1000) <= 0.5, s
        rest_vertices = rest(own_cluster, f"/jobs/{handle.job_id}")[1]["vertices"]
        assert sum(v["metrics"]["read-records"] for v in rest_vertices if v["id"] == source.id) == N

        # the dashboard says the same: the job's rows, its attempt, no stale failure
        def settled():
            return "40,000 of 40,000 rows" in board.progress.label.value and \
                'data-state="FINISHED"' in board.status.header.value
        wait_for(settled, 15, "the dashboard's final picture")
        header = board.status.header.value
        assert 'data-attempt="2"' in header and "#a50f15" not in header, header  # no failure in red
        # why attempt 2 ran, in the header's grey: the failure it restarted after, the checkpoint it restored
        restart = html.unescape(re.search(r'class="streamlab-restart"[^>]*>([^<]*)<', header)[1])
        restored = details["checkpoints"]["latest"]["restored"]["id"]
        assert re.fullmatch(rf"restarted \d\d:\d\d:\d\d after .+; restored checkpoint {restored}", restart), restart
        assert details["last-failure"]["taskmanager"] or "tm-" in restart, (restart, details["last-failure"])
        # the job's duration, once the summary that follows its FINISHED status event is in (CI run 21:
        # the header read 12.9 s, the RUNNING summary's, with the status already FINISHED)
        def shown_duration() -> float:
            return float(re.search(r"([\d.]+) s", board.status.header.value).group(1))
        wait_for(lambda: shown_duration() == pytest.approx(details["duration"] / 1000, abs=0.06), 15,
                 f"the header to show the job's duration, {details['duration']} ms")
        for vertex in board.metrics.observe(time.monotonic(), details):
            assert vertex.records_in == N
            assert vertex.busy + vertex.backpressured + vertex.idle == pytest.approx(1.0)
    finally:
        board.close()
        client.close()


def test_rows_taken_in_show_while_their_first_batch_is_still_processed(cluster):
    """A slow first batch (as Spark's first plan on a cold session) must not hide the rows the
    source already read: the dashboard said "0 rows so far" while 1,000 rows had arrived."""
    release = cluster.cluster_dir / "release-first-batch"

    def slow_first(df):
        while not release.exists():
            time.sleep(0.05)
        return df

    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_generator(count=1_000, batch_size=1_000, name="events").map_batches(slow_first).collect()
    client = JobClient(cluster.info)
    handle = client.submit(env.get_job_graph("slow first batch"))
    try:
        def source_rows() -> int:
            return sum(s["metrics"].get("records-in", 0) for s in client.job_details(handle.job_id)["subtasks"])
        wait_for(lambda: source_rows() == 1_000, 15, "the source's rows counted during the batch")
        assert handle.row_count() == 0  # the batch is still being processed
    finally:
        release.touch()
    handle.wait(30)
    client.close()
