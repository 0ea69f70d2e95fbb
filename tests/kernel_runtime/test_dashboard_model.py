"""What the dashboard derives from the JobManager's answers (pure: dicts in, values out)."""
import re

import pytest

from kernel_runtime import StreamEnvironment
from kernel_runtime.api import FileSource
from kernel_runtime.notebook.widgets.job_graph import layout, operator_names
from cluster.protocol.metrics import backpressure_level
from cluster.graph.event_time import MAX_WATERMARK, NO_WATERMARK, duration_text, time_text
from kernel_runtime.notebook.widgets.metrics import (JobMetrics, RateMeter, VertexStats, bottleneck, event_time,
                                                    load_color, source_progress)
from kernel_runtime.notebook.widgets.base import Update
from kernel_runtime.notebook.widgets.feed import Snapshot
from kernel_runtime.notebook.widgets.progress import ProgressView
from kernel_runtime.notebook.widgets.slots import slot_table
from kernel_runtime.notebook.widgets.watermarks import WatermarksView


@pytest.mark.parametrize("ratio, level", [(0.0, "ok"), (0.10, "ok"), (0.11, "low"), (0.5, "low"), (0.51, "high"),
                                          (1.0, "high")])
def test_backpressure_is_graded_as_flink_grades_it(ratio, level):
    assert backpressure_level(ratio) == level


def test_rate_meter_smooths_over_its_window_and_restarts_with_the_counter():
    meter = RateMeter(window_s=2.0)
    assert meter.add(0.0, 0) == 0.0
    assert meter.add(0.5, 0) == 0.0  # the counter moves once per heartbeat
    assert meter.add(1.0, 1000) == pytest.approx(1000.0)
    assert meter.add(3.0, 3000) == pytest.approx(1000.0)
    assert meter.add(3.5, 10) == 0.0  # a new attempt counts from zero


def subtask(vertex, index, status="RUNNING", attempt=1, **metrics):
    return {"vertex_id": vertex, "vertex": vertex, "subtask": index, "attempt": attempt, "status": status,
            "taskmanager_id": "tm-0", "slot": index, "metrics": metrics}


def details(*subtasks):
    return {"vertices": [{"id": "src", "name": "Source: events", "parallelism": 2, "status": "RUNNING"},
                         {"id": "cnt", "name": "count -> collect", "parallelism": 1, "status": "RUNNING"}],
            "subtasks": list(subtasks)}


def test_a_vertex_shows_the_shares_of_its_most_back_pressured_subtask_which_add_up():
    metrics = JobMetrics()
    (src, cnt) = metrics.observe(1.0, details(
        subtask("src", 0, busyTimeMsPerSecond=100, backPressuredTimeMsPerSecond=850, idleTimeMsPerSecond=50),
        subtask("src", 1, busyTimeMsPerSecond=300, backPressuredTimeMsPerSecond=200, idleTimeMsPerSecond=500),
        subtask("cnt", 0, busyTimeMsPerSecond=990, backPressuredTimeMsPerSecond=0, idleTimeMsPerSecond=10)))
    assert (src.busy, src.backpressured, src.idle) == pytest.approx((0.1, 0.85, 0.05))
    assert src.level == "HIGH" and cnt.level == "OK" and cnt.busy == pytest.approx(0.99)


def test_without_back_pressure_a_vertex_shows_its_busiest_subtask():
    (src, _) = JobMetrics().observe(1.0, details(
        subtask("src", 0, busyTimeMsPerSecond=750, backPressuredTimeMsPerSecond=0, idleTimeMsPerSecond=250),
        subtask("src", 1, busyTimeMsPerSecond=160, backPressuredTimeMsPerSecond=0, idleTimeMsPerSecond=840)))
    assert (src.busy, src.backpressured, src.idle) == pytest.approx((0.75, 0.0, 0.25))


