"""Event time on a real cluster: windows against a pandas reference that replays Flink's rules,
late records, idleness, watermarks through Spark, processing time, and savepoints of window jobs.

Determinism: the source reads fixed batches at parallelism 1 and emits a watermark after each
(pipeline.auto-watermark-interval 0), so which records are late is a fact of the data, which
the reference works out by replaying the same batches.
"""
from __future__ import annotations

import glob
import os
import re
import time
import zlib

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.api import (Duration, EventTimeSessionWindows, FileSink, FileSource, SlidingEventTimeWindows, Time,
                                TumblingEventTimeWindows, TumblingProcessingTimeWindows, WatermarkStrategy)
from tests.conftest import rest, wait_for

NO_WATERMARK = -(1 << 63)
N, BATCH, BOUND, LATENESS, SIZE = 2_000, 10, 500, 1_000, 1_000


def events(seq):
    """Rows 100 ms apart in event time; every 37th is 2.8 s late, some of them beyond the
    watermark plus the allowed lateness, some within it."""
    ts = seq * 100 - np.where(seq % 37 == 36, 2_800, 0)
    return pd.DataFrame({"k": seq % 3, "v": seq % 11, "ts": ts, "seq": seq})


def epoch_ms(times: pd.Series) -> pd.Series:
    return (times.dt.tz_localize(None) if times.dt.tz is not None else times).astype("datetime64[ms]").astype("int64")


def strategy(bound=BOUND):
    return WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(bound)).with_timestamp_column("ts")


def deterministic_env(cluster, **config) -> StreamEnvironment:
    return StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir,
                             config={"pipeline.auto-watermark-interval": 0} | config)


