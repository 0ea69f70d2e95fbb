"""Savepoints: stop-with-savepoint, resume at another parallelism, corrupt ones, REST visibility."""
from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from cluster.protocol.endpoint import RpcError
from kernel_runtime import StreamEnvironment
from kernel_runtime.api import FileSink
from tests.conftest import rest, wait_for
from tests.e2e.test_rest import flink, missing_fields

N = 30_000


def orders(seq):
    return pd.DataFrame({"user": seq % 37, "amount": (seq % 101).astype("int64"), "seq": seq})


def pipeline(cluster, parallelism: int, out: str, savepoint: str = "", rate=6_000, backend="hashmap"):
    config = {"execution.checkpointing.interval": "300 ms", "state.backend.type": backend}
    if savepoint:
        config["execution.savepoint.path"] = savepoint
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir, config=config)
    (env.from_generator(orders, count=N, rate=rate, batch_size=250)
        .key_by("user").aggregate(total=("amount", "sum"), n=("amount", "count"), top=("amount", "max"))
        .sink_to(FileSink.parquet(out, rows_per_file=500)))
    return env


def final_values(out: str) -> pd.DataFrame:
    frame = pd.concat([pq.read_table(f).to_pandas() for f in glob.glob(os.path.join(out, "part-*.parquet"))])
    latest = frame.sort_values("n").groupby("user").tail(1)  # n only grows: the last row per key
    return latest.sort_values("user").reset_index(drop=True)[["user", "total", "n", "top"]]


def expected() -> pd.DataFrame:
    df = orders(np.arange(N, dtype=np.int64))
    return (df.groupby("user").agg(total=("amount", "sum"), n=("amount", "count"), top=("amount", "max"))
            .reset_index())


@pytest.fixture(scope="module")
def savepoint(cluster, tmp_path_factory):
    """A job at parallelism 2, stopped with a savepoint about half-way."""
    from kernel_runtime import JobClient
    client = JobClient(cluster.info)
    first = str(tmp_path_factory.mktemp("first"))
    handle = pipeline(cluster, 2, first).execute_async("savepoint p2", client=client)
    # mid-stream: once a checkpoint covered some input (the job reads for about 5 s); a count of
    # records would depend on the machine's load, which sets how large the pre-aggregated batches are
    wait_for(lambda: rest(cluster, f"/jobs/{handle.job_id}/checkpoints")[1]["counts"]["completed"] >= 1, 60,
             "a first completed checkpoint")
    location = handle.stop(target_directory=str(tmp_path_factory.mktemp("savepoints")))
    handle.wait(60)  # stop-with-savepoint ends the job FINISHED
    assert handle.status == "FINISHED"
    client.close()
    return location


@pytest.mark.parametrize("parallelism", [3, 1])
def test_a_savepoint_at_parallelism_2_restores_at_3_and_1_with_identical_results(
        cluster, client, savepoint, parallelism, tmp_path):
    out = str(tmp_path / "out")
    env = pipeline(cluster, parallelism, out, savepoint=savepoint, rate=None)
    handle = env.execute_async(f"restored at {parallelism}", client=client)
    handle.wait(120)
    pd.testing.assert_frame_equal(final_values(out), expected(), check_dtype=False)
    checkpoints = rest(cluster, f"/jobs/{handle.job_id}/checkpoints")[1]
    assert checkpoints["latest"]["restored"]["is_savepoint"] is True


def test_savepoint_is_a_folder_with_metadata_and_state(savepoint):
    body = json.loads(open(os.path.join(savepoint, "_metadata")).read())["body"]
    assert body["kind"] == "stop" and len(body["operators"]) >= 3
    assert any(name.endswith(".state") for name in os.listdir(savepoint))


