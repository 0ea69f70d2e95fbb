"""%%stream against the session cluster (--cluster DIR): the three result modes on an unbounded
keyed job, and the job handle."""
import time

import pytest

from kernel_runtime.client.job_handle import JobHandle
from kernel_runtime.notebook.widgets.base import Update
from kernel_runtime.notebook.widgets.checkpoints import CheckpointsView
from kernel_runtime.notebook.widgets.feed import Snapshot

from ..conftest import wait_for
from .conftest import run

USERS = 7
UNBOUNDED_KEYED = (
    "import pandas as pd\n"
    f"events = env.from_generator(lambda seq: pd.DataFrame({{'user': seq % {USERS}}}), rate=4000, batch_size=50)\n"
    "events.key_by('user').count().collect()\n")


def stream(shell, cluster, options: str, body: str) -> JobHandle:
    result, out = run(shell, f"%%stream --cluster {cluster.cluster_dir} {options}\n{body}")
    assert result.success, out
    return result.result


def stop(handle: JobHandle) -> None:
    handle.cancel()
    wait_for(lambda: handle.status == "CANCELED", 15, "the job cancelled")


def test_update_mode_holds_one_row_per_key(shell, cluster):
    handle = stream(shell, cluster, "-o counts", UNBOUNDED_KEYED)
    try:
        assert shell.user_ns["counts"] is handle
        assert handle.summary().mode == "update by user"  # the pipeline's default: a keyed count
        wait_for(lambda: handle.row_count() > 10 * USERS, 20, "count updates")
        first = handle.results
        wait_for(lambda: handle.results["count"].sum() > 2 * first["count"].sum(), 20, "higher counts")
        later = handle.results
        for frame in (first, later):
            assert sorted(frame.user) == list(range(USERS))  # one row per key, never more
        assert (later.set_index("user")["count"] >= first.set_index("user")["count"]).all()
        assert later["count"].sum() > first["count"].sum()
        assert handle.row_count() > len(later)
    finally:
        stop(handle)


def test_append_mode_stays_at_max_rows(shell, cluster):
    handle = stream(shell, cluster, "--mode append --max-rows 50", UNBOUNDED_KEYED)
    try:
        wait_for(lambda: handle.row_count() > 200, 20, "rows")
        assert len(handle.results) == 50
        seen = handle.row_count()
        wait_for(lambda: handle.row_count() > seen + 200, 20, "more rows")
        summary = handle.summary(rows=5)
        assert (summary.kept, len(summary.preview), summary.mode) == (50, 5, "append")
        assert len(handle.to_pandas()) == 50 and summary.received > 400
    finally:
        stop(handle)


def test_single_mode_keeps_one_row(shell, cluster):
    handle = stream(shell, cluster, "--mode single", UNBOUNDED_KEYED)
    try:
        wait_for(lambda: handle.row_count() > 20, 20, "rows")
        first = handle.results
        seen = handle.row_count()
        wait_for(lambda: handle.row_count() > seen + 50, 20, "more rows")
        later = handle.results
        assert len(first) == len(later) == 1 and list(later.columns) == ["user", "count"]
        assert handle.summary().mode == "single"
    finally:
        stop(handle)


def test_a_bounded_job_waits_returns_all_rows_and_metrics_per_subtask(shell, cluster):
    handle = stream(shell, cluster, "--name bounded -p 2",
                    "env.from_generator(count=3000, batch_size=500).filter(lambda df: df.seq % 3 == 0).collect()\n")
    result = handle.wait(timeout=60)
    assert (result.state, handle.status, handle.name) == ("FINISHED", "FINISHED", "bounded")
    assert sorted(handle.to_pandas().seq) == list(range(0, 3000, 3))  # 1000 rows: under --max-rows
    metrics = handle.metrics()
    assert len(metrics) == 2 and set(metrics.subtask) == {0, 1}
    assert {"vertex", "status", "taskmanager_id", "slot", "records-in", "busy-ms"} <= set(metrics.columns)
    assert "FINISHED" in handle._summary() and "1,000 rows received" in handle._summary()


def test_detached_returns_at_once_and_keeps_no_rows(shell, cluster):
    result, out = run(shell, f"%%stream --cluster {cluster.cluster_dir} -d\n"
                             "env.from_generator(count=100).collect()\n")
    handle = result.result
    assert f"Job has been submitted with JobID {handle.job_id}" in out
    assert handle.wait(timeout=30).state == "FINISHED"
    with pytest.raises(RuntimeError, match="was submitted detached: its collected rows are not sent"):
        handle.results


def test_checkpoint_interval_goes_to_the_job_configuration_and_the_dashboard(shell, cluster):
    handle = stream(shell, cluster, "--checkpoint-interval '300 ms'",
                    "env.from_generator(rate=2000, batch_size=50).key_by('seq').count().collect()\n")
    try:
        assert handle.job_graph.config["execution.checkpointing.interval"] == "300 ms"
        completed = lambda: [c for c in (handle.client.job_details(handle.job_id).get("checkpoints") or {})
                             .get("history", []) if c["status"] == "COMPLETED"]
        wait_for(lambda: len(completed()) >= 2, 30, "completed checkpoints")
        snapshot = Snapshot(time.monotonic(), handle.client.job_details(handle.job_id), {}, [])
        view = CheckpointsView()
        view.update(Update(snapshot, [], 0.0))
        assert view.root.value.count('data-status="COMPLETED"') >= 2 and "no checkpoints" not in view.root.value
    finally:
        stop(handle)


def test_attaching_by_address_finds_the_cluster_directory(shell, cluster, monkeypatch):
    monkeypatch.setenv("STREAMLAB_CLUSTER_DIR", str(cluster.cluster_dir))
    address = cluster.info.rpc_address.replace("tcp://", "")
    result, out = run(shell, f"%%stream --cluster {address}\nenv.from_generator(count=10).collect()\n")
    assert result.success, out
    assert result.result.client.cluster.cluster_dir == cluster.cluster_dir
    assert len(result.result.wait(timeout=30).to_pandas()) == 10