def replay(frame: pd.DataFrame, starts_of, lateness: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Flink's window operator over the batches as the source reads them: a record whose every
    window ended more than ``lateness`` before the watermark is late (dropped); the watermark
    after each batch is the largest timestamp so far minus the bound minus 1.

    Returns (the final value of every window, the value each window had when the watermark first
    passed it, the late records)."""
    watermark = NO_WATERMARK
    newest = NO_WATERMARK
    counted, late = [], []
    on_time_cut: dict[tuple, int] = {}  # (k, start) -> rows counted when it first fired
    for begin in range(0, len(frame), BATCH):
        batch = frame.iloc[begin:begin + BATCH]
        for row in batch.itertuples(index=False):
            windows = [s for s in starts_of(row.ts) if s + SIZE - 1 + lateness > watermark]
            if not windows:
                late.append(row)
            counted += [(row.k, s, row.v, row.seq) for s in windows]
        newest = max(newest, int(batch.ts.max()))
        watermark = newest - BOUND - 1
        table = pd.DataFrame(counted, columns=["k", "start", "v", "seq"])
        for (k, start), rows in table.groupby(["k", "start"]):
            if start + SIZE - 1 <= watermark and (k, start) not in on_time_cut:
                on_time_cut[(k, start)] = rows.seq.max()
    table = pd.DataFrame(counted, columns=["k", "start", "v", "seq"])
    for (k, start), rows in table.groupby(["k", "start"]):  # the end of input's watermark fires the rest
        on_time_cut.setdefault((k, start), rows.seq.max())

    def windows(rows: pd.DataFrame) -> pd.DataFrame:
        out = rows.groupby(["k", "start"]).agg(n=("v", "count"), total=("v", "sum")).reset_index()
        out["window_start"] = pd.to_datetime(out.start, unit="ms")
        out["window_end"] = pd.to_datetime(out.start + SIZE, unit="ms")
        return out[["k", "window_start", "window_end", "n", "total"]].sort_values(
            ["k", "window_start"]).reset_index(drop=True)

    final = windows(table)
    first = windows(table[[s <= on_time_cut.get((k, st), -1) for k, st, s in zip(table.k, table.start, table.seq)]])
    return final, first, pd.DataFrame(late)


def tumbling(ts: int) -> list[int]:
    return [ts - ts % SIZE]


def sliding(ts: int) -> list[int]:
    last = ts - ts % (SIZE // 2)
    return [s for s in (last, last - SIZE // 2) if s > ts - SIZE]


def sorted_windows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[["k", "window_start", "window_end", "n", "total"]].sort_values(
        ["k", "window_start"]).reset_index(drop=True)


@pytest.mark.parametrize("assigner,starts_of", [
    (TumblingEventTimeWindows.of(Time.seconds(1)), tumbling),
    (SlidingEventTimeWindows.of(Time.seconds(1), Time.milliseconds(500)), sliding)], ids=["tumbling", "sliding"])
def test_windows_with_lateness_equal_the_reference(cluster, client, assigner, starts_of):
    final, first, late = replay(events(np.arange(N, dtype=np.int64)), starts_of, LATENESS)
    # the data has all three kinds: on time, late within the lateness (windows updated), too late
    assert len(late) > 0 and not first[["n", "total"]].equals(final[["n", "total"]])
    env = deterministic_env(cluster)
    windowed = (env.from_generator(events, count=N, batch_size=BATCH, watermark_strategy=strategy())
                .key_by("k").window(assigner).allowed_lateness(Time.seconds(1)).side_output_late_data("late")
                .aggregate(n=("v", "count"), total=("v", "sum")))
    windowed.changelog().collect("changes")
    windowed.collect("table")
    windowed.get_side_output("late").collect("late")
    handle = env.execute_async("windows with lateness", client=client)
    result = handle.wait(120)
    pd.testing.assert_frame_equal(sorted_windows(result.results["table"]), final, check_dtype=False)
    changes = result.results["changes"]
    firsts = changes.groupby(["k", "window_start"], as_index=False).head(1)
    pd.testing.assert_frame_equal(sorted_windows(firsts), first, check_dtype=False)
    assert len(changes) > len(final)  # late records within the lateness updated their windows' rows
    assert sorted(result.results["late"]["seq"]) == sorted(late.seq)
    # and they are seen where the job runs: the newest 20 (one subtask), as they came
    seen = handle.late_rows("window")
    assert seen["seq"].tolist() == late.seq.tolist()[-20:]
    assert (seen.attrs["count"], seen.attrs["dropped"], seen.attrs["side_output"]) == (len(late), 0, "late")
    assert (epoch_ms(seen["event_time"]) == seen["ts"]).all() and (seen["late_by"] > pd.Timedelta(0)).all()


def test_late_records_without_a_side_output_are_counted(cluster, client):
    _, _, late = replay(events(np.arange(N, dtype=np.int64)), tumbling, 0)
    env = deterministic_env(cluster)
    (env.from_generator(events, count=N, batch_size=BATCH, watermark_strategy=strategy())
        .key_by("k").window(TumblingEventTimeWindows.of(Time.seconds(1))).count().collect())
    handle = env.execute_async("late records counted", client=client)
    handle.wait(120)
    window = next(v for v in client.job_details(handle.job_id)["vertices"] if v["name"].startswith("window"))
    dropped = sum(s["metrics"]["numLateRecordsDropped"] for s in client.job_details(handle.job_id)["subtasks"]
                  if s["vertex_id"] == window["id"])
    assert dropped == len(late) > 0
    # counted before the exchange, the rows are gone: the late partials stand for them, per key and
    # window at its last instant, the newest 20 in REST and in the handle
    status, (report,) = rest(cluster, f"/jobs/{handle.job_id}/late-rows")
    assert status == 200 and (report["name"], report["count"], report["dropped"], report["side-output"]) == (
        "window", len(late), len(late), None)
    partials = handle.late_rows("window")
    assert list(partials.columns[:4]) == ["k", "window_start", "window_end", "rows"] and len(partials) == 20
    late_windows = set(zip(late.k, late.ts - late.ts % 1000))
    assert set(zip(partials.k, epoch_ms(partials.window_start))) <= late_windows
    assert (epoch_ms(partials["event_time"]) == epoch_ms(partials["window_end"]) - 1).all()
    with pytest.raises(KeyError, match="no window or join operator named 'windw'.*'window'"):
        handle.late_rows("windw")


def sessions_reference(frame: pd.DataFrame, gap: int) -> pd.DataFrame:
    rows = []
    for k, group in frame.sort_values("ts").groupby("k"):
        session = (group.ts.diff() >= gap).cumsum()
        for _, s in group.groupby(session):
            rows.append((k, s.ts.min(), s.ts.max() + gap, len(s), s.v.sum()))
    out = pd.DataFrame(rows, columns=["k", "window_start", "window_end", "n", "total"])
    out["window_start"] = pd.to_datetime(out.window_start, unit="ms")
    out["window_end"] = pd.to_datetime(out.window_end, unit="ms")
    return out.sort_values(["k", "window_start"]).reset_index(drop=True)


def bursts(seq):
    """Per key, bursts of rows 100 ms apart with pauses of 3 s between bursts, out of order
    within the bound."""
    burst, i = seq // 20, seq % 20
    ts = burst * 5_000 + i * 100 + (seq % 2) * 150
    return pd.DataFrame({"k": seq % 4, "v": seq % 7, "ts": ts})


def test_session_windows_equal_the_reference(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(bursts, count=4_000, watermark_strategy=strategy(200))
        .key_by("k").window(EventTimeSessionWindows.with_gap(Time.seconds(1)))
        .aggregate(n=("v", "count"), total=("v", "sum"), parallelism=3).collect())
    result = env.execute_async("sessions", client=client).wait(120).to_pandas()
    expected = sessions_reference(bursts(np.arange(4_000, dtype=np.int64)), 1_000)
    pd.testing.assert_frame_equal(sorted_windows(result), expected, check_dtype=False)


def test_windows_after_spark_are_pre_aggregated_before_the_exchange(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(bursts, count=20_000, watermark_strategy=strategy(200))
        .sql("SELECT k, v * 2 AS v, ts FROM input")
        .key_by("k").window(TumblingEventTimeWindows.of(Time.seconds(1)))
        .aggregate(n=("v", "count"), total=("v", "sum")).collect())
    handle = env.execute_async("windows after spark", client=client)
    result = handle.wait(180).to_pandas()
    frame = bursts(np.arange(20_000, dtype=np.int64)).assign(v=lambda d: d.v * 2)
    frame["start"] = frame.ts - frame.ts % 1_000
    expected = frame.groupby(["k", "start"]).agg(n=("v", "count"), total=("v", "sum")).reset_index()
    expected["window_start"] = pd.to_datetime(expected.start, unit="ms")
    expected["window_end"] = pd.to_datetime(expected.start + 1_000, unit="ms")
    pd.testing.assert_frame_equal(sorted_windows(result), sorted_windows(expected), check_dtype=False)
    source = next(v for v in client.job_details(handle.job_id)["vertices"] if v["name"].startswith("Source"))
    assert source["name"] == "Source: generator -> Timestamps/Watermarks -> sql -> window (partial)"


def test_an_idle_split_holds_the_watermark_back_only_without_idleness(cluster, client, tmp_path):
    """A watching FileSource at parallelism 2 with one file: the other subtask has no split."""
    for idleness in (None, Duration.of_millis(300)):
        folder = tmp_path / ("idle" if idleness else "held")
        folder.mkdir()
        name = next(f"events-{i}.csv" for i in range(100)
                    if zlib.crc32(str(folder / f"events-{i}.csv").encode()) % 2 == 0)  # subtask 0's (files.py)
        frame = bursts(np.arange(400, dtype=np.int64))
        frame.to_csv(folder / name, index=False)
        ws = strategy(200)
        ws = ws.with_idleness(idleness) if idleness else ws
        env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
        (env.from_source(FileSource.csv(str(folder), schema={"k": "int64", "v": "int64", "ts": "int64"}, watch=True,
                                        monitor_interval=0.2), ws)
            .key_by("k").window(TumblingEventTimeWindows.of(Time.seconds(1))).count(parallelism=1).collect())
        handle = env.execute_async(f"idleness {idleness}", client=client)
        if idleness:
            wait_for(lambda: handle.row_count() > 0, 30, "windows fired past the idle split")
        else:
            wait_for(lambda: handle.job_status().state == "RUNNING" and any(
                s["metrics"].get("newestEventTimestamp", NO_WATERMARK) >= int(frame.ts.max())
                for s in client.job_details(handle.job_id)["subtasks"]), 30, "every row read")
            details = client.job_details(handle.job_id)
            source, window = (next(v["id"] for v in details["vertices"] if v["name"].startswith(name))
                              for name in ("Source", "window"))

            def metrics(vertex: str) -> list[dict]:
                return [s["metrics"] for s in client.job_details(handle.job_id)["subtasks"] if s["vertex_id"] == vertex]
            # the reading subtask sent a watermark past every window's end: were it the window's,
            # they would all fire
            wait_for(lambda: max(m.get("currentOutputWatermark", NO_WATERMARK) for m in metrics(source))
                     >= int(frame.ts.max()) - 201, 30, "the reading subtask's last watermark")
            # then the window task waits two more seconds of its own with nothing queued: whatever
            # came before (that watermark included) it has handled
            idle = metrics(window)[0]["idle-ms"]
            wait_for(lambda: (m := metrics(window)[0])["idle-ms"] >= idle + 2_000 and m["input-queue"] == 0, 60,
                     "the window task idle two more seconds")
            assert handle.row_count() == 0
            assert all(m["currentInputWatermark"] == NO_WATERMARK for m in metrics(window))
            # and the job says why: the oldest window waits for subtask 1, which read no row
            status, job = rest(cluster, f"/jobs/{handle.job_id}")
            (wait,) = job["window-waits"]
            first = int(frame.ts.min()) - int(frame.ts.min()) % 1_000
            assert status == 200 and (wait["operator"], wait["window"]) == ("window", [first, first + 1_000])
            held = wait["held_by"]
            assert (held["vertex_id"], held["subtask"], held["watermark"], held["idle"]) == (
                source, 1, NO_WATERMARK, False)
            assert "waits for subtask 1 of 'Source: " in wait["text"] and "with_idleness" in wait["text"]
        handle.cancel()
        wait_for(lambda: handle.job_status().state == "CANCELED", 30, "the job cancelled")


def test_processing_time_windows_fire_by_the_clock(cluster, client):
    """As Flink's: a processing-time window fires when the wall clock passes its end (windows still
    open when a bounded input ends are not fired, so this job runs until cancelled)."""
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(lambda seq: pd.DataFrame({"k": seq % 3, "seq": seq}), rate=2_000)
        .key_by("k").window(TumblingProcessingTimeWindows.of(Time.milliseconds(300))).count().collect())
    handle = env.execute_async("processing time", client=client)
    started = time.time()
    wait_for(lambda: handle.row_count() >= 12, 30, "a few windows fired")
    handle.cancel()
    wait_for(lambda: handle.job_status().state == "CANCELED", 30, "the job cancelled")
    frame = handle.to_pandas()
    assert ((frame.window_end - frame.window_start) == pd.Timedelta(milliseconds=300)).all()
    assert (frame.window_start.astype("datetime64[ms]").astype("int64") % 300 == 0).all()
    assert (frame.window_start >= pd.Timestamp(started - 1, unit="s")).all()
    assert frame.groupby(["k", "window_start"]).size().max() == 1 and frame["count"].gt(0).all()


# ---------------------------------------------------------------------- savepoints of window jobs
def windowed_job(cluster, parallelism: int, out: str, savepoint: str = "", rate=None):
    config = {"execution.checkpointing.interval": "300 ms"}
    if savepoint:
        config["execution.savepoint.path"] = savepoint
    env = StreamEnvironment(parallelism=parallelism, cluster=cluster.cluster_dir, config=config)
    (env.from_generator(bursts, count=20_000, rate=rate, batch_size=250, watermark_strategy=strategy(200))
        .key_by("k").window(TumblingEventTimeWindows.of(Time.seconds(2)))
        .aggregate(n=("v", "count"), total=("v", "sum"))
        .sink_to(FileSink.parquet(out, rows_per_file=200)))
    return env


def written(*folders: str) -> pd.DataFrame:
    files = [f for folder in folders for f in glob.glob(os.path.join(folder, "part-*.parquet"))]
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


def test_a_window_savepoint_restores_at_another_parallelism_with_identical_results(cluster, tmp_path):
    client = JobClient(cluster.info)
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    handle = windowed_job(cluster, 2, first, rate=4_000).execute_async("windows p2", client=client)
    wait_for(lambda: rest(cluster, f"/jobs/{handle.job_id}/checkpoints")[1]["counts"]["completed"] >= 2, 60,
             "two completed checkpoints")
    location = handle.stop(target_directory=str(tmp_path / "savepoints"))
    handle.wait(60)
    before = written(first)
    assert 0 < len(before)
    restored = windowed_job(cluster, 3, second, savepoint=location).execute_async("windows p3", client=client)
    restored.wait(120)
    client.close()
    result = written(first, second)
    frame = bursts(np.arange(20_000, dtype=np.int64))
    frame["start"] = frame.ts - frame.ts % 2_000
    expected = frame.groupby(["k", "start"]).agg(n=("v", "count"), total=("v", "sum")).reset_index()
    expected["window_start"] = pd.to_datetime(expected.start, unit="ms")
    expected["window_end"] = pd.to_datetime(expected.start + 2_000, unit="ms")
    # every window once: fired before the stop, or by the restored job from the savepoint's state
    pd.testing.assert_frame_equal(sorted_windows(result), sorted_windows(expected), check_dtype=False)


def test_a_timestamp_column_lost_on_the_way_fails_the_job_naming_the_window(cluster, client):
    """The client cannot know a Spark step's output: the window finds the column missing at run
    time, and the job's failure says which operator, where, and what the input has."""
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    (env.from_generator(bursts, count=100, watermark_strategy=strategy(200))
        .sql("SELECT k, v FROM input")
        .key_by("k").window(EventTimeSessionWindows.with_gap(Time.seconds(1))).count().collect())
    handle = env.execute_async("lost timestamps", client=client)
    with pytest.raises(Exception) as failure:
        handle.wait(120)
    assert handle.job_status().state == "FAILED"
    message = str(failure.value)
    assert re.search(r"operator 'window' \(test_event_time\.py:\d+\): the timestamp column 'ts' is not in its "
                     r"input \(columns: \['k', 'v'\]\)", message), message