@pytest.mark.parametrize("figures", [(750, 0, 420), (0, 0, 0), (333.3, 333.3, 333.3), (1000.4, 0, 0)])
def test_shares_always_add_up_to_one(figures):
    busy, bp, idle = figures
    (src, _) = JobMetrics().observe(1.0, details(subtask(
        "src", 0, busyTimeMsPerSecond=busy, backPressuredTimeMsPerSecond=bp, idleTimeMsPerSecond=idle)))
    assert src.busy + src.backpressured + src.idle == pytest.approx(1.0 if sum(figures) else 0.0)


def test_time_shares_and_rates_derived_from_cumulative_counters():
    metrics = JobMetrics(window_s=5.0)
    metrics.observe(0.0, details(subtask("src", 0, **{"busy-ms": 0, "backpressured-ms": 0, "idle-ms": 0,
                                                      "records-in": 0, "records-out": 0})))
    (src, cnt) = metrics.observe(2.0, details(subtask("src", 0, **{
        "busy-ms": 600, "backpressured-ms": 1200, "idle-ms": 200, "records-in": 4000, "records-out": 3000})))
    assert (src.busy, src.backpressured, src.idle) == pytest.approx((0.3, 0.6, 0.1))
    assert (src.in_rate, src.out_rate) == pytest.approx((2000.0, 1500.0))
    assert src.level == "HIGH" and (cnt.records_in, cnt.busy) == (0, 0.0)


def test_running_subtasks_show_the_load_and_ended_ones_keep_their_last_figures():
    ended = {"records-in": 5, "backPressuredTimeMsPerSecond": 900, "busyTimeMsPerSecond": 100,
             "idleTimeMsPerSecond": 0}
    (src, _) = JobMetrics().observe(1.0, details(
        subtask("src", 0, status="FINISHED", **ended),
        subtask("src", 1, **{"records-in": 7, "backPressuredTimeMsPerSecond": 0, "busyTimeMsPerSecond": 400,
                             "idleTimeMsPerSecond": 600})))
    assert src.records_in == 12 and (src.busy, src.backpressured, src.idle) == pytest.approx((0.4, 0.0, 0.6))
    (src, _) = JobMetrics().observe(2.0, details(subtask("src", 0, status="FINISHED", **ended),
                                                 subtask("src", 1, status="CANCELED", **ended)))
    assert src.records_in == 10 and (src.busy, src.backpressured, src.idle) == pytest.approx((0.1, 0.9, 0.0))


def test_source_progress_counts_bounded_generators():
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=1000).key_by("seq").count().collect()
    graph = env.get_job_graph("t")
    source = next(v for v in graph.vertices if v.is_source)
    stats = JobMetrics().observe(1.0, {"vertices": [{"id": source.id, "name": source.name, "parallelism": 2}],
                                       "subtasks": [subtask(source.id, 0, **{"records-in": 300}),
                                                    subtask(source.id, 1, **{"records-in": 200})]})
    assert source_progress(graph, stats) == (500, 1000, True)
    unbounded = StreamEnvironment()
    unbounded.from_generator(rate=10).collect()
    assert source_progress(unbounded.get_job_graph("u"), []) == (0, None, False)


@pytest.mark.parametrize("watch, bounded", [(False, True), (True, False)])
def test_a_file_source_is_bounded_unless_it_watches_for_new_files(tmp_path, watch, bounded):
    (tmp_path / "a.csv").write_text("x\n1\n")
    env = StreamEnvironment()
    env.from_source(FileSource.csv(str(tmp_path), schema={"x": "int64"}, watch=watch)).collect()
    graph = env.get_job_graph("files")
    source = next(v for v in graph.vertices if v.is_source)
    stats = JobMetrics().observe(1.0, {"vertices": [{"id": source.id, "name": source.name, "parallelism": 1}],
                                       "subtasks": [subtask(source.id, 0, **{"records-in": 1000})]})
    assert source_progress(graph, stats) == (1000, None, bounded)
    view = ProgressView(graph)
    view.update(Update(Snapshot(1.0, {"state": "RUNNING"}, {}), stats, 1.0))
    assert f"1,000 rows so far ({'bounded' if bounded else 'unbounded'} source)" in view.label.value


