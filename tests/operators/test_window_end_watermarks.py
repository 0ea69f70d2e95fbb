"""A watermark generator's early emission: where a job's windows end (from the graph), and the
timestamps-watermarks operator asking to emit once its watermark passed one of them."""
from __future__ import annotations

import pyarrow as pa

from cluster.graph.event_time import NO_WATERMARK, WINDOW_ENDS_PARAM, passes_window_end, window_ends
from kernel_runtime import StreamEnvironment
from kernel_runtime.api import (Duration, EventTimeSessionWindows, SlidingEventTimeWindows, Time,
                                TumblingEventTimeWindows, TumblingProcessingTimeWindows, WatermarkStrategy)
from tests.operators.harness import opened_operator


def _strategy():
    return WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(200)).with_timestamp_column("ts")


def _rows(seq):
    return seq.to_frame("k").assign(ts=seq)


def _generator_params(graph) -> list[dict]:
    return [spec.params for vertex in graph.vertices for spec in vertex.operators
            if spec.kind == "timestamps-watermarks"]


def test_every_watermark_generator_learns_the_ends_of_the_jobs_event_time_windows():
    env = StreamEnvironment(parallelism=2)
    rows = env.from_generator(_rows, count=10, watermark_strategy=_strategy())
    keyed = rows.key_by("k")
    keyed.window(TumblingEventTimeWindows.of(Time.seconds(1))).count().collect("tumbling")
    (keyed.window(SlidingEventTimeWindows.of(Time.seconds(10), Time.seconds(2), Time.milliseconds(500)))
          .count().collect("sliding"))
    keyed.window(EventTimeSessionWindows.with_gap(Time.seconds(5))).count().collect("session")  # no fixed ends
    keyed.window(TumblingProcessingTimeWindows.of(Time.seconds(3))).count().collect("processing")  # not event time
    (rows.map_batches(lambda d: d, name="again")
         .assign_timestamps_and_watermarks(_strategy()).collect("again"))
    params = _generator_params(env.get_job_graph("t"))
    assert len(params) == 2
    assert all(p[WINDOW_ENDS_PARAM] == [[1000, 0], [2000, 500]] for p in params)


def test_a_job_without_event_time_windows_leaves_its_generators_at_the_interval():
    env = StreamEnvironment(parallelism=1)
    env.from_generator(_rows, count=10, watermark_strategy=_strategy()).collect()
    assert WINDOW_ENDS_PARAM not in _generator_params(env.get_job_graph("t"))[0]


def test_a_watermark_passes_a_window_end_when_it_reaches_the_windows_last_timestamp():
    ends = [[1000, 0], [300, 100]]
    assert passes_window_end(ends, 998, 999)           # [0, 1000) fires at 999
    assert not passes_window_end(ends, 999, 1200)      # nothing ends in (999, 1200]: 1000 + 300*k ... 1299
    assert passes_window_end(ends, 1200, 1299)         # [1000, 1300) of the 300 ms windows offset by 100
    assert not passes_window_end(ends, 1299, 1299)
    assert passes_window_end(ends, NO_WATERMARK, -5)   # the first watermark passes every end before it
    assert not passes_window_end([], 0, 10_000)
    assert window_ends([]) == []


def test_the_generator_asks_to_emit_once_its_watermark_passes_a_window_end(tmp_path):
    op = opened_operator(tmp_path, "timestamps-watermarks",
                         {"column": "ts", "bound_ms": 200, "idle_ms": None, WINDOW_ENDS_PARAM: [[1000, 0]]})
    op.process(pa.table({"ts": [500]}))
    assert op.window_end_passed()                      # the first watermark: every end before it
    assert op.periodic_watermark() == (299, False)
    op.process(pa.table({"ts": [1100]}))               # watermark 899: window [0, 1000) not yet
    assert not op.window_end_passed()
    op.process(pa.table({"ts": [1200]}))               # watermark 999
    assert op.window_end_passed()
    assert op.periodic_watermark() == (999, False)
    assert not op.window_end_passed()                  # emitted: nothing more to say until 1999
    op.process(pa.table({"ts": [2150]}))
    assert not op.window_end_passed()
    op.process(pa.table({"ts": [2200]}))
    assert op.window_end_passed()


def test_without_window_ends_the_generator_waits_for_the_interval(tmp_path):
    op = opened_operator(tmp_path, "timestamps-watermarks", {"column": "ts", "bound_ms": 200, "idle_ms": None})
    op.process(pa.table({"ts": [5000]}))
    assert not op.window_end_passed()
