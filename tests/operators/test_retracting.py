"""An aggregation over an aggregation's running rows, batch by batch: the inner keyed aggregate
emits each key's old row marked -U before its update, the changelog aggregate takes it back; the
outer table at the end equals pandas' two group-bys over all the rows at once, and an outer key
whose rows all moved away is deleted."""
from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from cluster.graph.operator_kinds import ROW_KIND_COLUMN

from .harness import opened_operator, restored_operator


def operator(tmp_path, kind: str, params: dict, backend: str = "hashmap"):
    return opened_operator(tmp_path, kind, params, backend)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_histogram_of_running_counts_equals_pandas_over_all_rows(tmp_path, seed):
    rng = random.Random(seed)
    rows = pd.DataFrame({"k": [rng.randrange(30) for _ in range(800)], "v": [rng.randrange(-5, 50) for _ in range(800)]})
    backend = "rocksdb" if seed % 2 else "hashmap"
    inner = operator(tmp_path / "i", "keyed-aggregate", {"key": ["k"], "changelog": True, "aggregations": {
        "n": ["v", "count"], "total": ["v", "sum"]}}, backend)
    outer = operator(tmp_path / "o", "keyed-changelog-aggregate", {"key": ["n"], "aggregations": {
        "keys": ["total", "count"], "sum": ["total", "sum"], "mean": ["total", "mean"]}}, backend)
    table: dict = {}
    kinds = set()
    at = 0
    while at < len(rows):
        size = rng.choice([1, 9, 60])
        for changes in inner.process(pa.Table.from_pandas(rows.iloc[at:at + size], preserve_index=False)):
            kinds |= set(changes.column(ROW_KIND_COLUMN).to_pylist())
            for out in outer.process(changes):
                for row in out.to_pylist():
                    if row[ROW_KIND_COLUMN] == "-D":
                        table.pop(row["n"])
                    else:
                        table[row["n"]] = row
        at += size
    assert kinds == {"+I", "+U", "-U"}
    per_key = rows.groupby("k").v.agg(n="count", total="sum")
    expected = per_key.groupby("n").total.agg(keys="count", sum="sum", mean="mean").reset_index()
    got = pd.DataFrame(list(table.values())).drop(columns=[ROW_KIND_COLUMN]).sort_values("n", ignore_index=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    assert len(expected) < rows.k.nunique()  # some counts were left by every key that had them


@pytest.mark.parametrize("seed", [1, 2])
def test_min_and_max_over_a_changelog_keep_every_value_with_its_count(tmp_path, seed):
    """Per running total, the smallest and largest key having it and the latest time of those: a
    value leaves the multiset once every row holding it is taken back, through a restore into the
    other backend."""
    rng = random.Random(seed)
    n = 600
    rows = pd.DataFrame({"k": [rng.randrange(40) for _ in range(n)], "v": [rng.randrange(0, 4) for _ in range(n)],
                         "ts": pd.to_datetime([rng.randrange(10**6) for _ in range(n)], unit="ms", utc=True)})
    backends = ("rocksdb", "hashmap") if seed % 2 else ("hashmap", "rocksdb")
    inner = operator(tmp_path / "i", "keyed-aggregate", {"key": ["k"], "changelog": True, "aggregations": {
        "total": ["v", "sum"], "kk": ["k", "max"], "last": ["ts", "max"]}}, backends[0])
    params = {"key": ["total"], "aggregations": {"low": ["kk", "min"], "high": ["kk", "max"],
                                                 "latest": ["last", "max"], "keys": ["kk", "count"]}}
    outer = operator(tmp_path / "o", "keyed-changelog-aggregate", params, backends[0])
    table: dict = {}
    at = batches = 0
    while at < n:
        size = rng.choice([1, 9, 60])
        for changes in inner.process(pa.Table.from_pandas(rows.iloc[at:at + size], preserve_index=False)):
            for row in (r for out in outer.process(changes) for r in out.to_pylist()):
                if row[ROW_KIND_COLUMN] == "-D":
                    table.pop(row["total"])
                else:
                    table[row["total"]] = row
        at, batches = at + size, batches + 1
        if batches == 5:
            outer = restored_operator(tmp_path, outer, "keyed-changelog-aggregate", params, backends[1])
    per_key = rows.groupby("k", as_index=False).agg(total=("v", "sum"), last=("ts", "max"))
    expected = per_key.groupby("total").agg(low=("k", "min"), high=("k", "max"), latest=("last", "max"),
                                            keys=("k", "count")).reset_index()
    got = pd.DataFrame(list(table.values())).drop(columns=[ROW_KIND_COLUMN]).sort_values("total", ignore_index=True)
    pd.testing.assert_frame_equal(got[list(expected.columns)], expected, check_dtype=False)
    assert len(table) < rows.k.nunique()  # keys moved from total to total


def test_only_what_can_take_a_value_back_is_offered_over_a_changelog(tmp_path):
    with pytest.raises(ValueError, match="cannot take a value back"):
        operator(tmp_path, "keyed-changelog-aggregate", {"key": ["n"], "aggregations": {"s": ["v", "std"]}})


def test_a_key_taken_back_within_one_batch_emits_nothing(tmp_path):
    outer = operator(tmp_path, "keyed-changelog-aggregate", {"key": ["n"], "aggregations": {"c": ["v", "count"]}})
    assert outer.process(pa.table({"n": [1, 1], "v": [5, 5], ROW_KIND_COLUMN: ["+I", "-U"]})) == []
    out = outer.process(pa.table({"n": [2], "v": [np.int64(3)], ROW_KIND_COLUMN: ["+I"]}))
    assert out[0].to_pylist() == [{"n": 2, "c": 1, ROW_KIND_COLUMN: "+I"}]
