"""Why a window has not fired (cluster.jobmanager.rest.window_waits): pure, graph and metrics in."""
from __future__ import annotations

from cluster.graph.event_time import NO_WATERMARK
from cluster.graph.job_graph import JobEdge, JobGraph, JobVertex, OperatorSpec
from cluster.jobmanager.rest.window_waits import window_waits

T = 1_700_000_000_000  # epoch ms, a whole second


def op(kind: str, name: str) -> OperatorSpec:
    return OperatorSpec(uid=f"uid-{name}", kind=kind, name=name, call_site="job.py:1")


# Source (2 subtasks) -> map (2, rebalanced) -> window (2, hashed): the window's inputs are edge 1
GRAPH = JobGraph("j1", "job", [
    JobVertex("src", "Source: events", 2, 128, [op("generator-source", "events"), op("timestamps-watermarks", "ts")]),
    JobVertex("map", "enrich", 2, 128, [op("map", "enrich")]),
    JobVertex("win", "window -> collect", 2, 128, [op("window", "per second"), op("collect-sink", "collect")]),
], [JobEdge("src", "map", "REBALANCE"), JobEdge("map", "win", "HASH", ["k"])])


def metrics(**per_subtask) -> dict:
    return {(vertex, int(subtask)): figures for key, figures in per_subtask.items()
            for vertex, subtask in [key.split("_")]}


def test_the_window_waits_for_the_source_subtask_without_rows_followed_through_every_hop():
    waits = window_waits(GRAPH, metrics(
        src_0={"currentOutputWatermark": T + 4_000, "newestEventTimestamp": T + 4_500},
        src_1={"currentOutputWatermark": NO_WATERMARK},
        map_0={"inputWatermarks": {"0/0": [T + 4_000, False], "0/1": [NO_WATERMARK, False]},
               "currentOutputWatermark": NO_WATERMARK},
        map_1={"inputWatermarks": {"0/0": [T + 4_000, False], "0/1": [NO_WATERMARK, False]},
               "currentOutputWatermark": NO_WATERMARK},
        win_0={"inputWatermarks": {"1/0": [NO_WATERMARK, False], "1/1": [NO_WATERMARK, False]},
               "currentInputWatermark": NO_WATERMARK, "oldestOpenWindow": [T + 2_000, T + 3_000]},
        win_1={"inputWatermarks": {"1/0": [NO_WATERMARK, False], "1/1": [NO_WATERMARK, False]},
               "currentInputWatermark": NO_WATERMARK, "oldestOpenWindow": [T, T + 1_000]}))
    (wait,) = waits
    assert (wait["operator"], wait["subtask"], wait["window"]) == ("per second", 1, [T, T + 1_000])
    held = wait["held_by"]
    assert (held["vertex_id"], held["subtask"], held["watermark"], held["idle"]) == ("src", 1, NO_WATERMARK, False)
    assert "waits for subtask 1 of 'Source: events', which has no watermark yet" in wait["text"]
    assert "with_idleness" in wait["text"] and "0 of its 2 inputs is past it" in wait["text"]


def test_a_kafka_like_source_names_its_slowest_active_split_and_how_far_behind_it_is():
    waits = window_waits(GRAPH, metrics(
        src_0={"currentOutputWatermark": T + 500, "newestEventTimestamp": T + 41_000,
               "split.orders-0.currentWatermark": T + 40_000, "split.orders-0.idle": False,
               "split.orders-3.currentWatermark": T + 500, "split.orders-3.idle": False,
               "split.orders-5.currentWatermark": NO_WATERMARK, "split.orders-5.idle": True},
        src_1={"currentOutputWatermark": T + 39_000},
        map_0={"inputWatermarks": {"0/0": [T + 500, False], "0/1": [T + 39_000, False]}},
        map_1={"inputWatermarks": {"0/0": [T + 500, False], "0/1": [T + 39_000, False]}},
        win_0={"inputWatermarks": {"1/0": [T + 500, False], "1/1": [T + 1_200, False]},
               "currentInputWatermark": T + 500, "oldestOpenWindow": [T, T + 1_000]}))
    (wait,) = waits
    held = wait["held_by"]
    assert (held["vertex_id"], held["subtask"], held["split"], held["watermark"]) == ("src", 0, "orders-3", T + 500)
    assert "split orders-3 of subtask 0 of 'Source: events'" in wait["text"]
    assert "40.50 s behind the newest event time" in wait["text"]
    assert "it is at 2023-11-14 22:13:20.500, 499 ms short" in wait["text"]
    assert "1 of its 2 inputs is past it" in wait["text"]


def test_an_idle_input_is_not_followed_and_an_all_idle_source_is_named_idle():
    waits = window_waits(GRAPH, metrics(
        src_0={"currentOutputWatermark": T + 100, "outputIdle": True},
        map_0={"inputWatermarks": {"0/0": [T + 100, True]}},
        win_0={"inputWatermarks": {"1/0": [T + 100, True], "1/1": [T + 300, False]},
               "currentInputWatermark": T + 300, "oldestOpenWindow": [T, T + 1_000]},
        map_1={"inputWatermarks": {"0/0": [T + 100, True]}, "currentOutputWatermark": T + 300}))
    (wait,) = waits
    # the active input is map 1, all of whose inputs are idle: it is what the window waits for
    assert (wait["held_by"]["vertex_id"], wait["held_by"]["subtask"], wait["held_by"]["idle"]) == ("map", 1, True)
    assert "which is idle" in wait["text"]


def test_no_wait_without_an_open_window_or_once_the_watermark_passed_it():
    assert window_waits(GRAPH, metrics(win_0={"currentInputWatermark": T + 5_000})) == []
    assert window_waits(GRAPH, metrics(win_0={"currentInputWatermark": T + 999,
                                              "oldestOpenWindow": [T, T + 1_000]})) == []


def test_a_window_all_of_whose_inputs_are_idle_says_so():
    (wait,) = window_waits(GRAPH, metrics(
        win_0={"inputWatermarks": {"1/0": [T + 100, True], "1/1": [NO_WATERMARK, True]},
               "currentInputWatermark": T + 100, "oldestOpenWindow": [T, T + 1_000]}))
    assert (wait["held_by"]["vertex_id"], wait["held_by"]["idle"]) == ("win", True)
    assert wait["text"].endswith("Every input of it is idle (WatermarkStrategy.with_idleness): its watermark moves "
                                 "when rows come again.")
