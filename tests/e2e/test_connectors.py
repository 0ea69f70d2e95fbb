"""Connector jobs end to end on the real 2 x 2 cluster: files and Redis Streams in and out,
compared with the same computation in pandas."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from cluster.protocol.states import JobState
from kernel_runtime import JobCancelledError, JobExecutionError, StreamEnvironment
from kernel_runtime.api.connectors import FileSink, FileSource, RedisStreamSink, RedisStreamSource
from tests.conftest import wait_for
from tests.operators.conftest import redis_server, redis_url  # noqa: F401  (fixtures)

SCHEMA = {"user": "string", "amount": "int64", "price": "double"}
FORMATS = {"csv": FileSource.csv, "json": FileSource.json_lines, "parquet": FileSource.parquet}


def orders(n: int, start: int = 0) -> pd.DataFrame:
    seq = np.arange(start, start + n)
    return pd.DataFrame({"user": [f"u{i}" for i in (seq * 7919) % 13], "amount": seq % 11, "price": seq / 8})


def write(df: pd.DataFrame, path, fmt: str) -> None:
    hidden = path.parent / f".{path.name}"  # then renamed: a watching source never sees half a file
    if fmt == "csv":
        df.to_csv(hidden, index=False)
    elif fmt == "json":
        df.to_json(hidden, orient="records", lines=True)
    else:
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), hidden, row_group_size=100)
    os.rename(hidden, path)


def order_files(directory, fmt: str) -> pd.DataFrame:
    """Five files (one in a subdirectory) of 400 orders; all of them as one frame."""
    (directory / "more").mkdir(parents=True)
    frames = [orders(400, start=i * 400) for i in range(5)]
    for i, df in enumerate(frames):
        write(df, directory / ("more" if i == 4 else ".") / f"orders-{i}.{fmt}", fmt)
    return pd.concat(frames, ignore_index=True)


def sorted_frame(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return df.sort_values(by).reset_index(drop=True)


def parts(directory) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_files_to_parquet_equal_pandas(cluster, client, tmp_path, fmt):
    expected = order_files(tmp_path / "in", fmt)
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_source(FORMATS[fmt](tmp_path / "in", schema=SCHEMA, batch_size=150), name="orders")
        .map_batches(lambda df: df.assign(total=df.amount * df.price), name="total")
        .sink_to(FileSink.parquet(tmp_path / "out", rows_per_file=300)))
    result = env.execute_async(f"{fmt} to parquet", client=client).wait(60)
    assert result.state == JobState.FINISHED
    out = pd.read_parquet(tmp_path / "out")
    pd.testing.assert_frame_equal(sorted_frame(out, ["amount", "price"]),
                                  sorted_frame(expected.assign(total=expected.amount * expected.price),
                                               ["amount", "price"]))
    names = parts(tmp_path / "out")
    assert all(n.startswith(("part-0-", "part-1-")) and n.endswith(".parquet") for n in names)  # nothing hidden left
    assert max(len(pd.read_parquet(tmp_path / "out" / n)) for n in names) <= 300


@pytest.mark.parametrize("exchange", [False, True], ids=["chained", "after-an-exchange"])
def test_a_bounded_job_without_checkpointing_keeps_every_row_of_its_file_sink(cluster, client, tmp_path, exchange):
    # without checkpoints nothing ever completes: the end of the input commits what is written
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    stream = env.from_generator(lambda seq: pd.DataFrame({"k": seq % 5, "v": seq}), count=2_000, batch_size=150)
    if exchange:
        stream = stream.key_by("k").map_batches(lambda df: df, name="rekeyed")
    stream.sink_to(FileSink.parquet(tmp_path / "out", rows_per_file=700))
    assert not env.get_job_graph("probe").config.get("execution.checkpointing.interval")
    assert env.execute_async("bounded to files", client=client).wait(60).state == JobState.FINISHED
    assert sorted(pd.read_parquet(tmp_path / "out").v) == list(range(2_000))
    assert all(not n.startswith(".") for n in parts(tmp_path / "out"))  # no in-progress file left


def test_csv_key_by_count_to_parquet_equals_pandas(cluster, client, tmp_path):
    expected = order_files(tmp_path / "in", "csv")
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_source(FileSource.csv(tmp_path / "in", schema=SCHEMA, batch_size=250))
        .filter(lambda df: df.amount > 2)
        .key_by("user").count(parallelism=3)
        .sink_to(FileSink.parquet(tmp_path / "counts"), parallelism=1))
    env.execute_async("csv count", client=client).wait(60)
    updates = pd.read_parquet(tmp_path / "counts")
    final = updates.groupby("user", as_index=False)["count"].max()
    want = expected[expected.amount > 2].groupby("user").size().rename("count").reset_index()
    pd.testing.assert_frame_equal(sorted_frame(final, ["user"]), sorted_frame(want, ["user"]), check_dtype=False)
    assert parts(tmp_path / "counts") == ["part-0-0.parquet"]


def source_idle_ms(client, job_id: str) -> list[int]:
    """The idle time of each source subtask (a watching source's polls with nothing to read)."""
    details = client.job_details(job_id)
    source = next(v["id"] for v in details["vertices"] if v["name"].startswith("Source"))
    return [s["metrics"]["idle-ms"] for s in sorted(details["subtasks"], key=lambda s: s["subtask"])
            if s["vertex_id"] == source]


def rows_read(client, job_id: str) -> int:
    """The rows the source subtasks took in from their files (chained to the collect)."""
    details = client.job_details(job_id)
    source = next(v["id"] for v in details["vertices"] if v["name"].startswith("Source"))
    return sum(s["metrics"]["records-in"] for s in details["subtasks"] if s["vertex_id"] == source)


def test_watched_directory_picks_up_a_file_added_while_running(cluster, client, tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(2):
        write(orders(50, start=i * 50), tmp_path / "in" / f"first-{i}.csv", "csv")
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_source(FileSource.csv(tmp_path / "in", schema=SCHEMA, watch=True, monitor_interval=0.2))
        .collect())
    handle = env.execute_async("watch", client=client)
    try:
        wait_for(lambda: len(handle.results) == 100, 30, "the first files' rows")
        for i in range(3):
            write(orders(50, start=100 + i * 50), tmp_path / "in" / f"later-{i}.csv", "csv")
        wait_for(lambda: len(handle.results) >= 250, 30, "the rows of the files added while running")
        # five more scans each (monitor_interval 0.2 s): each source subtask idle for another
        # second between them, by its own metrics; a file read twice would have shown by then
        idle = source_idle_ms(client, handle.job_id)
        wait_for(lambda: all(now >= then + 1000 for now, then in zip(source_idle_ms(client, handle.job_id), idle)),
                 60, "five more scans of the directory")
        # and every row they read by then is in the handle: a row read twice is in the frame below
        read = rows_read(client, handle.job_id)
        wait_for(lambda: len(handle.results) >= read, 30, f"the {read} rows read in the handle")
        assert handle.status == JobState.RUNNING
        pd.testing.assert_frame_equal(sorted_frame(handle.results, ["price"]), orders(250), check_dtype=False)
    finally:
        handle.cancel()
    with pytest.raises(JobCancelledError):
        handle.wait(20)


def malformed_orders(directory) -> tuple[list, list]:
    """Two CSV files with bad records among good ones: (good rows, [(file, line, reason start)])."""
    directory.mkdir()
    (directory / "a.csv").write_text("user,amount,price\nann,1,0.5\nbob,many,1.0\ncid,3,1.5\n")
    (directory / "b.csv").write_text("user,amount,price\ndan,4\neve,5,2.5\nfay,6,cheap\n")
    good = [("ann", 1, 0.5), ("cid", 3, 1.5), ("eve", 5, 2.5)]
    bad = [(str(directory / "a.csv"), "3", "column 'amount': 'many' is not a valid int64"),
           (str(directory / "b.csv"), "2", "expected 3 fields, got 2"),
           (str(directory / "b.csv"), "4", "column 'price': 'cheap' is not a valid double")]
    return good, bad


def test_malformed_rows_go_to_the_side_output_with_their_reason(cluster, client, tmp_path):
    good, bad = malformed_orders(tmp_path / "in")
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    stream = env.from_source(FileSource.csv(tmp_path / "in", schema=SCHEMA), name="orders")
    stream.collect("orders")
    stream.get_side_output("malformed").collect("malformed")
    result = env.execute_async("malformed", client=client).wait(60)
    assert sorted(result.to_pandas("orders").itertuples(index=False, name=None)) == good
    got = sorted_frame(result.to_pandas("malformed"), ["source", "position"])
    assert list(got.columns) == ["source", "position", "raw", "reason"]
    assert [(s, p, r[:len(want)]) for (s, p, _, r), (_, _, want) in zip(got.itertuples(index=False), bad)] == bad
    assert list(got["raw"]) == ["bob,many,1.0", "dan,4", "fay,6,cheap"]


def test_malformed_row_without_side_output_fails_the_job_naming_file_and_line(cluster, client, tmp_path):
    malformed_orders(tmp_path / "in")
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_source(FileSource.csv(tmp_path / "in", schema=SCHEMA), name="orders").collect()
    with pytest.raises(JobExecutionError, match=rf"operator 'orders' \(test_connectors.py:\d+\): malformed record in "
                                                rf"{tmp_path / 'in' / 'a.csv'}, line 3: column 'amount': 'many' is not "
                                                rf"a valid int64"):
        env.execute_async("malformed fails", client=client).wait(60)


def test_redis_stream_in_transformed_to_redis_stream_out(cluster, client, redis_url):  # noqa: F811
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        def add(key: str, df: pd.DataFrame, start: int) -> dict[str, dict]:
            # ids of our own, "<stream>-<row>": Redis's own are "<ms>-<seq>" per stream, so the two
            # streams' entries of one millisecond had the same ids, and the expected rows collided
            stream = 1 + ["orders-a", "orders-b"].index(key)
            return {r.xadd(key, {k: str(v) for k, v in row.items()}, id=f"{stream}-{start + i}"): row
                    for i, row in enumerate(df.to_dict("records"))}

        sent = add("orders-a", orders(300), 0) | add("orders-b", orders(200, start=300), 300)
        env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
        (env.from_source(RedisStreamSource(redis_url, ["orders-a", "orders-b"], schema=SCHEMA, count=400,
                                           id_field="id", batch_size=64))
            .map_batches(lambda df: df.assign(total=df.amount * df.price))
            .sink_to(RedisStreamSink(redis_url, "totals")))
        handle = env.execute_async("redis to redis", client=client)
        wait_for(lambda: r.xlen("totals") >= 500, 30, "the first entries through the job")
        # the rest arrives while the job runs: it waits for `count` entries of each stream
        sent |= add("orders-a", orders(100, start=500), 500) | add("orders-b", orders(200, start=600), 600)
        assert handle.wait(60).state == JobState.FINISHED
        out = {f["id"]: f for _, f in r.xrange("totals")}
        assert len(sent) == 800 and sorted(out) == sorted(sent)  # every entry once
        for entry, row in sent.items():
            got = out[entry]
            assert (got.keys(), got["user"], int(got["amount"])) == (
                {"id", "user", "amount", "price", "total"}, row["user"], row["amount"])
            assert (float(got["price"]), float(got["total"])) == (row["price"], row["amount"] * row["price"])
    finally:
        r.close()