def test_a_corrupt_savepoint_is_refused_with_a_clear_error(cluster, client, savepoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(savepoint, broken)
    meta = broken / "_metadata"
    meta.write_text(meta.read_text().replace('"kind": "stop"', '"kind": "stolen"'))
    env = pipeline(cluster, 2, str(tmp_path / "out"), savepoint=str(broken))
    with pytest.raises(RpcError, match=r"cannot start from savepoint .*broken.*checksum: corrupt"):
        env.execute_async("from a corrupt savepoint", client=client)
    (broken / "_metadata").unlink()
    with pytest.raises(RpcError, match=r"cannot start from savepoint .*_metadata is missing"):
        env.execute_async("from a savepoint without metadata", client=client)


def test_savepoint_trigger_and_dispose_and_checkpoint_stats_over_rest(cluster, client, tmp_path):
    env = pipeline(cluster, 2, str(tmp_path / "out"), rate=2_000)
    handle = env.execute_async("rest savepoint", client=client)
    wait_for(lambda: rest(cluster, f"/jobs/{handle.job_id}/checkpoints")[1]["counts"]["completed"] >= 2, 60,
             "two checkpoints")
    stats = rest(cluster, f"/jobs/{handle.job_id}/checkpoints")[1]
    assert not missing_fields(flink("jobs_ID_checkpoints.json"), stats)
    assert stats["latest"]["completed"]["num_acknowledged_subtasks"] == stats["latest"]["completed"]["num_subtasks"]
    latest = stats["latest"]["completed"]["id"]
    details = rest(cluster, f"/jobs/{handle.job_id}/checkpoints/details/{latest}")[1]
    reference = flink("jobs_ID_checkpoints_details_22.json")
    flink_tasks = reference.pop("tasks")  # keyed by vertex id: compare one entry's fields
    assert not missing_fields(reference, details)
    assert set(details["tasks"]) == {v["id"] for v in client.job_details(handle.job_id)["vertices"]}
    for entry in details["tasks"].values():
        assert not missing_fields(next(iter(flink_tasks.values())), entry)
        assert entry["num_acknowledged_subtasks"] == entry["num_subtasks"] == 2
    config = rest(cluster, f"/jobs/{handle.job_id}/checkpoints/config")[1]
    assert not missing_fields(flink("jobs_ID_checkpoints_config.json"), config)
    assert (config["mode"], config["interval"]) == ("exactly_once", 300)

    # REST writes savepoints below state.savepoints.dir only (the cluster's own folder here)
    target = cluster.cluster_dir / "savepoints" / f"rest-{handle.job_id[:8]}"
    status, answer = rest(cluster, f"/jobs/{handle.job_id}/savepoints", "POST", {"target-directory": str(target)})
    assert status == 202
    trigger = answer["request-id"]
    status = wait_for(lambda: (b := rest(cluster, f"/jobs/{handle.job_id}/savepoints/{trigger}")[1])["status"]["id"]
                      == "COMPLETED" and b, 30, "savepoint completed")
    location = status["operation"]["location"].removeprefix("file:")
    assert os.path.exists(os.path.join(location, "_metadata"))
    handle.cancel()
    wait_for(lambda: handle.status == "CANCELED", 30, "cancelled")
    client.dispose_savepoint(location)
    assert not os.path.exists(location)
    with pytest.raises(RpcError, match="not disposed"):
        client.dispose_savepoint(str(tmp_path))  # not a savepoint: never deleted


def test_savepoint_and_stop_of_an_attached_job_with_a_collect_sink(cluster):
    """A savepoint of a job whose collect sink streams to this client needs this client's
    acknowledgement of the savepoint's barrier; that acknowledgement travels on the same client
    while the savepoint request waits for its answer, so it must not queue behind it."""
    from kernel_runtime import JobClient
    client = JobClient(cluster.info)
    try:
        env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir,
                                config={"execution.checkpointing.interval": "500 ms"})
        env.from_generator(orders, rate=2_000, batch_size=200).key_by("user").count().collect()
        handle = env.execute_async("attached savepoint", client=client)
        handle.wait_for_rows(100, timeout=60)
        location = handle.savepoint(timeout=20)
        assert os.path.exists(os.path.join(location, "_metadata"))
        assert handle.status == "RUNNING"
        stopped_at = handle.stop(timeout=20)
        assert os.path.exists(os.path.join(stopped_at, "_metadata"))
        result = handle.wait(30)
        assert result.state == "FINISHED"
        counts = result.to_pandas()
        assert len(counts) > 0 and counts["count"].max() > 0
    finally:
        client.close()


def test_savepoints_in_flight_are_bounded_and_one_past_the_bound_is_told_to_wait(cluster, client, tmp_path):
    from cluster.jobmanager.jobmaster.checkpointing import MAX_PENDING_SAVEPOINTS
    from tests.e2e.test_rest_security import post_json
    hold, entered = tmp_path / "hold", tmp_path / "entered"
    hold.touch()

    def held(df):  # no barrier passes this operator while the file is there: savepoints stay pending
        import os
        import time
        open(entered, "w").close()
        while os.path.exists(hold):
            time.sleep(0.01)
        return df
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_generator(rate=200, batch_size=20).map_batches(held, name="held").print()
    handle = env.execute_async("bounded savepoints", client=client)
    try:
        # a batch inside the function: barriers come after it (before one, they would pass at once)
        wait_for(entered.exists, 30, "the first batch held")
        path = f"/jobs/{handle.job_id}/savepoints"
        target = {"target-directory": str(cluster.cluster_dir / "savepoints" / f"bounded-{handle.job_id[:8]}")}
        triggers = []
        for _ in range(MAX_PENDING_SAVEPOINTS):
            status, answer = post_json(cluster, path, target)
            assert status == 202, answer
            triggers.append(answer["request-id"])
        status, answer = post_json(cluster, path, target)
        assert status == 429, answer
        assert f"already takes {MAX_PENDING_SAVEPOINTS} savepoints" in answer["errors"][0], answer
        assert all(rest(cluster, f"{path}/{t}")[1]["status"]["id"] == "IN_PROGRESS" for t in triggers)
        hold.unlink()
        for trigger in triggers:
            wait_for(lambda: rest(cluster, f"{path}/{trigger}")[1]["status"]["id"] == "COMPLETED", 60,
                     f"savepoint {trigger} completed")
        status, answer = post_json(cluster, path, target)  # places are free again
        assert status == 202, answer
        assert rest(cluster, f"/jobs/{handle.job_id}")[1]["state"] == "RUNNING"
    finally:
        hold.unlink(missing_ok=True)
        handle.cancel()
        wait_for(lambda: handle.status == "CANCELED", 30, "cancelled")
