"""The event-time API without a cluster: what it builds, and its mistakes reported at the line."""
from __future__ import annotations

import pandas as pd
import pytest

from cluster.graph.job_graph import GraphValidationError
from kernel_runtime import StreamEnvironment
from kernel_runtime.api import (Duration, EventTimeSessionWindows, FileSource, SlidingEventTimeWindows, Time,
                                TumblingEventTimeWindows, TumblingProcessingTimeWindows, WatermarkStrategy)

THIS = "test_event_time_api.py"


def events(seq):
    return pd.DataFrame({"k": seq % 3, "v": seq, "ts": seq * 10, "name": seq.astype(str)})


def strategy(column="ts"):
    return WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(200)).with_timestamp_column(column)


def vertex_names(env) -> list[str]:
    return [v.name for v in env.get_job_graph().vertices]


def test_the_watermark_strategy_is_chained_to_its_source_and_the_partials_after_spark():
    env = StreamEnvironment(parallelism=2)
    (env.from_generator(events, watermark_strategy=strategy())
        .sql("SELECT k, v, ts FROM input")
        .key_by("k").window(TumblingEventTimeWindows.of(Time.seconds(1))).aggregate(total=("v", "sum")).collect())
    assert vertex_names(env) == ["Source: generator -> Timestamps/Watermarks -> sql -> window (partial)",
                                 "window -> collect"]
    assert [op.kind for op in env.get_job_graph().vertices[0].operators][-2:] == ["spark", "window-partial"]
    window = env.get_job_graph().vertices[1].operators[0]
    assert window.params["upsert_key"] == ["k", "window_start", "window_end"]
    assert window.params["pre_aggregated"] is True and window.params["assigner"] == {
        "type": "tumbling", "size": 1000, "offset": 0}


def test_no_pre_aggregation_when_late_rows_go_to_a_side_output():
    env = StreamEnvironment(parallelism=2)
    windowed = (env.from_generator(events, watermark_strategy=strategy())
                .key_by("k").window(SlidingEventTimeWindows.of(Time.seconds(10), Time.seconds(1)))
                .side_output_late_data("late").count())
    windowed.collect()
    windowed.get_side_output("late").collect("late")
    assert vertex_names(env)[0] == "Source: generator -> Timestamps/Watermarks"
    assert not any(o.kind == "window-partial" for v in env.get_job_graph().vertices for o in v.operators)


def test_window_all_runs_in_one_subtask():
    env = StreamEnvironment(parallelism=2)
    env.from_generator(events, watermark_strategy=strategy()).window_all(
        TumblingEventTimeWindows.of(Time.seconds(1))).count().collect()
    window = next(v for v in env.get_job_graph().vertices if v.name.startswith("window"))
    assert window.parallelism == 1
    with pytest.raises(GraphValidationError, match=r"window_all \(" + THIS):
        env.from_generator(events, watermark_strategy=strategy()).window_all(
            TumblingEventTimeWindows.of(Time.seconds(1))).count(parallelism=2)


def test_a_window_on_a_stream_that_is_not_keyed_says_so_at_its_line():
    env = StreamEnvironment()
    with pytest.raises(GraphValidationError, match=r"window \(" + THIS + r":\d+\): window\(\) needs a keyed stream"):
        env.from_generator(events, watermark_strategy=strategy()).window(TumblingEventTimeWindows.of(Time.seconds(1)))


def test_a_session_gap_must_be_positive():
    for gap in (0, Time.seconds(-1)):
        with pytest.raises(GraphValidationError, match=r"a session window: gap must be a positive number .*"
                                                       + r"\(" + THIS):
            EventTimeSessionWindows.with_gap(gap)


def test_an_event_time_window_without_event_time_says_how_to_give_it():
    env = StreamEnvironment()
    with pytest.raises(GraphValidationError, match=r"an event-time window \(" + THIS + r":\d+\): .*watermark strategy"):
        env.from_generator(events).key_by("k").window(TumblingEventTimeWindows.of(Time.seconds(1)))
    # processing time needs none
    env.from_generator(events).key_by("k").window(TumblingProcessingTimeWindows.of(Time.seconds(1))).count()


def test_a_timestamp_column_that_is_missing_or_no_time_fails_at_submission_naming_the_operator():
    env = StreamEnvironment()
    env.from_generator(events, watermark_strategy=strategy("tss")).collect()
    with pytest.raises(GraphValidationError, match=r"operator 'Timestamps/Watermarks' \(" + THIS
                       + r":\d+\): timestamp column `tss` does not exist.*Did you mean `ts`"):
        env.get_job_graph()
    env = StreamEnvironment()
    env.from_generator(events, watermark_strategy=strategy("name")).collect()
    with pytest.raises(GraphValidationError, match=r"timestamp column 'name' is string, not a time"):
        env.get_job_graph()


def test_a_strategy_must_say_where_the_time_is(tmp_path):
    env = StreamEnvironment()
    with pytest.raises(GraphValidationError, match="with_timestamp_column"):
        env.from_source(FileSource.csv(str(tmp_path), schema={"ts": "int64"}),
                        WatermarkStrategy.for_monotonous_timestamps())


def test_joins_need_event_time_and_matching_keys():
    env = StreamEnvironment()
    a = env.from_generator(events, watermark_strategy=strategy())
    b = env.from_generator(events, name="b")
    with pytest.raises(GraphValidationError, match=r"interval_join \(" + THIS + r":\d+\): it works in event time"):
        a.key_by("k").interval_join(b.key_by("k")).between(Time.seconds(-1), Time.seconds(1)).process()
    with pytest.raises(GraphValidationError, match="as many columns"):
        a.key_by("k").interval_join(b.key_by("k", "v"))
    with pytest.raises(GraphValidationError, match="lower bound"):
        a.key_by("k").interval_join(a.key_by("k")).between(Time.seconds(1), Time.seconds(-1))


def test_an_interval_join_has_two_keyed_inputs_left_first():
    env = StreamEnvironment(parallelism=2)
    a = env.from_generator(events, watermark_strategy=strategy(), name="a")
    b = env.from_generator(events, watermark_strategy=strategy(), name="b")
    a.key_by("k").interval_join(b.key_by("v")).between(Time.seconds(-1), Time.seconds(1)).process().collect()
    graph = env.get_job_graph()
    join = next(v for v in graph.vertices if v.name.startswith("interval join"))
    edges = [e for _, e in graph.inputs_of(join.id)]
    assert [e.key for e in edges] == [["k"], ["v"]] and join.operators[0].params["left_inputs"] == 1


def test_a_window_aggregate_names_the_functions_a_window_merges():
    env = StreamEnvironment(parallelism=2)
    windowed = env.from_generator(events, watermark_strategy=strategy()).key_by("k").window(
        TumblingEventTimeWindows.of(Time.seconds(1)))
    with pytest.raises(GraphValidationError, match=rf"aggregate \({THIS}:\d+\): n=\('v', 'nunique'\) .*"
                                                   r"one of sum, count, min, max, mean$"):
        windowed.aggregate(n=("v", "nunique"))
    env.from_generator(events).key_by("k").aggregate(n=("v", "nunique"), s=("v", "std"))  # a running one does
