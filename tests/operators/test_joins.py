"""The three joins driven as a task drives them: batches of both inputs routed to subtasks by key
group, out of order within a bound, with watermarks between them, on both state backends; results
against a pandas reference computed here (merge + filters, merge_asof), state expiry, late rows,
and a checkpoint restored into two subtasks."""
from __future__ import annotations

import json
import threading
from typing import Callable, Optional

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from cluster.conf import TaskConfig
from cluster.graph.job_graph import OperatorSpec
from cluster.taskmanager.operator_registry import OPERATORS
from cluster.operators.base import OperatorContext
from cluster.operators.join_state import Chunks
from cluster.operators.timers import EVENT_TIME
from cluster.graph.event_time import MAX_WATERMARK, NO_WATERMARK
from cluster.operators.windowing.watermarks import TimestampError
from cluster.state.key_groups import key_groups_of, operator_index_for_key_group

MAX_PARALLELISM = 128
BOUND = 300  # the out-of-orderness of the input, ms
KEYS = 6


@pytest.fixture(params=["hashmap", "rocksdb"])
def backend(request):
    return request.param


@pytest.fixture(params=[2, Chunks.MERGE_AT], ids=lambda n: f"merge-at-{n}")
def merge_at(request, monkeypatch):
    """How many chunks of a key group make them merge: 2 merges at nearly every batch."""
    monkeypatch.setattr(Chunks, "MERGE_AT", request.param)
    return request.param


def open_join(kind: str, params: dict, backend: str, tmp_path, subtask: int = 0, parallelism: int = 1,
              udf: Optional[Callable] = None):
    spec = OperatorSpec(uid="join", kind=kind, name="under test", call_site="test.py:1", params=params,
                        udf=cloudpickle.dumps(udf) if udf is not None else None)
    ctx = OperatorContext(
        job_id="job", job_name="test", attempt=0, subtask=subtask, parallelism=parallelism,
        max_parallelism=MAX_PARALLELISM,
        config=TaskConfig.from_dict({"state.backend.type": backend, "io.tmp.dirs": str(tmp_path)}),
        result_address=None, cancelled=threading.Event(), sender=None,
        execution_id=f"{backend}-{parallelism}-{subtask}-{id(params)}")
    op = OPERATORS[kind](spec, ctx)
    op.open()
    return op


class Subtasks:
    """The subtasks of one join, fed as the exchange and the task feed them."""

    def __init__(self, kind, params, backend, tmp_path, parallelism=1, udf=None):
        self.params = params
        self.ops = [open_join(kind, params, backend, tmp_path, i, parallelism, udf) for i in range(parallelism)]
        self.out: list[pa.Table] = []

    def side(self, side: int, frame: pd.DataFrame) -> None:
        if frame.empty:
            return
        table = pa.Table.from_pandas(frame, preserve_index=False)
        key = self.params["key"] if side == 0 else self.params.get("right_key", self.params["key"])
        groups = key_groups_of(table, key, MAX_PARALLELISM)
        target = operator_index_for_key_group(groups, MAX_PARALLELISM, len(self.ops))
        for index, op in enumerate(self.ops):
            part = table.filter(pa.array(target == index))
            if part.num_rows:
                self.out.extend(op.process_side(side, part))

    def watermark(self, watermark: int) -> None:
        for op in self.ops:
            tables, passed = op.process_watermark(watermark)
            assert passed == watermark
            self.out.extend(tables)

    def snapshot(self, directory, checkpoint_id: int = 1) -> list[dict]:
        """Every subtask's handle as checkpoint metadata gives it back (JSON) to a restore."""
        handles = []
        for op in self.ops:
            snapshot = op.snapshot_state(checkpoint_id)
            name = f"join-{op.ctx.subtask}.state"
            handle = dict(snapshot.handle, subtask=op.ctx.subtask, parallelism=op.ctx.parallelism)
            handle.update(snapshot.keyed.write(directory / name), keyed_file=name)
            handles.append(json.loads(json.dumps(handle)))
        return [dict(h, directory=str(directory)) for h in handles]

    def restore(self, handles: list[dict]) -> None:
        for op in self.ops:
            op.restore_state(handles)

    def result(self) -> pd.DataFrame:
        # a left join's rows before the subtask saw any right row have no right columns to fill
        return pa.concat_tables(self.out, promote_options="default").to_pandas() if self.out else pd.DataFrame()

    def state(self, name: str) -> list:
        return [item for op in self.ops for item in op.backend.items(name)]

    def pending_timers(self) -> int:
        return sum(op.timers.pending(EVENT_TIME) for op in self.ops)

    def metric(self, name: str) -> int:
        values = [op.metrics()[name] for op in self.ops]
        return max(values) if name == "newestEventTimestamp" else sum(values)


