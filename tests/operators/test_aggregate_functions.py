"""Every aggregate function of ``aggregate(...)`` through the keyed operators, batch by batch: the
partials of each batch computed by the local-aggregate operator (several producers of one batch),
merged in keyed state, kept through a snapshot into the other backend; the values at the end equal
pandas (or plain Python) over all the rows at once."""
from __future__ import annotations

import math
import random
import statistics

import pandas as pd
import pyarrow as pa
import pytest

from cluster.graph.aggregations import AGGREGATE_FUNCTIONS

from .harness import opened_operator

AGGREGATIONS = {f: ["v", f] for f in AGGREGATE_FUNCTIONS}


def operator(tmp_path, kind: str, backend: str, params: dict):
    return opened_operator(tmp_path, kind, params, backend)


def expected(values: list) -> dict:
    """Each function over one key's values in arrival order, by its definition."""
    present = [v for v in values if v is not None]
    distinct = list(dict.fromkeys(present))
    return {"sum": sum(present), "count": len(present), "min": min(present, default=None),
            "max": max(present, default=None), "mean": statistics.fmean(present) if present else None,
            "nunique": len(distinct), "sum_distinct": sum(distinct) if distinct else None,
            "mean_distinct": statistics.fmean(distinct) if distinct else None,
            "first": present[0] if present else None, "last": present[-1] if present else None,
            "first_row": values[0], "last_row": values[-1],
            "collect_list": present, "collect_set": sorted(distinct),
            "var": statistics.variance(present) if len(present) > 1 else None,
            "var_pop": statistics.pvariance(present) if present else None,
            "std": statistics.stdev(present) if len(present) > 1 else None,
            "std_pop": statistics.pstdev(present) if present else None}


def same(got, want) -> bool:
    if want is None:
        return got is None or (isinstance(got, float) and math.isnan(got))
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    return got == want


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_function_merged_across_batches_equals_it_over_all_rows(tmp_path, seed):
    rng = random.Random(seed)
    rows = [(rng.randrange(5), rng.choice([None, *range(-20, 40)])) for _ in range(rng.randint(200, 600))]
    # a first row of each key, null or not, for first_row to tell from first
    rows = [(k, None if k % 2 else 7) for k in range(5)] + rows
    backends = ["hashmap", "rocksdb"] if seed % 2 else ["rocksdb", "hashmap"]
    local = operator(tmp_path / "local", "local-aggregate", backends[0], {"key": ["k"], "aggregations": AGGREGATIONS})
    merged = operator(tmp_path / "a", "keyed-aggregate", backends[0],
                      {"key": ["k"], "aggregations": AGGREGATIONS, "pre_aggregated": True})
    latest: dict = {}
    at, size = 0, rng.choice([7, 50, 160])
    while at < len(rows):
        batch = rows[at:at + size]
        half = max(1, len(batch) // 2)  # two producers' partials of one batch, in order
        partials = [t for part in (batch[:half], batch[half:]) if part for t in local.process(
            pa.table({"k": pa.array([r[0] for r in part], pa.int64()), "v": pa.array([r[1] for r in part], pa.int64())}))]
        for table in merged.process(pa.concat_tables(partials, promote_options="permissive")):
            for row in table.to_pylist():
                latest[row["k"]] = row
        at += size
        if at // size == 3:  # moved into the other backend through a snapshot, mid-stream
            snapshot = merged.snapshot_state(1)
            directory = tmp_path / "chk"
            directory.mkdir()
            handle = dict(snapshot.handle, **snapshot.keyed.write(directory / "s"), keyed_file="s",
                          directory=str(directory), subtask=0, parallelism=1)
            merged = operator(tmp_path / "b", "keyed-aggregate", backends[1],
                              {"key": ["k"], "aggregations": AGGREGATIONS, "pre_aggregated": True})
            merged.restore_state([handle])
    for key in range(5):
        values = [v for k, v in rows if k == key]
        want, got = expected(values), dict(latest[key])
        got["collect_set"] = sorted(got["collect_set"])
        wrong = {f: (got[f], want[f]) for f in AGGREGATE_FUNCTIONS if not same(got[f], want[f])}
        assert not wrong, (key, wrong)
