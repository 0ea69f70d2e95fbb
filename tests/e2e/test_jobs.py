"""Jobs end to end on a real 2 x 2 cluster: results equal pandas, several jobs, cancel, failures."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cluster.protocol.states import JobState
from kernel_runtime import JobCancelledError, JobExecutionError, StreamEnvironment
from tests.conftest import rest, wait_for

N = 50_000


def events(seq):
    return pd.DataFrame({"user": (seq * 7919) % 13, "amount": (seq % 11).astype("int64"), "seq": seq})


def expected_counts() -> pd.DataFrame:
    df = events(np.arange(N, dtype=np.int64))
    df = df.assign(amount=df.amount * 3)
    df = df[df.amount % 2 == 0]
    return df.groupby("user").size().rename("count").reset_index()


def keyed_count_pipeline(env: StreamEnvironment) -> None:
    counts = (env.from_generator(events, count=N, batch_size=2_000)
              .map_batches(lambda df: df.assign(amount=df.amount * 3), name="triple")
              .filter(lambda df: df.amount % 2 == 0, name="even")
              .key_by("user")
              .count(parallelism=3))
    counts.collect("counts")
    counts.changelog().collect("changelog")


def test_keyed_pipeline_equals_pandas_as_a_table_and_as_a_changelog(cluster, client):
    # batches of at most ~500 rows into the count (the default, 10,000, lets a count subtask take
    # most of its ~8,000 rows in one call when they queue up): each user's ~2,100 rows, a quarter of
    # every batch of its subtask, then always come in several calls, so several updates
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config={"execution.batch-size": 500})
    keyed_count_pipeline(env)
    handle = env.execute_async("keyed count", client=client)
    result = handle.wait(60)
    assert result.state == JobState.FINISHED
    # an upsert stream's result is its table, as a script gets it by default: a row per key
    table = result.to_pandas("counts")
    assert not table["user"].duplicated().any()
    pd.testing.assert_frame_equal(table.sort_values("user").reset_index(drop=True), expected_counts(),
                                  check_dtype=False)
    # its changelog: every update of every key, in order per key although the 3 count subtasks
    # feed 2 sink subtasks (the sinks are keyed by the count's key), the last being the table's
    updates = result.to_pandas("changelog")
    assert updates.groupby("user").size().min() > 1
    for _, group in updates.groupby("user"):
        assert group["count"].diff().dropna().gt(0).all(), list(group["count"])
    final = updates.groupby("user", as_index=False)["count"].last().sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(final, expected_counts(), check_dtype=False)


def test_stateless_pipeline_returns_every_row_exactly_once(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(count=10_000, batch_size=777)
        .map_batches(lambda df: df.assign(square=df.seq * df.seq), parallelism=3)
        .rebalance()
        .filter(lambda df: df.seq % 3 != 0)
        .collect())
    out = env.execute_async("stateless", client=client).wait(60).to_pandas()
    seq = np.arange(10_000)
    seq = seq[seq % 3 != 0]
    assert sorted(out["seq"]) == list(seq)
    assert (out["square"] == out["seq"] ** 2).all()


def test_broadcast_gives_every_subtask_every_row(cluster, client):
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    (env.from_generator(count=100).broadcast()
        .map_batches(lambda df: df, parallelism=3).set_parallelism(3).collect())
    out = env.execute_async("broadcast", client=client).wait(60).to_pandas()
    assert sorted(out["seq"]) == sorted(list(range(100)) * 3)


def test_two_jobs_run_at_once(cluster, client):
    handles = []
    for name in ("first", "second"):
        env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
        env.from_generator(count=3_000, rate=1_000, batch_size=100).collect()  # 3 s each: both surely overlap
        handles.append(env.execute_async(name, client=client))
    wait_for(lambda: all(h.status == JobState.RUNNING for h in handles), 20, "both jobs RUNNING")
    _, overview = rest(cluster, "/overview")
    assert overview["jobs-running"] == 2 and overview["slots-available"] == 0
    for h in handles:
        assert sorted(h.wait(60).to_pandas()["seq"]) == list(range(3_000))


def test_cancel_unbounded_job_frees_its_slots(cluster, client):
    env = StreamEnvironment(parallelism=4, cluster=cluster.cluster_dir)
    env.from_generator(rate=5_000, batch_size=100).map_batches(lambda df: df).collect()
    handle = env.execute_async("unbounded", client=client)
    wait_for(lambda: len(handle.results) > 500, 20, "rows flowing")
    _, overview = rest(cluster, "/overview")
    assert overview["slots-available"] == 0
    handle.cancel()
    with pytest.raises(JobCancelledError):
        handle.wait(20)
    assert handle.status == JobState.CANCELED
    wait_for(lambda: rest(cluster, "/overview")[1]["slots-available"] == 4, 10, "slots free again")


def test_raising_user_function_fails_the_job_not_the_cluster(cluster, client):
    def explode(df):
        if (df.seq > 500).any():
            raise ZeroDivisionError("user code divided by zero")
        return df

    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    env.from_generator(count=5_000, batch_size=100).map_batches(explode, name="explode").collect()
    handle = env.execute_async("fails", client=client)
    with pytest.raises(JobExecutionError) as info:
        handle.wait(30)
    raised_at = explode.__code__.co_firstlineno + 2
    # one line: the exception, the operator and the line that raised
    assert str(info.value) == \
        f"ZeroDivisionError: user code divided by zero, in operator 'explode' (test_jobs.py:{raised_at})"
    trace = info.value.traceback  # the user's, without the runtime's frames
    assert f'test_jobs.py", line {raised_at}, in explode\n    raise ZeroDivisionError' in trace
    assert "cluster/" not in trace and "threading" not in trace
    assert handle.status == JobState.FAILED
    # the cluster serves the next job
    env = StreamEnvironment(parallelism=4, cluster=cluster.cluster_dir)
    env.from_generator(count=1_000).collect()
    assert len(env.execute_async("after failure", client=client).wait(30).to_pandas()) == 1_000


def test_wrong_return_type_is_a_clear_job_failure(cluster, client):
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_generator(count=10).filter(lambda df: "yes", name="bad filter").collect()
    with pytest.raises(JobExecutionError, match=r"operator 'bad filter' .*one boolean per row"):
        env.execute_async("bad filter", client=client).wait(30)


def test_job_needing_more_slots_than_exist_waits_then_fails(cluster, client):
    env = StreamEnvironment(parallelism=5, cluster=cluster.cluster_dir, config={"slot.request.timeout": "3 s"})
    env.from_generator(count=10).collect()
    handle = env.execute_async("too wide", client=client)
    status = handle.job_status()
    assert status.state == JobState.CREATED
    assert "waiting for 5 free slot(s); the cluster has 4 free of 4" in status.reason
    _, job = rest(cluster, f"/jobs/{handle.job_id}")
    assert job["state"] == "CREATED" and "waiting for 5" in job["status-reason"]
    with pytest.raises(JobExecutionError, match="NoResourceAvailableException.*needs 5 slot"):
        handle.wait(20)


def test_submission_is_validated_by_the_jobmanager_too(cluster, client):
    from cluster.protocol.endpoint import RpcError
    env = StreamEnvironment(cluster=cluster.cluster_dir)
    env.from_generator(count=10).collect()
    graph = env.get_job_graph("x").to_dict()
    graph["edges"] = [{"source": "nope", "target": "nope", "ship_strategy": "HASH", "key": []}]
    from cluster.protocol import messages as m
    with pytest.raises(RpcError, match="job rejected: edge nope -> nope names an unknown vertex"):
        client.rpc.request(m.SubmitJob(graph, None), expect=m.JobSubmitted)
    graph = env.get_job_graph("y").to_dict()
    graph["config"] = {"rest.port": 1}
    with pytest.raises(RpcError, match="'rest.port' is cluster-wide"):
        client.rpc.request(m.SubmitJob(graph, None), expect=m.JobSubmitted)


def test_union_of_streams_with_different_parallelism(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    evens = env.from_generator(lambda s: {"n": s * 2}, count=1_000, name="evens")
    odds = env.from_generator(lambda s: {"n": s * 2 + 1}, count=1_000, name="odds", parallelism=1)
    evens.union(odds).key_by("n").count(parallelism=3).collect()
    out = env.execute_async("union", client=client).wait(60).to_pandas()
    assert sorted(out["n"]) == list(range(2_000)) and (out["count"] == 1).all()


def test_keyed_map_batches_sees_every_row_of_a_key_in_one_subtask(cluster, client):
    import threading

    def tag_with_task(df):
        return df.assign(task=threading.current_thread().name)  # "task <vertex> (i/n)"

    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    env.from_generator(lambda s: {"k": s % 17, "v": s}, count=5_000, batch_size=250) \
        .key_by("k").map_batches(tag_with_task, parallelism=3).collect()
    out = env.execute_async("keyed map", client=client).wait(60).to_pandas()
    assert sorted(out["v"]) == list(range(5_000))
    assert (out.groupby("k")["task"].nunique() == 1).all()
    assert out["task"].nunique() == 3


def test_a_scripts_wait_tells_each_restart_on_stderr_cause_first(cluster, client, capsys):
    """Outside a notebook, JobHandle.wait (and so env.execute) says each restart in one line, the
    cause first: a job restarting in silence looks like a hung script."""
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir, config={
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 3,
        "restart-strategy.fixed-delay.delay": "0 ms"})
    # 100 rows a second: the first failure comes a second after the submission, when wait listens
    env.from_testing(lambda s: pd.DataFrame({"v": s}), count=300, rate=100,
                     fail_at=[(100, 1), (200, 2)]).collect()
    result = env.execute_async("restarts told", client=client).wait(120)
    assert len(result.to_pandas()) == 300
    lines = [line for line in capsys.readouterr().err.splitlines() if "restarts told" in line]
    assert len(lines) == 2, lines
    assert lines[0].startswith("PlannedFailure") and "planned failure at row 100 in attempt 1" in lines[0]
    assert lines[0].endswith("restarts after attempt 1)")
    assert "planned failure at row 200 in attempt 2" in lines[1] and lines[1].endswith("restarts after attempt 2)")


def test_a_user_function_whose_module_is_missing_fails_its_job_without_a_restart(cluster, client):
    """An error no restart can fix (cluster.common.failures.restart_cannot_fix) fails the job at
    once, whatever the restart strategy: five attempts would fail the same way."""
    def needs_a_missing_module(df: pd.DataFrame) -> pd.DataFrame:
        import streamlab_no_such_module  # noqa: F401
        return df

    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir, config={
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 5,
        "restart-strategy.fixed-delay.delay": "0 ms"})
    env.from_generator(lambda s: pd.DataFrame({"v": s}), count=100).map_batches(needs_a_missing_module,
                                                                              name="needs").collect()
    handle = env.execute_async("missing module", client=client)
    with pytest.raises(JobExecutionError, match="ModuleNotFoundError"):
        handle.wait(120)
    status = handle.job_status()
    assert status.state == JobState.FAILED and status.attempt == 1
    assert "The job was not restarted: no restart can fix its failure." in status.failure