# ---------------------------------------------------------------------- input
def ms(values: pd.Series) -> pd.Series:
    """Epoch milliseconds (NaN: none) as the operator's timestamps come back from Arrow."""
    return pd.to_datetime(values, unit="ms").astype("datetime64[ms]")


def events(seed: int, n: int = 300, step: int = 50, span: int = 20_000, right_key: str = "k",
           unique_right_times: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Left and right rows with an arrival order out of order by less than BOUND. Times are
    multiples of ``step`` so that rows often sit exactly on an interval's or window's edge."""
    rng = np.random.default_rng(seed)
    left = pd.DataFrame({"k": rng.integers(0, KEYS, n), "ts": rng.integers(0, span // step, n) * step,
                         "v": rng.integers(0, 1000, n), "lid": np.arange(n)})
    if unique_right_times:  # versions of one key at distinct times: no tie for merge_asof to break
        keys = np.repeat(np.arange(KEYS), n // KEYS)
        ts = np.concatenate([rng.choice(span // step, n // KEYS, replace=False) for _ in range(KEYS)]) * step
    else:
        keys, ts = rng.integers(0, KEYS, n), rng.integers(0, span // step, n) * step
    right = pd.DataFrame({right_key: keys, "ts": ts, "v": rng.integers(0, 1000, len(keys)),
                          "rid": np.arange(len(keys))})
    for frame in (left, right):
        frame["arrival"] = frame["ts"] + rng.integers(0, BOUND, len(frame))
    return left, right


def drive(join: Subtasks, left: pd.DataFrame, right: pd.DataFrame, late_ts: Optional[Callable] = None,
          chunk: int = 25, start: int = 0, stop: Optional[int] = None, check: Optional[Callable] = None):
    """Feeds both inputs in arrival order, ``chunk`` rows of each at a time, and a watermark after
    each chunk; ``late_ts(watermark)`` adds a late left row now and then.
    Returns the late rows added."""
    def ordered(frame):
        return frame.sort_values(["arrival", "ts"], kind="stable").drop(columns="arrival").reset_index(drop=True)
    left, right = ordered(left), ordered(right)
    as_time = lambda frame: frame.assign(ts=ms(frame["ts"]))  # noqa: E731
    chunks = -(-max(len(left), len(right)) // chunk)
    late = []
    for c in range(start, chunks if stop is None else stop):
        part = slice(c * chunk, (c + 1) * chunk)
        join.side(0, as_time(left.iloc[part]))
        join.side(1, as_time(right.iloc[part]))
        # each input's watermark trails its largest time by the bound; the task's is their minimum
        watermark = int(min(left.ts.iloc[:(c + 1) * chunk].max(), right.ts.iloc[:(c + 1) * chunk].max())) - BOUND
        join.watermark(watermark)
        if late_ts is not None and c % 4 == 3:
            row = left.iloc[[c]].assign(ts=late_ts(watermark), lid=-1 - c)
            late.append(row)
            join.side(0, as_time(row))
        if check is not None:
            check(join, watermark)
    return pd.concat(late) if late else left.iloc[:0]


def canon(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return frame.sort_values(by, kind="stable").reset_index(drop=True)


def as_times(frame: pd.DataFrame, columns=("ts", "ts_right")) -> pd.DataFrame:
    return frame.assign(**{c: ms(frame[c]) for c in columns if c in frame})


def joined_columns(merged: pd.DataFrame) -> pd.DataFrame:
    """The operator's column order: the left's, then the right's (key named as the left's dropped)."""
    return merged[["k", "ts", "v", "lid"] + [c for c in ("id", "ts_right", "v_right", "rid") if c in merged]]


# ---------------------------------------------------------------------- interval join
def waiting(join: Subtasks, side: str) -> list[int]:
    """The times of the rows of one side that wait in an interval join's state."""
    return sorted(int(t) for _, (ts, rows) in join.state(f"{side}-chunks") for t in ts)


