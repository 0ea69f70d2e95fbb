"""The regular join (no time bound) driven as a task drives it, on both state backends: every pair
of rows with equal keys once, whatever the arrival order, against pandas' merge; a checkpoint
restored into two subtasks; the state TTL forgetting rows by the (injected) wall clock; an upsert
side (a running aggregate's rows) whose new row replaces its old one and its pairs."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd
import pytest

from cluster.common import clock
from cluster.graph.event_time import MAX_WATERMARK
from cluster.operators.timers import PROCESSING_TIME

from tests.operators.test_joins import Subtasks, as_times, backend, canon, drive, events, joined_columns, merge_at  # noqa: F401

PARAMS = {"key": ["k"], "right_key": ["k"]}


def reference(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    merged = left.drop(columns="arrival").merge(right.drop(columns="arrival"), on="k", suffixes=("", "_right"))
    return canon(as_times(joined_columns(merged)), ["lid", "rid"])


@pytest.mark.parametrize("parallelism", [1, 2])
def test_every_pair_of_equal_keys_once_as_pandas_merges_them(backend, merge_at, tmp_path, parallelism):  # noqa: F811
    left, right = events(seed=11, n=240)
    join = Subtasks("regular-join", PARAMS, backend, tmp_path, parallelism=parallelism)
    drive(join, left, right, chunk=17)
    join.watermark(MAX_WATERMARK)
    got = canon(join.result(), ["lid", "rid"])
    assert len(got) > 1000
    pd.testing.assert_frame_equal(got, reference(left, right))


def test_a_checkpoint_restores_into_two_subtasks_with_the_same_output(backend, tmp_path):  # noqa: F811
    left, right = events(seed=12, n=200)
    before = Subtasks("regular-join", PARAMS, backend, tmp_path / "before")
    drive(before, left, right, stop=4)
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    handles = before.snapshot(directory)
    other = "rocksdb" if backend == "hashmap" else "hashmap"
    after = Subtasks("regular-join", PARAMS, other, tmp_path / "after", parallelism=2)
    after.restore(handles)
    assert all(any(True for _ in op.backend.items("left-rows-chunks")) for op in after.ops)
    drive(after, left, right, start=4)
    result = canon(pd.concat([before.result(), after.result()]), ["lid", "rid"])
    pd.testing.assert_frame_equal(result, reference(left, right))


def test_the_state_ttl_forgets_a_row_that_long_after_it_arrived(backend, tmp_path, monkeypatch):  # noqa: F811
    now = [1_000_000]
    monkeypatch.setattr(clock, "now_ms", lambda: now[0])
    join = Subtasks("regular-join", {**PARAMS, "state_ttl_ms": 5_000}, backend, tmp_path)
    op = join.ops[0]
    assert op.uses_processing_time
    frame = lambda k, i: pd.DataFrame({"k": [k], "id": [i]})  # noqa: E731
    join.side(0, frame(1, 10))
    now[0] += 4_000
    join.side(0, frame(2, 20))
    assert op.on_processing_time(now[0]) == []
    join.side(1, frame(1, 11))               # 4 s after the left row of key 1: it meets it
    assert len(join.result()) == 1
    now[0] += 1_000                          # the first left row's TTL is over, the second's is not
    op.on_processing_time(now[0])
    join.side(1, frame(1, 12))
    join.side(1, frame(2, 21))
    got = join.result()
    assert sorted(zip(got["id"], got["id_right"])) == [(10, 11), (20, 21)]
    # the first left row's timer is gone: the next is the rows' of 1,004,000
    assert op.timers.next_time(PROCESSING_TIME) == 1_009_000


@pytest.mark.parametrize("ttl", [-1, "1 hour", True])
def test_a_bad_state_ttl_is_a_clear_error(tmp_path, ttl):
    with pytest.raises(ValueError, match=r"'under test' \(test.py:1\): the join's state_ttl_ms must be a number"):
        Subtasks("regular-join", {**PARAMS, "state_ttl_ms": ttl}, "hashmap", tmp_path)


# ---------------------------------------------------------------------- upsert inputs
UPSERT = {**PARAMS, "upsert_keys": [["k"], None], "row_ids": [None, "__rid"]}


def updates(seed: int, n: int, keys: int = 9) -> pd.DataFrame:
    """Running rows of an aggregate keyed by k: each a new value of its key, in arrival order."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"k": rng.integers(0, keys, n), "total": rng.integers(0, 1000, n)})