def test_slot_table_shows_free_busy_and_other_jobs_slots_with_their_subtasks():
    taskmanagers = [{"id": "tm-1", "slots": [None, {"job_id": "other"}]},
                    {"id": "tm-0", "slots": [{"job_id": "mine"}, None]}]
    subtasks = [dict(subtask("count", 0), taskmanager_id="tm-0", slot=0),
                dict(subtask("Source: events", 0), taskmanager_id="tm-0", slot=0)]
    layout_ = slot_table("mine", taskmanagers, subtasks)
    assert [tm for tm, _ in layout_] == ["tm-0", "tm-1"]
    assert [s["state"] for _, slots in layout_ for s in slots] == ["busy", "free", "free", "other"]
    assert layout_[0][1][0]["subtasks"] == ["count (1) RUNNING", "Source: events (1) RUNNING"]


def test_job_graph_layout_puts_each_vertex_one_column_after_its_inputs():
    plan = {"nodes": [  # as Flink lists them: sinks first
        {"id": "sink", "description": "count [keyed-count] (a.py:3)<br/>collect [collect-sink] (a.py:4)",
         "parallelism": 2, "inputs": [{"id": "map", "ship_strategy": "HASH"}]},
        {"id": "map", "description": "slow [map-batches] (a.py:2)", "parallelism": 1,
         "inputs": [{"id": "src", "ship_strategy": "FORWARD"}]},
        {"id": "src", "description": "events [generator-source] (a.py:1)", "parallelism": 1}]}
    assert layout(plan) == {"src": (0, 0), "map": (1, 0), "sink": (2, 0)}
    assert operator_names(plan["nodes"][0]["description"]) == ["count", "collect"]


# event time: each vertex's watermark, its lag behind the newest event time, late records dropped
T = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC


def timed(vertex, index, watermark, newest=None, late=None, status="RUNNING"):
    metrics = {"currentInputWatermark": watermark, "currentOutputWatermark": watermark}
    if newest is not None:
        metrics["newestEventTimestamp"] = newest
    if late is not None:
        metrics["numLateRecordsDropped"] = late
    return subtask(vertex, index, status, **metrics)


def test_a_vertex_shows_its_lowest_subtask_watermark_its_lag_behind_the_newest_event_time_and_late_records():
    job = event_time(details(timed("src", 0, T + 9_799, newest=T + 10_000),
                             timed("src", 1, T + 11_799, newest=T + 12_000),
                             timed("cnt", 0, T + 8_999, newest=T + 11_500, late=3)))
    assert job.newest == T + 12_000  # the newest of the whole job, whichever vertex saw it
    src, cnt = job.vertices
    assert (src.vertex_id, src.watermark, src.lag_ms, src.late_dropped) == ("src", T + 9_799, 2_201, 0)
    assert (cnt.vertex_id, cnt.watermark, cnt.lag_ms, cnt.late_dropped) == ("cnt", T + 8_999, 3_001, 3)


def test_late_records_add_up_over_a_vertexs_subtasks():
    details_ = {"vertices": [{"id": "win", "name": "window", "parallelism": 3, "status": "RUNNING"}],
                "subtasks": [timed("win", i, T, newest=T + 500, late=late) for i, late in enumerate((2, 0, 5))]}
    (win,) = event_time(details_).vertices
    assert win.late_dropped == 7 and win.lag_ms == 500


@pytest.mark.parametrize("second", [timed("src", 1, NO_WATERMARK), subtask("src", 1, status="DEPLOYING")],
                         ids=["no watermark yet", "not reported yet"])
def test_a_subtask_without_a_watermark_holds_its_vertex_back_and_it_has_no_lag(second):
    job = event_time(details(timed("src", 0, T + 800, newest=T + 1_000), second,
                             timed("cnt", 0, NO_WATERMARK)))
    src, cnt = job.vertices
    assert (src.watermark, src.lag_ms) == (NO_WATERMARK, None)
    assert (cnt.watermark, cnt.lag_ms) == (NO_WATERMARK, None)