def waiting_rows(join: Subtasks, name: str) -> pd.DataFrame:
    """The key and time of the rows waiting in the chunks ``name`` of every subtask."""
    chunks = [chunk for _, chunk in join.state(f"{name}-chunks")]
    return pd.DataFrame({"k": np.concatenate([rows.column("k").to_numpy() for _, rows in chunks] or [[]]),
                         "ts": np.concatenate([ts for ts, _ in chunks] or [[]])})


INTERVALS = [  # lower, upper, lower_inclusive, upper_inclusive
    (-300, 500, True, True),
    (-500, -100, False, True),
    (0, 250, True, False),
    (100, 100, True, True),
]


@pytest.mark.parametrize("lower, upper, lower_inclusive, upper_inclusive", INTERVALS)
def test_interval_join_equals_pandas_on_out_of_order_input(backend, merge_at, tmp_path, lower, upper,
                                                           lower_inclusive, upper_inclusive):
    params = {"key": ["k"], "right_key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "lower": lower,
              "upper": upper, "lower_inclusive": lower_inclusive, "upper_inclusive": upper_inclusive}
    join = Subtasks("interval-join", params, backend, tmp_path)
    left, right = events(seed=1)

    def only_useful_rows_wait(join, watermark):
        # a row stays only while a row to come (ts >= watermark) could still match it
        assert all(ts + upper >= watermark for ts in waiting(join, "left"))
        assert all(ts - lower >= watermark for ts in waiting(join, "right"))

    late = drive(join, left, right, late_ts=lambda wm: wm - 1, check=only_useful_rows_wait)
    assert len(late) > 0 and join.metric("numLateRecordsDropped") == len(late)
    sampled = [e for op in join.ops for report in op.metrics()["late-rows"].values() for e in report["sample"]]
    assert sorted(e["row"]["lid"] for e in sampled) == sorted(late["lid"])[:20]  # the newest: most negative
    assert {e["input"] for e in sampled} == {"left"} and all(e["watermark"] - e["event_time"] == 1 for e in sampled)

    merged = left.drop(columns="arrival").merge(right.drop(columns="arrival"), on="k", suffixes=("", "_right"))
    gap = merged.ts_right - merged.ts
    merged = merged[(gap >= lower if lower_inclusive else gap > lower) &
                    (gap <= upper if upper_inclusive else gap < upper)]
    expected = as_times(joined_columns(merged))
    assert len(expected) > 20
    pd.testing.assert_frame_equal(canon(join.result(), ["lid", "rid"]), canon(expected, ["lid", "rid"]))

    last = int(max(left.ts.max(), right.ts.max()))
    assert join.metric("newestEventTimestamp") == last
    join.watermark(last + abs(lower) + abs(upper) + 1)  # no row to come can meet any row seen
    assert waiting(join, "left") == waiting(join, "right") == []
    assert join.state("left-index") == join.state("right-index") == []
    assert join.pending_timers() == 0