def appends(seed: int, n: int, keys: int = 9) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"k": rng.integers(0, keys, n), "rid": np.arange(n)})


def applied(frame: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """The table an upsert stream's rows leave: the last row per key."""
    return frame.drop_duplicates(key, keep="last").drop(columns=[c for c in frame if c.startswith("__")])


def feed(join: Subtasks, left: pd.DataFrame, right: pd.DataFrame, chunk: int, start: int = 0,
         stop: Optional[int] = None) -> None:
    chunks = -(-max(len(left), len(right)) // chunk)
    for c in range(start, chunks if stop is None else stop):
        join.side(0, left.iloc[c * chunk:(c + 1) * chunk])
        join.side(1, right.iloc[c * chunk:(c + 1) * chunk])


@pytest.mark.parametrize("parallelism", [1, 2])
def test_an_upsert_side_replaces_its_row_and_its_pairs(backend, tmp_path, parallelism):  # noqa: F811
    left, right = updates(21, 300), appends(22, 120)
    join = Subtasks("regular-join", UPSERT, backend, tmp_path, parallelism=parallelism)
    feed(join, left, right, chunk=13)
    got = join.result()
    assert len(got) > len(right)  # the pairs of an updated row came again
    expected = applied(left, ["k"]).merge(right, on="k")
    pd.testing.assert_frame_equal(canon(applied(got, ["k", "__rid"]), ["rid"]), canon(expected, ["rid"]))
    # one kept row per key, however many versions came
    kept = [rows for _, (_, rows) in join.state("left-rows-chunks")]
    assert sum(t.num_rows for t in kept) == left["k"].nunique()


def test_two_upsert_sides_keep_one_pair_per_key(backend, tmp_path):  # noqa: F811
    params = {**PARAMS, "upsert_keys": [["k"], ["k"]]}
    left, right = updates(23, 200), updates(24, 200).rename(columns={"total": "top"})
    join = Subtasks("regular-join", params, backend, tmp_path, parallelism=2)
    feed(join, left, right, chunk=7)
    expected = applied(left, ["k"]).merge(applied(right, ["k"]), on="k")
    pd.testing.assert_frame_equal(canon(applied(join.result(), ["k"]), ["k"]), canon(expected, ["k"]))


def test_row_ids_and_upserts_survive_a_restore_at_another_parallelism(backend, tmp_path):  # noqa: F811
    left, once = updates(25, 240), appends(26, 120)
    right = pd.concat([once, once], ignore_index=True)  # every row twice, the copy after the checkpoint
    before = Subtasks("regular-join", UPSERT, backend, tmp_path / "before", parallelism=2)
    feed(before, left, right, chunk=20, stop=6)
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    handles = before.snapshot(directory)
    seen = len(before.out)
    feed(before, left, right, chunk=20, start=6)  # the first attempt goes on, then fails
    first_attempt = before.result().iloc[sum(t.num_rows for t in before.out[:seen]):]
    after = Subtasks("regular-join", UPSERT, backend, tmp_path / "after", parallelism=1)
    after.restore(handles)
    feed(after, left.iloc[120:], right.iloc[120:], chunk=30)  # the replay, in other batches
    replay = after.result()
    # a replayed row has the id it had in the failed attempt: its pairs replace the attempt's
    assert set(replay["__rid"]) == set(first_attempt["__rid"])
    got = pd.concat([before.result(), replay], ignore_index=True)  # as a result view keeps them
    assert got["__rid"].nunique() == len(right)  # one id per row, each copy its own
    expected = applied(left, ["k"]).merge(right, on="k")
    pd.testing.assert_frame_equal(canon(applied(got, ["k", "__rid"]), ["rid", "total"]),
                                  canon(expected, ["rid", "total"]))


def test_an_upsert_key_outside_the_join_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"the left input's upsert key \['id'\] must lie within its join key \['k'\]"):
        Subtasks("regular-join", {**PARAMS, "upsert_keys": [["id"], None]}, "hashmap", tmp_path)