def test_before_any_event_time_is_seen_a_moving_watermark_still_shows_event_time():
    job = event_time(details(timed("src", 0, T), timed("src", 1, T + 5), timed("cnt", 0, T)))
    assert job.newest is None and [(v.watermark, v.lag_ms) for v in job.vertices] == [(T, None), (T, None)]


def test_at_the_end_of_input_the_watermark_is_the_end_and_there_is_no_lag():
    job = event_time(details(timed("src", 0, MAX_WATERMARK, newest=T, status="FINISHED"),
                             timed("src", 1, MAX_WATERMARK, newest=T + 1, status="FINISHED"),
                             timed("cnt", 0, T - 200, newest=T + 1)))
    src, cnt = job.vertices
    assert (src.watermark, src.lag_ms) == (MAX_WATERMARK, None) and (cnt.watermark, cnt.lag_ms) == (T - 200, 201)


def test_a_lag_is_never_negative_when_the_newest_event_time_is_an_older_report():
    (src, cnt) = event_time(details(timed("src", 0, T + 5_000, newest=T + 4_000),
                                    timed("cnt", 0, T + 4_500))).vertices
    assert src.lag_ms == 0 and cnt.lag_ms == 0


@pytest.mark.parametrize("subtasks", [
    [subtask("src", 0, **{"records-in": 5}), subtask("cnt", 0)],  # no event-time metrics at all
    [timed("src", 0, NO_WATERMARK), timed("src", 1, NO_WATERMARK), timed("cnt", 0, NO_WATERMARK)],
    # a bounded job without event time ends with MAX_WATERMARK all the same
    [timed("src", 0, MAX_WATERMARK, newest=NO_WATERMARK), timed("cnt", 0, MAX_WATERMARK)],
], ids=["no metrics", "no watermarks", "ended without event time"])
def test_a_job_without_event_time_shows_none(subtasks):
    assert event_time(details(*subtasks)) is None
    view = WatermarksView()
    view.update(Update(Snapshot(1.0, details(*subtasks) | {"state": "RUNNING"}, {}), [], 1.0))
    assert view.root.value == ""


def test_the_view_shows_watermarks_as_times_lags_as_durations_and_late_records():
    view = WatermarksView()
    snapshot = Snapshot(1.0, details(timed("src", 0, T + 9_799, newest=T + 12_000),
                                     timed("src", 1, MAX_WATERMARK, newest=T + 11_000),
                                     timed("cnt", 0, NO_WATERMARK, late=1_234)) | {"state": "RUNNING"}, {})
    view.update(Update(snapshot, [], 1.0))
    text = view.root.value
    assert "newest event time: 2023-11-14 22:13:32.000" in text
    assert 'data-watermark="%d">2023-11-14 22:13:29.799<' % (T + 9_799) in text
    assert 'data-lag-ms="2201">2.20 s<' in text
    assert f'data-watermark="{NO_WATERMARK}">no watermark<' in text and 'data-lag-ms=""><' in text
    assert 'data-late="1234">1,234<' in text


@pytest.mark.parametrize("ms, text", [(0, "0 ms"), (999, "999 ms"), (1_000, "1.00 s"), (59_994, "59.99 s"),
                                      (60_000, "1 min 00 s"), (125_000, "2 min 05 s"), (3_600_000, "1 h 00 min"),
                                      (11_045_000, "3 h 04 min")])
def test_lags_read_as_durations(ms, text):
    assert duration_text(ms) == text


def test_times_read_as_utc_or_as_what_they_stand_for():
    assert time_text(T + 7) == "2023-11-14 22:13:20.007" and time_text(0) == "1970-01-01 00:00:00.000"
    assert (time_text(NO_WATERMARK), time_text(MAX_WATERMARK)) == ("no watermark", "end of input")


