"""What the dashboard derives from the JobManager's answers (pure: dicts in, values out)."""
import pytest

from kernel_runtime import StreamEnvironment
from kernel_runtime.api import FileSource
from kernel_runtime.widgets.job_graph import layout, operator_names
from cluster.protocol.metrics import backpressure_level
from kernel_runtime.widgets.metrics import JobMetrics, RateMeter, source_progress
from kernel_runtime.widgets.base import Update
from kernel_runtime.widgets.feed import Snapshot
from kernel_runtime.widgets.progress import ProgressView
from kernel_runtime.widgets.slots import slot_table


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