def test_interval_join_keeps_a_row_at_the_watermark_and_drops_one_before_it(backend, tmp_path):
    params = {"key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "lower": -10, "upper": 10}
    join = Subtasks("interval-join", params, backend, tmp_path)
    join.side(0, pd.DataFrame({"k": [1, 1], "ts": [100, 200], "v": [1, 2]}))
    join.watermark(105)  # ts 100 can meet a right row up to 110, still to come
    assert waiting(join, "left") == [100, 200]
    join.side(1, pd.DataFrame({"k": [1, 1], "ts": [104, 105], "w": [7, 8]}))  # 104 is late
    assert join.metric("numLateRecordsDropped") == 1
    join.watermark(110)  # a right row at 110 is not late (Flink: ts < watermark is) and meets the one at 100
    join.side(1, pd.DataFrame({"k": [1], "ts": [110], "w": [9]}))
    assert join.result().to_dict("list") == {"k": [1, 1], "ts": [100, 100], "v": [1, 1], "ts_right": [105, 110],
                                             "w": [8, 9]}
    join.watermark(111)  # the left row at 100 can meet nothing more; the one at 200 still waits
    assert waiting(join, "left") == [200]


def test_a_join_on_two_key_columns_named_differently_on_the_right(backend, tmp_path):
    params = {"key": ["a", "b"], "right_key": ["a", "c"], "left_rowtime": "ts", "right_rowtime": "ts",
              "lower": -1000, "upper": 1000}
    join = Subtasks("interval-join", params, backend, tmp_path, parallelism=2)
    rng = np.random.default_rng(8)
    left = pd.DataFrame({"a": rng.integers(0, 3, 200), "b": rng.choice(["x", "y"], 200),
                         "ts": np.sort(rng.integers(0, 20_000, 200)), "lid": np.arange(200)})
    right = pd.DataFrame({"a": rng.integers(0, 3, 200), "c": rng.choice(["x", "y"], 200),
                          "ts": np.sort(rng.integers(0, 20_000, 200)), "rid": np.arange(200)})
    for start in range(0, 200, 40):
        join.side(0, left.iloc[start:start + 40])
        join.side(1, right.iloc[start:start + 40])
        join.watermark(int(min(left.ts.iloc[start + 39], right.ts.iloc[start + 39])))
    merged = left.merge(right.drop(columns="a").assign(a_=right.a), left_on=["a", "b"], right_on=["a_", "c"],
                        suffixes=("", "_right")).drop(columns="a_")
    merged = merged[(merged.ts_right - merged.ts).abs() <= 1000]
    # the right's "a" is the left's "a" (same name, same place in the key); its "c" stays
    expected = merged[["a", "b", "ts", "lid", "c", "ts_right", "rid"]]
    assert len(expected) > 50
    pd.testing.assert_frame_equal(canon(join.result(), ["lid", "rid"]), canon(expected, ["lid", "rid"]))


def test_interval_join_applies_the_function_to_the_joined_rows(backend, tmp_path):
    params = {"key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "lower": -200, "upper": 200}

    def fn(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame[frame.v > frame.v_right]
        return pd.DataFrame({"lid": frame.lid, "rid": frame.rid, "total": frame.v + frame.v_right})

    join = Subtasks("interval-join", params, backend, tmp_path, udf=fn)
    left, right = events(seed=2)
    drive(join, left, right)
    merged = left.merge(right, on="k", suffixes=("", "_right"))
    merged = merged[((merged.ts_right - merged.ts).abs() <= 200) & (merged.v > merged.v_right)]
    expected = pd.DataFrame({"lid": merged.lid, "rid": merged.rid, "total": merged.v + merged.v_right})
    pd.testing.assert_frame_equal(canon(join.result(), ["lid", "rid"]), canon(expected, ["lid", "rid"]))


# ---------------------------------------------------------------------- window join
def windows_of(frame: pd.DataFrame, size: int, slide: int) -> pd.DataFrame:
    """Each row once per window holding it (starts at multiples of the slide), row by row."""
    starts = [list(range(ts - ts % slide, ts - size, -slide)) for ts in frame.ts]
    return frame.assign(window_start=starts).explode("window_start").astype({"window_start": "int64"})


@pytest.mark.parametrize("assigner", [{"type": "tumbling", "size": 1000},
                                      {"type": "sliding", "size": 1500, "slide": 500}])
def test_window_join_equals_pandas_on_out_of_order_input(backend, merge_at, tmp_path, assigner):
    size, slide = assigner["size"], assigner.get("slide", assigner["size"])
    params = {"key": ["k"], "right_key": ["id"], "left_rowtime": "ts", "right_rowtime": "ts", "assigner": assigner}
    join = Subtasks("window-join", params, backend, tmp_path)
    left, right = events(seed=3, n=200, span=10_000, right_key="id")

    def nothing_fired_waits(join, watermark):
        for side in ("left-window-chunks", "right-window-chunks"):
            assert all(start + size - 1 > watermark for _, (starts, _) in join.state(side) for start in starts)

    late = drive(join, left, right, late_ts=lambda wm: wm - size - 1, check=nothing_fired_waits)
    join.watermark(MAX_WATERMARK)  # the end of input fires every window
    assert join.metric("numLateRecordsDropped") == len(late) > 0

    merged = windows_of(left.drop(columns="arrival"), size, slide).merge(
        windows_of(right.drop(columns="arrival"), size, slide), left_on=["k", "window_start"],
        right_on=["id", "window_start"], suffixes=("", "_right"))
    merged["window_end"] = merged.window_start + size
    expected = as_times(joined_columns(merged).assign(window_start=merged.window_start, window_end=merged.window_end),
                        ("ts", "ts_right", "window_start", "window_end"))
    assert len(expected) > 50
    by = ["lid", "rid", "window_start"]
    pd.testing.assert_frame_equal(canon(join.result(), by), canon(expected, by))
    assert join.state("left-window-chunks") == [] and join.state("right-window-chunks") == []
    assert join.pending_timers() == 0


def test_a_window_join_fires_at_the_window_end_and_drops_rows_of_fired_windows(backend, tmp_path):
    params = {"key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "assigner": {"type": "tumbling", "size": 1000}}
    join = Subtasks("window-join", params, backend, tmp_path)
    join.side(0, pd.DataFrame({"k": [1, 1], "ts": [500, 1500], "a": [1, 2]}))
    join.side(1, pd.DataFrame({"k": [1, 1], "ts": [600, 1999], "b": [3, 4]}))
    join.watermark(998)
    assert join.out == []
    join.watermark(999)  # [0, 1000) fires: its max timestamp 999 is reached
    assert join.result().to_dict("list") == {
        "k": [1], "ts": [500], "a": [1], "ts_right": [600], "b": [3],
        "window_start": [pd.Timestamp(0, unit="ms")], "window_end": [pd.Timestamp(1000, unit="ms")]}
    join.side(0, pd.DataFrame({"k": [1, 1], "ts": [700, 1000], "a": [5, 6]}))  # 700's window has fired
    assert join.metric("numLateRecordsDropped") == 1
    join.watermark(1999)
    assert join.result().a.tolist() == [1, 2, 6] and join.result().b.tolist() == [3, 4, 4]
    assert join.pending_timers() == 0 and join.state("left-window-chunks") == []


# ---------------------------------------------------------------------- temporal join
@pytest.mark.parametrize("how", ["inner", "left"])
def test_event_time_temporal_join_equals_merge_asof(backend, merge_at, tmp_path, how):
    params = {"key": ["k"], "right_key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "how": how}
    join = Subtasks("temporal-join", params, backend, tmp_path)
    left, right = events(seed=4, n=240, unique_right_times=True)

    def old_versions_go(join, watermark):
        versions = waiting_rows(join, "right-versions")
        # of each key's versions at or before the watermark only the one valid at it is left
        assert (versions[versions.ts <= watermark].groupby("k").size() <= 1).all()
        assert (waiting_rows(join, "left-pending").ts >= watermark).all()

    late = drive(join, left, right, late_ts=lambda wm: wm - 1, check=old_versions_go)
    assert join.metric("numLateRecordsDropped") == len(late) > 0
    join.watermark(MAX_WATERMARK)

    expected = pd.merge_asof(left.drop(columns="arrival").sort_values("ts"),
                             right.drop(columns="arrival").rename(columns={"ts": "ts_right"}).sort_values("ts_right"),
                             left_on="ts", right_on="ts_right", by="k", direction="backward",
                             suffixes=("", "_right"))
    if how == "inner":
        expected = expected.dropna(subset=["rid"]).astype({"ts_right": "int64", "v_right": "int64", "rid": "int64"})
    expected = as_times(joined_columns(expected))
    assert expected.rid.isna().any() == (how == "left")
    pd.testing.assert_frame_equal(canon(join.result(), ["lid"]), canon(expected, ["lid"]))
    assert waiting_rows(join, "left-pending").empty
    # of each key's versions only the latest is left: the one valid from now on
    versions = waiting_rows(join, "right-versions")
    assert versions.sort_values("k").ts.tolist() == right.groupby("k").ts.max().sort_index().tolist()
    assert join.pending_timers() == 0


@pytest.mark.parametrize("how", ["inner", "left"])
def test_processing_time_temporal_join_takes_the_latest_right_row(backend, tmp_path, how):
    params = {"key": ["k"], "right_key": ["k"], "left_rowtime": None, "right_rowtime": None, "how": how}
    join = Subtasks("temporal-join", params, backend, tmp_path, parallelism=2)
    rng = np.random.default_rng(5)
    n = 400
    stream = pd.DataFrame({"side": rng.integers(0, 2, n), "k": rng.integers(0, KEYS, n),
                           "v": rng.integers(0, 1000, n), "seq": np.arange(n)})
    # runs of one side are the batches, in arrival order
    for _, batch in stream.groupby((stream.side != stream.side.shift()).cumsum()):
        side = int(batch.side.iloc[0])
        join.side(side, batch.drop(columns="side").rename(columns={"seq": "lid" if side == 0 else "rid"}))
    left = stream[stream.side == 0].drop(columns="side").rename(columns={"seq": "lid"})
    right = stream[stream.side == 1].drop(columns="side").rename(columns={"seq": "rid"})
    expected = pd.merge_asof(left, right, left_on="lid", right_on="rid", by="k", direction="backward",
                             suffixes=("", "_right"))
    if how == "inner":
        expected = expected.dropna(subset=["rid"]).astype({"v_right": "int64", "rid": "int64"})
    assert expected.rid.isna().any() == (how == "left")
    expected = expected[["k", "v", "lid", "v_right", "rid"]]
    pd.testing.assert_frame_equal(canon(join.result(), ["lid"]), canon(expected, ["lid"]))


# ---------------------------------------------------------------------- checkpoints
STATES = {"interval-join": ("left-chunks", "right-chunks"),
          "window-join": ("left-window-chunks", "right-window-chunks"),
          "temporal-join": ("right-versions-chunks", "left-pending-chunks")}
CASES = {
    "interval-join": ({"lower": -400, "upper": 300}, {}),
    "window-join": ({"assigner": {"type": "sliding", "size": 2000, "slide": 1000}}, {}),
    "temporal-join": ({"how": "left"}, {"unique_right_times": True}),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_checkpoint_restores_into_two_subtasks_with_the_same_output(backend, merge_at, tmp_path, kind):
    extra, shape = CASES[kind]
    params = {"key": ["k"], "right_key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", **extra}
    left, right = events(seed=6, n=240, **shape)
    whole = Subtasks(kind, params, backend, tmp_path / "whole")
    drive(whole, left, right)
    whole.watermark(MAX_WATERMARK)

    before = Subtasks(kind, params, backend, tmp_path / "before")
    drive(before, left, right, stop=5)
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    handles = before.snapshot(directory)
    watermark = before.ops[0].watermark
    assert watermark > NO_WATERMARK
    other = "rocksdb" if backend == "hashmap" else "hashmap"
    after = Subtasks(kind, params, other, tmp_path / "after", parallelism=2)
    after.restore(handles)
    assert [op.watermark for op in after.ops] == [watermark, watermark]
    # new chunks are numbered after every restored one: none overwrites one of its key group
    assert [op.next_chunk for op in after.ops] == [before.ops[0].next_chunk] * 2
    # each subtask got its own key groups' share of what waited
    assert all(any(True for name in STATES[kind] for _ in op.backend.items(name)) for op in after.ops)
    drive(after, left, right, start=5)
    after.watermark(MAX_WATERMARK)

    by = ["lid", "rid"] + (["window_start"] if kind == "window-join" else [])
    result = pd.concat([before.result(), after.result()])
    assert len(result) > 50
    pd.testing.assert_frame_equal(canon(result, by), canon(whole.result(), by))


def test_a_restore_takes_the_smallest_watermark_of_the_subtasks(backend, tmp_path):
    params = {"key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "lower": 0, "upper": 10}
    two = Subtasks("interval-join", params, backend, tmp_path / "two", parallelism=2)
    two.ops[0].process_watermark(500)
    two.ops[1].process_watermark(300)
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    one = Subtasks("interval-join", params, backend, tmp_path / "one")
    one.restore(two.snapshot(directory))
    assert one.ops[0].watermark == 300


# ---------------------------------------------------------------------- bad input
EVENT_TIME_PARAMS = {
    "interval-join": {"lower": -10, "upper": 10},
    "window-join": {"assigner": {"type": "tumbling", "size": 100}},
    "temporal-join": {"how": "inner"},
}


@pytest.mark.parametrize("kind", sorted(EVENT_TIME_PARAMS))
@pytest.mark.parametrize("side", [0, 1])
def test_a_missing_or_wrong_rowtime_column_is_a_clear_error(tmp_path, kind, side):
    params = {"key": ["k"], "left_rowtime": "ts", "right_rowtime": "when", **EVENT_TIME_PARAMS[kind]}
    op = open_join(kind, params, "hashmap", tmp_path)
    column = "ts" if side == 0 else "when"
    with pytest.raises(TimestampError, match=rf"operator 'under test' \(test.py:1\), its {['left', 'right'][side]} "
                                             rf"input: the timestamp column '{column}' is not in its input"):
        op.process_side(side, pa.table({"k": [1], "v": [2]}))
    with pytest.raises(TimestampError, match=rf"the timestamp column '{column}' is string, not a time"):
        op.process_side(side, pa.table({"k": [1], column: ["noon"]}))


def test_a_missing_key_column_names_the_input(tmp_path):
    op = open_join("interval-join", {"key": ["k"], "right_key": ["id"], "left_rowtime": "ts", "right_rowtime": "ts",
                                     "lower": 0, "upper": 1}, "hashmap", tmp_path)
    with pytest.raises(KeyError, match=r"operator 'under test' \(test.py:1\): key column\(s\) \['id'\] not in its "
                                       r"right input"):
        op.process_side(1, pa.table({"k": [1], "ts": [5]}))


@pytest.mark.parametrize("kind, params, message", [
    ("interval-join", {"lower": 10, "upper": -10}, r"lower bound \(10 ms\) is above its upper bound \(-10 ms\)"),
    ("interval-join", {"lower": "1s", "upper": 10}, r"lower bound must be a number of milliseconds"),
    ("interval-join", {"lower": 0, "upper": 1, "right_rowtime": None}, r"needs the rowtime column of both inputs: "
                                                                        r"right_rowtime not given"),
    ("window-join", {"assigner": {"type": "session", "gap": 100}}, r"takes tumbling or sliding windows, not "
                                                                   r"session windows"),
    ("window-join", {}, r"the window assigner must be a dict"),
    ("window-join", {"assigner": {"type": "sliding", "size": 100}}, r"a sliding window needs its 'slide'"),
    ("window-join", {"assigner": {"type": "tumbling", "size": 0}}, r"size must be a positive number"),
    ("temporal-join", {"how": "outer"}, r"a temporal join is \"inner\" or \"left\", not 'outer'"),
    ("temporal-join", {"right_key": ["a", "b"]}, r"must name as many columns"),
])
def test_bad_parameters_are_clear_errors(tmp_path, kind, params, message):
    with pytest.raises(ValueError, match=message):
        open_join(kind, {"key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", **params}, "hashmap", tmp_path)