def test_the_source_view_shows_each_kafka_partition_with_its_offset_lag_and_watermark():
    from kernel_runtime.notebook.widgets.sources import SourcesView, partitions
    reader = "KafkaSourceReader.topic.orders.partition"
    snapshot = details(subtask("src", 0, **{f"{reader}.0.currentOffset": 1200, f"{reader}.0.pendingRecords": 35,
                                            f"{reader}.2.currentOffset": 7, f"{reader}.2.pendingRecords": 0,
                                            "split.orders-0.currentWatermark": T + 7}),
                       subtask("src", 1, **{f"{reader}.1.currentOffset": 900, f"{reader}.1.pendingRecords": 4}),
                       subtask("cnt", 0, **{"numLateRecordsDropped": 0}))
    rows = partitions(snapshot)
    assert [(r.subtask, r.split, r.offset, r.lag, r.watermark) for r in rows] == [
        (0, "orders-0", 1200, 35, T + 7), (1, "orders-1", 900, 4, None), (0, "orders-2", 7, 0, None)]
    view = SourcesView()
    view.update(Update(Snapshot(1.0, snapshot | {"state": "RUNNING"}, {}), [], 1.0))
    assert 'data-pending="35">35<' in view.root.value and "2023-11-14 22:13:20.007" in view.root.value
    view.update(Update(Snapshot(2.0, details(subtask("src", 0)) | {"state": "RUNNING"}, {}), [], 2.0))
    assert view.root.value == ""  # no Kafka source: no view


def _vertex(vid: str, busy: float, backpressured: float) -> VertexStats:
    return VertexStats(vid, vid, 1, "RUNNING", 0, 0, 0.0, 0.0, busy=busy, backpressured=backpressured,
                       idle=max(0.0, 1 - busy - backpressured), busy_max=busy)


def test_the_bottleneck_is_the_busiest_vertex_that_is_not_back_pressured():
    source, step, sink = _vertex("source", 0.05, 0.9), _vertex("step", 0.97, 0.0), _vertex("sink", 0.2, 0.0)
    assert bottleneck([source, step, sink]) == "step"
    # waiting for credit is no bottleneck, however busy; nor is a vertex idle half the time
    assert bottleneck([_vertex("a", 0.6, 0.3), _vertex("b", 0.45, 0.0)]) is None
    assert bottleneck([]) is None
    # Flink's colours: the bottleneck red, what waits for it dark grey, an idle vertex blue
    assert step.load_color == "hsl(6, 75%, 53%)" and source.load_color == "hsl(0, 0%, 26%)"
    assert load_color(0.0, 0.0) == "hsl(210, 75%, 82%)"


def late_report(uid: str, name: str, seqs: list[int], side_output=None) -> dict:
    return {uid: {"name": name, "count": len(seqs) * 10, "dropped": 0 if side_output else len(seqs) * 10,
                  "side_output": side_output, "schema": {"k": "int64", "seq": "int64"},
                  "sample": [{"at": T + s, "event_time": T + s * 100, "watermark": T + s * 100 + 2_500, "input": "",
                              "row": {"k": s % 3, "seq": s}} for s in seqs]}}


def test_the_view_lists_each_windows_newest_late_rows_over_its_subtasks():
    view = WatermarksView()
    win0 = timed("win", 0, T + 9_000, newest=T + 12_000)
    win0["metrics"]["late-rows"] = late_report("u1", "window", [1, 4, 7])
    win1 = timed("win", 1, T + 9_000, newest=T + 12_000)
    win1["metrics"]["late-rows"] = late_report("u1", "window", [2, 5, 8])
    quiet = timed("join", 0, T + 9_000)
    quiet["metrics"]["late-rows"] = late_report("u2", "join", [])
    view.update(Update(Snapshot(1.0, details(win0, win1, quiet) | {"state": "RUNNING"}, {}), [], 1.0))
    text = view.root.value
    assert 'data-operator="window" data-count="60"' in text and "60 (dropped)" in text
    assert 'data-operator="join"' not in text  # none late: no table
    shown = [int(s) for s in re.findall(r"seq=(\d+)", text)]
    assert shown == [8, 7, 5, 4, 2]  # the newest five of both subtasks, newest first
    assert "k=2, seq=8" in text and "2.50 s" in text
