"""The deduplicate operator batch by batch, kept through a snapshot into the other backend: the
rows it emits, applied as upserts by key, equal pandas' pick over all the rows at once."""
from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from .harness import opened_operator, restored_operator


def operator(tmp_path, backend: str, params: dict):
    return opened_operator(tmp_path, "keyed-deduplicate", {"key": ["k"], **params}, backend)


def run(tmp_path, rows: pd.DataFrame, params: dict, seed: int) -> tuple[pd.DataFrame, int]:
    """The table the emitted rows make (the latest per key), and how many rows were emitted."""
    rng = random.Random(seed)
    backends = ["hashmap", "rocksdb"] if seed % 2 else ["rocksdb", "hashmap"]
    op = operator(tmp_path / "a", backends[0], params)
    latest: dict = {}
    emitted = at = batches = 0
    while at < len(rows):
        size = rng.choice([1, 5, 40, 200])
        for table in op.process(pa.Table.from_pandas(rows.iloc[at:at + size], preserve_index=False)):
            emitted += table.num_rows
            for row in table.to_pylist():
                latest[row["k"]] = row
        at, batches = at + size, batches + 1
        if batches == 4:
            op = restored_operator(tmp_path / "b", op, "keyed-deduplicate", {"key": ["k"], **params}, backends[1])
    table = pd.DataFrame(list(latest.values())).sort_values("k", ignore_index=True).astype({"ts": float})
    return table, emitted


def random_rows(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(300, 900))
    ts = rng.permutation(n).astype(float) * 10  # each time once: the pick is one row
    ts[rng.random(n) < 0.05] = np.nan
    return pd.DataFrame({"k": rng.integers(0, 12, n), "ts": ts, "v": np.arange(n)})


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("descending", [False, True])
def test_the_first_row_of_each_key_by_an_order_as_spark_sorts(tmp_path, seed, descending):
    rows = random_rows(seed)
    got, _ = run(tmp_path, rows, {"order": [["ts", descending, not descending]], "keep_latest": descending}, seed)
    # Spark: ascending puts nulls first, descending last
    expected = (rows.sort_values("ts", ascending=not descending, na_position="first" if not descending else "last",
                                 kind="stable").drop_duplicates("k").sort_values("k", ignore_index=True))
    pd.testing.assert_frame_equal(got, expected[got.columns], check_dtype=False)


@pytest.mark.parametrize("seed", [5, 6])
@pytest.mark.parametrize("keep", ["first", "last"])
def test_in_arrival_order_the_first_once_or_the_latest(tmp_path, seed, keep):
    rows = random_rows(seed)
    got, emitted = run(tmp_path, rows, {"order": [], "keep_latest": keep == "last"}, seed)
    expected = rows.drop_duplicates("k", keep=keep).sort_values("k", ignore_index=True)
    pd.testing.assert_frame_equal(got, expected[got.columns], check_dtype=False)
    if keep == "first":  # an append stream: each key's row once
        assert emitted == rows.k.nunique()


def test_rows_equal_in_the_order_go_to_the_first_ascending_and_the_latest_descending(tmp_path):
    rows = pd.DataFrame({"k": [1, 1, 1, 1], "ts": [5.0, 5.0, 5.0, 5.0], "v": [0, 1, 2, 3]})
    first, _ = run(tmp_path / "asc", rows, {"order": [["ts", False, True]], "keep_latest": False}, 1)
    latest, _ = run(tmp_path / "desc", rows, {"order": [["ts", True, False]], "keep_latest": True}, 1)
    assert first.v.tolist() == [0] and latest.v.tolist() == [3]


@pytest.mark.parametrize("backends", [("hashmap", "rocksdb"), ("rocksdb", "hashmap")])
def test_with_the_event_time_in_the_key_a_key_lives_until_the_watermark_passes_it(tmp_path, backends):
    """Spark's dropDuplicates with a watermark: each (k, ts) once; its state ends when the
    watermark passes ts, so the state stays as small as the watermark's delay, and a row behind the
    watermark is late: dropped and counted, never emitted again."""
    params = {"key": ["k", "ts"], "order": [], "keep_latest": False, "time_column": "ts"}
    op = opened_operator(tmp_path / "a", "keyed-deduplicate", params, backends[0])

    def batch(k, ms):
        return pa.table({"k": k, "ts": pa.array(ms, pa.timestamp("ms")), "v": list(range(len(k)))})

    def emitted(tables):
        return sorted((r["k"], r["ts"].timestamp() * 1000) for t in tables for r in t.to_pylist())

    assert emitted(op.process(batch([1, 1, 2], [100, 100, 200]))) == [(1, 100), (2, 200)]
    assert emitted(op.process(batch([1, 2, 3], [100, 200, 300]))) == [(3, 300)]
    assert op.process_watermark(200) == ([], 200)  # the state of ts 100 ends; 200 is still on time
    assert sorted(key for key, _ in op.backend.items("kept")) == [(2, 200_000_000), (3, 300_000_000)]  # ns
    op = restored_operator(tmp_path, op, "keyed-deduplicate", params, backends[1])  # with its watermark and timers
    assert emitted(op.process(batch([1, 2, 4], [100, 200, 400]))) == [(4, 400)]  # (1, 100) is late
    assert op.metrics()["numLateRecordsDropped"] == 1
    op.process_watermark(1_000)
    assert list(op.backend.items("kept")) == []
