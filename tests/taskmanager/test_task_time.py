"""TaskTime without sockets: watermarks through a chain, held behind rows still in Spark,
idleness, periodic generation and processing-time ticks."""
from __future__ import annotations

from typing import Optional

import pyarrow as pa

from cluster.graph.event_time import NO_WATERMARK
from cluster.taskmanager.task_time import TaskTime


class Step:
    generates_watermarks = False
    uses_processing_time = False

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def process_watermark(self, watermark: int):
        self.log.append((self.name, watermark))
        return [], watermark


class Firing(Step):
    """Emits a table with the watermark when it advances (as a window operator would)."""

    def process_watermark(self, watermark: int):
        self.log.append((self.name, watermark))
        return [pa.table({"fired": [watermark]})], watermark


class Generator(Step):
    generates_watermarks = True

    def __init__(self, name, log):
        super().__init__(name, log)
        self.answer: Optional[tuple[int, bool]] = None
        self.passed_window_end = False

    def periodic_watermark(self):
        return self.answer

    def window_end_passed(self):
        return self.passed_window_end

    def process_watermark(self, watermark: int):
        return [], None  # makes its own


class Stage:
    rows_submitted = rows_through = 0


def task_time(chain, interval_ms=0, clock=None):
    pushed, emitted, statuses = [], [], []
    time = TaskTime(chain, lambda index, tables: pushed.append((index, tables[0].to_pylist())), emitted.append,
                    statuses.append, interval_ms, clock=clock or (lambda: 0.0), wall_clock=lambda: 10.0)
    return time, pushed, emitted, statuses


def test_the_input_watermark_is_the_minimum_over_channels_and_goes_through_the_chain():
    log: list = []
    time, pushed, emitted, _ = task_time([Step("a", log), Firing("b", log)])
    time.set_inputs(["x", "y"])
    time.on_watermark("x", 100)
    assert emitted == [] and time.input_watermark == NO_WATERMARK
    time.on_watermark("y", 50)
    time.on_watermark("y", 150)
    assert log == [("a", 50), ("b", 50), ("a", 100), ("b", 100)]
    assert pushed == [(2, [{"fired": 50}]), (2, [{"fired": 100}])]  # what b fired went on after b
    assert emitted == [50, 100] and time.output_watermark == 100


def test_a_watermark_waits_behind_rows_still_in_spark():
    log: list = []
    stage = Stage()
    time, _, emitted, _ = task_time([Step("source", log), Step("spark", log), Step("after", log)])
    time.set_stage(stage, 1)
    stage.rows_submitted = 10
    time.advance(0, 100)
    stage.rows_submitted = 25
    time.advance(0, 200)
    assert emitted == [] and log == [("source", 100), ("source", 200)]
    stage.rows_through = 10
    time.release_held()
    assert emitted == [100] and log[-1] == ("after", 100)
    stage.rows_through = 25
    time.release_held()
    assert emitted == [100, 200]


def test_idle_inputs_release_the_watermark_and_make_the_task_idle():
    log: list = []
    time, _, emitted, statuses = task_time([Step("a", log)])
    time.set_inputs(["x", "y"])
    time.on_watermark("x", 100)
    time.on_status("y", True)
    assert emitted == [100] and statuses == []
    time.on_status("x", True)
    assert statuses == [True]
    time.on_status("x", False)
    assert statuses == [True, False]


def generating(interval_ms: int):
    """A source, a watermark generator and a step after it, on a clock the test moves (now[0])."""
    log: list = []
    now = [0.0]
    generator = Generator("assigner", log)
    time, _, emitted, statuses = task_time([Step("source", log), generator, Step("after", log)],
                                           interval_ms=interval_ms, clock=lambda: now[0])
    return time, generator, now, log, emitted, statuses


def test_generated_watermarks_are_asked_for_at_the_interval():
    time, generator, now, log, emitted, statuses = generating(200)
    generator.answer = (NO_WATERMARK, False)
    time.periodic(read_rows=True)
    assert emitted == []  # nothing seen yet: no watermark
    generator.answer = (500, False)
    now[0] = 0.1
    time.periodic(read_rows=True)
    assert emitted == []  # not yet the interval
    now[0] = 0.2
    time.periodic(read_rows=False)
    assert emitted == [500] and ("after", 500) in log and ("source", 500) not in log
    generator.answer = (500, True)
    now[0] = 0.4
    time.periodic(read_rows=False)
    assert statuses == [True]
    time.before_rows()
    assert statuses == [True, False]


def test_a_watermark_past_a_window_end_goes_out_before_the_interval():
    time, generator, now, _, emitted, _ = generating(200)
    generator.answer = (400, False)
    time.periodic(read_rows=True)
    assert emitted == [400]
    generator.answer = (999, False)
    now[0] = 0.05
    time.periodic(read_rows=True)
    assert emitted == [400]  # no window end passed: the interval holds
    generator.passed_window_end = True
    time.periodic(read_rows=False)
    assert emitted == [400]  # asked only after rows that could move it
    time.periodic(read_rows=True)
    assert emitted == [400, 999]
    generator.answer, generator.passed_window_end = (1200, False), False
    now[0] = 0.2
    time.periodic(read_rows=False)
    assert emitted == [400, 999, 1200]  # the interval keeps its own beat


def test_processing_time_ticks_reach_the_operators_that_ask():
    class Timed(Step):
        uses_processing_time = True

        def on_processing_time(self, now_ms):
            return [pa.table({"now": [now_ms]})]

    time, pushed, _, _ = task_time([Step("a", []), Timed("t", [])])
    time.tick()
    assert pushed == [(2, [{"now": 10_000}])]
