"""Timers of keyed process functions: event time with the watermark, processing time with the
clock, and both kept through a snapshot into another backend at another parallelism."""
from __future__ import annotations

import threading

import cloudpickle
import pandas as pd
import pyarrow as pa
import pytest

from cluster.conf import TaskConfig
from cluster.graph.job_graph import OperatorSpec
from cluster.taskmanager.operator_registry import OPERATORS
from cluster.operators.base import OperatorContext, UserFunctionError


def remember_and_wake(key, rows, state):
    """Sum each key's values; an event-time timer 1 s after the key's last row emits the sum."""
    total = state.value_state("total")
    total.update((total.value() or 0) + int(rows.v.sum()))
    state.timer_service().register_event_time_timer(int(rows.ts.max()) + 1_000)
    return None


def emit_total(key, timestamp, state):
    return pd.DataFrame({"k": [key], "fired_at": [timestamp], "total": [state.value_state("total").value()]})


def operator(tmp_path, backend="hashmap", subtask=0, parallelism=1, on_timer=emit_total):
    spec = OperatorSpec(uid="proc", kind="keyed-process", name="timers", call_site="test.py:1",
                        params={"key": ["k"], **({"on_timer": cloudpickle.dumps(on_timer)} if on_timer else {})},
                        udf=cloudpickle.dumps(remember_and_wake))
    ctx = OperatorContext(job_id="job", job_name="t", attempt=0, subtask=subtask, parallelism=parallelism,
                          max_parallelism=128, config=TaskConfig.from_dict({"state.backend.type": backend,
                                                                            "io.tmp.dirs": str(tmp_path)}),
                          result_address=None, cancelled=threading.Event(), sender=None,
                          execution_id=f"e{subtask}")
    op = OPERATORS["keyed-process"](spec, ctx)
    op.open()
    return op


def rows(tables) -> list[dict]:
    return sorted((r for t in tables for r in t.to_pylist()), key=lambda r: (r["fired_at"], r["k"]))


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_event_time_timers_fire_when_the_watermark_reaches_them(tmp_path, backend):
    op = operator(tmp_path, backend)
    op.process(pa.table({"k": [1, 2, 1], "v": [1, 2, 3], "ts": [100, 200, 300]}))
    assert rows(op.process_watermark(1_199)[0]) == []
    out, forwarded = op.process_watermark(1_300)
    assert forwarded == 1_300
    assert rows(out) == [{"k": 2, "fired_at": 1_200, "total": 2}, {"k": 1, "fired_at": 1_300, "total": 4}]
    assert op.process_watermark(5_000)[0] == []  # fired once


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_timers_survive_a_restore_at_another_parallelism(tmp_path, backend):
    op = operator(tmp_path, backend)
    op.process(pa.table({"k": list(range(20)), "v": [1] * 20, "ts": [100 * i for i in range(20)]}))
    op.process_watermark(500)
    snapshot = op.snapshot_state(1)
    directory = tmp_path / "chk"
    directory.mkdir()
    handle = dict(snapshot.handle, **snapshot.keyed.write(directory / "s"), keyed_file="s", directory=str(directory),
                  subtask=0, parallelism=1)
    other = "rocksdb" if backend == "hashmap" else "hashmap"
    fired = []
    for subtask in range(2):
        restored = operator(tmp_path / str(subtask), other, subtask, 2)
        restored.restore_state([handle])
        assert restored.access.timer_service().current_watermark() == 500
        fired += rows(restored.process_watermark(10_000)[0])
    assert sorted(r["k"] for r in fired) == list(range(20))
    assert all(r["fired_at"] == 100 * r["k"] + 1_000 and r["total"] == 1 for r in fired)


def test_processing_time_timers_fire_with_the_clock(tmp_path):
    def wake_at(key, rows, state):
        state.timer_service().register_processing_time_timer(5_000)

    op = operator(tmp_path)
    op.udf = wake_at
    op.process(pa.table({"k": [7], "v": [1], "ts": [0]}))
    assert op.on_processing_time(4_999) == []
    assert rows(op.on_processing_time(5_000)) == [{"k": 7, "fired_at": 5_000, "total": None}]


def test_a_timer_without_on_timer_is_a_clear_error(tmp_path):
    op = operator(tmp_path, on_timer=None)
    op.process(pa.table({"k": [1], "v": [1], "ts": [0]}))
    with pytest.raises(UserFunctionError, match="has no on_timer"):
        op.process_watermark(2_000)
