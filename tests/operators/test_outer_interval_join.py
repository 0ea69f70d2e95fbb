"""The outer interval join (Flink SQL's LEFT/RIGHT/FULL OUTER interval join) driven as a task
drives it, on both state backends: the inner pairs plus each outer side's rows that met none, with
the other side's columns null, once the watermark passes their bound; against pandas."""
from __future__ import annotations

import base64

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from cluster.graph.event_time import MAX_WATERMARK
from cluster.operators.join_state import Chunks

from tests.operators.test_joins import Subtasks, as_times, backend, canon, drive, events, joined_columns, merge_at  # noqa: F401

LOWER, UPPER = -150, 100
COLUMNS = ["k", "ts", "v", "lid", "ts_right", "v_right", "rid"]


def schema_text(frame: pd.DataFrame) -> str:
    schema = pa.Table.from_pandas(frame.drop(columns="arrival").assign(ts=pd.to_datetime(frame.ts, unit="ms")
                                                                        .astype("datetime64[ms]")),
                                  preserve_index=False).schema.remove_metadata()
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def reference(left: pd.DataFrame, right: pd.DataFrame, how: str) -> pd.DataFrame:
    left, right = left.drop(columns="arrival"), right.drop(columns="arrival")
    pairs = left.merge(right, on="k", suffixes=("", "_right"))
    gap = pairs.ts_right - pairs.ts
    pairs = pairs[(gap >= LOWER) & (gap <= UPPER)]
    parts = [as_times(pairs)]
    if how in ("left", "full"):
        parts.append(as_times(left[~left.lid.isin(pairs.lid)]))
    if how in ("right", "full"):
        alone = right[~right.rid.isin(pairs.rid)].rename(columns={"ts": "ts_right", "v": "v_right"})
        parts.append(as_times(alone).assign(k=np.nan))  # the left's key is null too: the right's key, named as it, is dropped
    return joined_columns(pd.concat(parts, ignore_index=True))


@pytest.mark.parametrize("how", ["left", "right", "full"])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_an_outer_interval_join_adds_each_outer_row_that_met_none(backend, merge_at, tmp_path, how,  # noqa: F811
                                                                   parallelism):
    left, right = events(seed=21, n=200, span=40_000)
    params = {"key": ["k"], "right_key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "lower": LOWER,
              "upper": UPPER, "how": how, "side_schemas": [schema_text(left), schema_text(right)]}
    join = Subtasks("interval-join", params, backend, tmp_path, parallelism=parallelism)
    drive(join, left, right, chunk=13)
    join.watermark(MAX_WATERMARK)
    got = join.result()
    expected = reference(left, right, how)
    assert expected.lid.isna().sum() + expected.rid.isna().sum() > 20  # rows without a match, on the outer sides
    order = ["lid", "rid"]
    got = canon(got.astype({"lid": "float64", "rid": "float64"}), order)
    expected = canon(expected.astype({"lid": "float64", "rid": "float64"}), order)
    pd.testing.assert_frame_equal(got[COLUMNS], expected[COLUMNS], check_dtype=False)
    for op in join.ops:  # nothing waits once the watermark passed everything
        assert not list(op.backend.items("left-index")) and not list(op.backend.items("right-index"))


def test_a_match_found_after_a_checkpoint_is_remembered_by_the_restore(backend, tmp_path):  # noqa: F811
    left, right = events(seed=22, n=160, span=30_000)
    params = {"key": ["k"], "right_key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "lower": LOWER,
              "upper": UPPER, "how": "full", "side_schemas": [schema_text(left), schema_text(right)]}
    before = Subtasks("interval-join", params, backend, tmp_path / "before")
    drive(before, left, right, stop=5)
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    handles = before.snapshot(directory)
    after = Subtasks("interval-join", params, backend, tmp_path / "after", parallelism=2)
    after.restore(handles)
    drive(after, left, right, start=5)
    after.watermark(MAX_WATERMARK)
    got = pd.concat([before.result(), after.result()], ignore_index=True).astype({"lid": "float64", "rid": "float64"})
    expected = reference(left, right, "full").astype({"lid": "float64", "rid": "float64"})
    pd.testing.assert_frame_equal(canon(got, ["lid", "rid"])[COLUMNS], canon(expected, ["lid", "rid"])[COLUMNS],
                                  check_dtype=False)


def test_a_null_key_meets_nothing_and_an_outer_row_with_one_leaves_alone(tmp_path):
    rows = pd.DataFrame({"k": [None, None, 1.0], "ts": pd.to_datetime([1_000, 1_000, 1_000], unit="ms"),
                         "lid": [1, 2, 3]})
    params = {"key": ["k"], "right_key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "lower": 0,
              "upper": 100, "how": "left", "output_watermark_delay": 101}
    join = Subtasks("interval-join", params, "hashmap", tmp_path)
    join.side(1, rows.rename(columns={"lid": "rid"}))
    join.side(0, rows)
    out, held = join.ops[0].process_watermark(2_000)
    join.out.extend(out)
    assert held == 2_000 - 101  # a joined row's time trails the input watermark by up to the upper bound
    got = join.result().sort_values("lid")
    # the null keys met nothing (pandas would pair them); they left alone, the 1 met its 1
    assert got["lid"].tolist() == [1, 2, 3] and got["rid"].isna().tolist() == [True, True, False]


def test_how_must_be_an_outer_kind(tmp_path):
    with pytest.raises(ValueError, match="how must be one of inner, left, right, full, got 'outer'"):
        Subtasks("interval-join", {"key": ["k"], "left_rowtime": "ts", "right_rowtime": "ts", "lower": 0,
                                   "upper": 1, "how": "outer"}, "hashmap", tmp_path)


assert Chunks.MERGE_AT > 2  # merge_at's fixture covers merging at nearly every batch too
