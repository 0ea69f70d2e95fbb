"""Every way a .sql chain's batch goes through Spark, checked against an oracle that owes nothing
to streamlab: the same batch through PySpark's public API (``createDataFrame`` of the Arrow table,
a temp view ``input``, ``spark.sql(query).toArrow()``) and, for a few columns, plain Python and
pandas. The paths are the runner's own (``SparkChain.process``, ``process_parts`` with a
``FusionGroup``): the first batch of a chain is analysed the Python way; later ones run in the
driver (spark_local, jvm/LocalBatch.java), as a kept plan's job (spark_plans, jvm/BatchJob.java,
its local maps), or as a fused job of two subtasks' batches (spark_fusion, BatchJob again). Each
test also checks, from the chain's own counters, that its batches took the path it names: a path
that silently fell back to the Python way would compare PySpark with itself.

Types: strings (unicode, empty), integers, floats (NaN, -0.0, infinities), booleans, decimals
(5,2) and (38,10), dates (year 1, the Julian/Gregorian switch, leap days), timestamps made in the
plan (with a time zone and without: TIMESTAMP vs TIMESTAMP_NTZ) in the session's zone (UTC, and
Asia/Kolkata, which is +05:30), timestamp inputs, arrays, maps and nested structs, a null in every
one. tests/e2e/test_spark_oracle_standalone.py runs the same cases on a spark:// cluster (BatchJob's
non-local branch) with the functions of this module.
"""
from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any, Callable, Optional
from zoneinfo import ZoneInfo

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from cluster.conf import TaskConfig
from cluster.graph.job_graph import OperatorSpec
from cluster.spark import arrow as spark_arrow
from cluster.operators.base import UserFunctionError
from cluster.spark.chain import SparkChain
from cluster.spark.runner import SparkRunner
from cluster.spark.fusion import FusionGroup, split_by_partition
from cluster.spark.plans import PlanCache
from tests.conftest import wait_for
from tests.operators.harness import chain_context

UTC = dt.timezone.utc
KOLKATA = "Asia/Kolkata"  # +05:30 all year: a zone whose offset is not whole hours
AS_JOBS = {"execution.spark.local-batch-rows": 0}  # every batch a Spark job (none in the driver)

# ---------------------------------------------------------------------------------------- data
STRINGS = ["", "naïve café", "日本語のテキスト", "emoji 🙂🚀", "  padded  ", "tab\tand\nnewline", "Straße", "plain"]
DAYS = [dt.date(1, 1, 2), dt.date(1582, 10, 4), dt.date(1582, 10, 15), dt.date(1900, 2, 28), dt.date(1969, 12, 31),
        dt.date(1970, 1, 1), dt.date(2000, 2, 29), dt.date(2024, 2, 29), dt.date(9999, 12, 30)]
FLOATS = [0.5, -0.0, math.nan, math.inf, -math.inf, 1e308, 5e-324, -123.25]
INNER = pa.struct([("x", pa.float64()), ("tags", pa.list_(pa.string())), ("day", pa.date32()),
                   ("amount", pa.decimal128(10, 3))])
SCHEMA = pa.schema([
    ("id", pa.int64()), ("s", pa.string()), ("i32", pa.int32()), ("f64", pa.float64()), ("b", pa.bool_()),
    ("d", pa.decimal128(5, 2)), ("big", pa.decimal128(38, 10)), ("day", pa.date32()),
    ("arr", pa.list_(pa.int64())), ("tags", pa.list_(pa.string())), ("m", pa.map_(pa.string(), pa.int64())),
    ("st", pa.struct([("a", pa.int64()), ("b", pa.string()), ("inner", INNER)])),
])


def _big(k: int) -> Optional[Decimal]:
    if k % 9 == 4:
        return None
    whole = (k * 1_234_567_890_123_456_789) % 10 ** 27  # up to 27 of decimal(38,10)'s 28 integer digits
    return Decimal(f"{'-' if k % 2 else ''}{whole}.{(k * 987_654_321) % 10 ** 10:010d}")


def typed(ids) -> pa.Table:
    """One row per id, every column a function of its id, with nulls (top level and nested),
    empties and edge values spread over the rows."""
    rows = []
    for k in (int(i) for i in ids):
        s = None if k % 8 == 7 else STRINGS[k % len(STRINGS)] + ("" if k % 3 else f" #{k}")
        rows.append({
            "id": k,
            "s": s,
            "i32": None if k % 5 == 0 else (k * 7919) % 2 ** 31 - 2 ** 30,
            "f64": None if k % 10 == 9 else FLOATS[k % len(FLOATS)],
            "b": None if k % 3 == 2 else bool(k % 2),
            "d": None if k % 6 == 0 else Decimal((k * 37) % 199_999 - 99_999) / 100,
            "big": _big(k),
            "day": None if k % 11 == 10 else (DAYS[k % len(DAYS)] if k % 2 else
                                              dt.date(2020, 1, 1) + dt.timedelta(days=k % 5_000 - 2_500)),
            "arr": None if k % 10 == 3 else [] if k % 10 == 4 else [k, None, -k][: 1 + k % 3],
            "tags": None if k % 12 == 5 else [t for t in (s, "x", None) if k % 4 or t is not None],
            "m": None if k % 7 == 5 else [] if k % 7 == 6 else [("a", k), ("ü", None), ("", -k)][: 1 + k % 3],
            "st": None if k % 13 == 2 else {
                "a": None if k % 4 == 1 else k * 10, "b": s,
                "inner": None if k % 13 == 3 else {
                    "x": None if k % 5 == 2 else k / 8, "tags": None if k % 2 else [s, "y"],
                    "day": None if k % 6 == 1 else DAYS[(k // 2) % len(DAYS)],
                    "amount": None if k % 7 == 3 else Decimal(k % 100_000) / 1000}},
        })
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def ids(i: int, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) + 100_000 * i


# A projection and a filter (narrow, and small batches of it run in the driver). No ORDER BY:
# every path keeps a batch's rows in their order (one partition, or partitions in order, which the
# fused split relies on), and so does the oracle over its one partition, so rows compare in order.
PROJECT = """SELECT id, s, upper(s) AS s_upper, concat(s, '|', CAST(id AS STRING)) AS s_cat, length(s) AS s_len,
  substring(s, 2, 3) AS s_sub, s = '' AS s_empty,
  i32, i32 * 2 AS i32_twice, CAST(i32 AS STRING) AS i32_text, f64, f64 / 2 AS f_half, b, NOT b AS not_b,
  d, d * 3 AS d_times, d + big AS d_plus_big, big, big / 7 AS big_div, CAST(big AS DECIMAL(38, 2)) AS big_cents,
  CAST(d AS DOUBLE) AS d_double,
  day, date_add(day, 1) AS next_day, datediff(day, DATE'2000-01-01') AS since_2000, year(day) AS y,
  CAST(day AS STRING) AS day_text, CAST(day AS TIMESTAMP) AS day_ts, CAST(day AS TIMESTAMP_NTZ) AS day_ntz,
  timestamp_micros(id * 1000003) AS micros,
  to_timestamp_ntz(concat('2024-03-31 0', CAST(pmod(id, 5) AS STRING), ':30:00')) AS wall_ntz,
  to_timestamp(concat('2024-03-31 0', CAST(pmod(id, 5) AS STRING), ':30:00')) AS wall_ts,
  arr, size(arr) AS n_arr, try_element_at(arr, 1) AS arr_first, transform(array(i32, id), x -> x * 2) AS arr_twice,
  array(i32, i32) AS pair, tags, array_join(tags, ',') AS tags_text,
  m, try_element_at(m, 'a') AS m_a, map_keys(m) AS m_keys, map('id', id, 'i32', i32) AS built_map,
  st, st.a AS st_a, st.inner.x AS st_x, st.inner.tags AS st_tags, st.inner.day AS st_day, st.inner.amount AS st_amount,
  named_struct('id', id, 'pair', named_struct('s', s, 'd', d, 'day', day)) AS built_struct,
  array(named_struct('k', s, 'v', big)) AS struct_list, map(id, st.inner) AS struct_map
FROM input WHERE id % 7 <> 3"""

# An aggregation: it needs a Spark job (an exchange), so it has no local or fused way; its ORDER BY
# fixes the row order, and within a group the lists are sorted.
AGGREGATE = """SELECT id % 5 AS g, count(*) AS n, count(s) AS n_s, max(s) AS s_max, min(s) AS s_min,
  sum(d) AS d_sum, avg(d) AS d_avg, try_sum(big) AS big_sum, max(big) AS big_max, sum(f64) AS f_sum,
  min(day) AS day_min, max(CAST(day AS TIMESTAMP)) AS ts_max, max(CAST(day AS TIMESTAMP_NTZ)) AS ntz_max,
  sort_array(collect_list(i32)) AS i32s, sort_array(collect_set(s)) AS strings, max_by(st, id) AS st_last,
  max_by(m, id) AS m_last, max_by(arr, id) AS arr_last, count_if(b) AS n_true
FROM input GROUP BY id % 5 ORDER BY g"""

# Timestamp inputs, which take PySpark's own createDataFrame (spark_arrow.by_pyspark)
TIMES = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")),
                   ("berlin", pa.timestamp("us", tz="Europe/Berlin")), ("naive", pa.timestamp("us")),
                   ("ms", pa.timestamp("ms", tz="America/New_York")), ("day", pa.date32())])
TIMES_QUERY = """SELECT id, ts, berlin, naive, ms, CAST(ts AS STRING) AS ts_text, hour(berlin) AS berlin_hour,
  ts + INTERVAL 1 DAY AS next_day, CAST(ts AS DATE) AS ts_day, CAST(naive AS TIMESTAMP_NTZ) AS naive_ntz,
  date_trunc('HOUR', berlin) AS hour_start, unix_micros(ms) AS ms_micros, struct(ts, day) AS pair,
  array(berlin, ms) AS both
FROM input WHERE id % 7 <> 3"""


def times(ids) -> pa.Table:
    micros = [None if k % 9 == 4 else (k * 86_400_000_017 * 37) % (200 * 365 * 86_400 * 10 ** 6)
              - 100 * 365 * 86_400 * 10 ** 6
              for k in (int(i) for i in ids)]
    return pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array(micros, TIMES.field("ts").type),
                     "berlin": pa.array(micros, TIMES.field("berlin").type),
                     "naive": pa.array(micros, TIMES.field("naive").type),
                     "ms": pa.array([None if m is None else m // 1000 for m in micros], TIMES.field("ms").type),
                     "day": pa.array([None if m is None else m // 86_400_000_000 for m in micros], pa.int32())
                     .cast(pa.date32())})


# ---------------------------------------------------------------------------------------- oracle
def oracle(spark, query: str, table: pa.Table, tz: str = "UTC",
           step: Optional[Callable] = None) -> pa.Table:
    """``query`` over ``table`` by PySpark's public API alone, in a session of the time zone ``tz``
    (``step``: a DataFrame function applied to the batch first, as a .spark step)."""
    session = spark.newSession()
    session.conf.set("spark.sql.session.timeZone", tz)
    df = session.createDataFrame(table)
    (step(df) if step is not None else df).createOrReplaceTempView("input")
    return session.sql(query).toArrow()


def _label_timestamps(t: pa.DataType, tz: str) -> pa.DataType:
    """``t`` with every zoned timestamp in it (nested too) labelled ``tz``."""
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit, tz=tz) if t.tz is not None else t
    if pa.types.is_map(t):
        return pa.map_(_label_field(t.key_field, tz), _label_field(t.item_field, tz))
    if pa.types.is_list(t):
        return pa.list_(_label_field(t.value_field, tz))
    if pa.types.is_struct(t):
        return pa.struct([_label_field(t.field(i), tz) for i in range(t.num_fields)])
    return t


def _label_field(f: pa.Field, tz: str) -> pa.Field:
    return f.with_type(_label_timestamps(f.type, tz))


def canonical(value: Any) -> Any:
    """A value as compared: floats by their bits' text (NaN equal to NaN, -0.0 not to 0.0), zoned
    datetimes as UTC instants (Python compares them so anyway; made explicit), naive ones as they
    are; Decimals by their text, which keeps the scale (Decimal('1.50') == Decimal('1.5'))."""
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value.hex())
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    if isinstance(value, dt.datetime):
        return ("instant", value.astimezone(UTC)) if value.tzinfo is not None else ("wall", value)
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(canonical(v) for v in value)
    return value


def assert_as_oracle(got: pa.Table, expected: pa.Table, tz: str = "UTC", what: str = "") -> None:
    """The same schema (names, types, nullability) and the same rows in the same order.

    The one thing normalised: ``toArrow()`` labels zoned timestamps UTC whatever the session's
    zone (PySpark casts its result to such a schema), where a Spark chain's Arrow keeps the label
    Spark's own Arrow writer gives them, the session's zone. Both hold the same UTC instants (the
    values are compared as instants); the label is checked to be the session's."""
    want = pa.schema([_label_field(f, tz) for f in expected.schema])
    assert got.schema.equals(want), f"{what}: schema\n{got.schema}\n!= the oracle's\n{want}"
    assert got.num_rows == expected.num_rows, f"{what}: {got.num_rows} rows, the oracle {expected.num_rows}"
    for name in expected.column_names:
        have, should = canonical(got[name].to_pylist()), canonical(expected[name].to_pylist())
        if have != should:
            wrong = next(i for i, (a, b) in enumerate(zip(have, should)) if a != b)
            key = got["id"][wrong] if "id" in got.column_names else "?"
            raise AssertionError(f"{what}: column {name}, row {wrong} (id {key}): "
                                 f"{have[wrong]!r} != the oracle's {should[wrong]!r}")


def assert_project_by_python(got: pa.Table, table: pa.Table, tz: str) -> None:
    """A few of PROJECT's columns computed without Spark (Python and pandas), against a path's output:
    that the oracle itself is right about the filter, the strings, decimals, dates and timestamps."""
    frame = table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    kept = frame[frame["id"] % 7 != 3].reset_index(drop=True)
    assert got["id"].to_pylist() == kept["id"].tolist()
    rows = [r for r in table.to_pylist() if r["id"] % 7 != 3]
    zone = ZoneInfo(tz)
    assert got["s"].to_pylist() == [r["s"] for r in rows]
    assert got["s_upper"].to_pylist() == [None if r["s"] is None else r["s"].upper() for r in rows]
    assert got["s_len"].to_pylist() == [None if r["s"] is None else len(r["s"]) for r in rows]  # code points
    assert canonical(got["d_times"].to_pylist()) == canonical([None if r["d"] is None else r["d"] * 3 for r in rows])
    assert canonical(got["big"].to_pylist()) == canonical([r["big"] for r in rows])
    assert got["day"].to_pylist() == [r["day"] for r in rows]
    assert got["next_day"].to_pylist() == [None if r["day"] is None else r["day"] + dt.timedelta(days=1) for r in rows]
    assert canonical(got["day_ts"].to_pylist()) == canonical(
        [None if r["day"] is None else dt.datetime.combine(r["day"], dt.time(), zone) for r in rows])
    assert got["day_ntz"].to_pylist() == [None if r["day"] is None else dt.datetime.combine(r["day"], dt.time())
                                          for r in rows]
    micros = pd.to_datetime(kept["id"].astype("int64") * 1000003, unit="us", utc=True)
    assert [t.value // 1000 for t in got["micros"].to_pandas()] == [t.value // 1000 for t in micros]
    assert got["m_a"].to_pylist() == [None if r["m"] is None else dict(r["m"]).get("a") for r in rows]
    assert got["st"].to_pylist() == [r["st"] for r in rows]
    assert got["arr"].to_pylist() == [r["arr"] for r in rows]


# ---------------------------------------------------------------------------------------- paths
def chains(steps: list, job: str, parallelism: int = 1, config: Optional[dict] = None,
           tz: Optional[str] = None) -> list[SparkChain]:
    """The subtasks of a Spark chain (``steps``: SQL strings or DataFrame functions, as .sql and
    .spark give them) opened on the process's TaskManager SparkSession, as tests/operators/harness.py's
    spark_chains opens a one-step chain; ``tz``: the session time zone of the chain's thread."""
    out = []
    for subtask in range(parallelism):
        ctx = chain_context(job, subtask, parallelism, config, "chain")
        specs = [OperatorSpec(uid=f"step-{n}", kind="spark", name="sql" if isinstance(step, str) else "spark",
                              call_site="test.py:1",
                              params={"sql": step} if isinstance(step, str) else {},
                              udf=None if isinstance(step, str) else cloudpickle.dumps(step))
                 for n, step in enumerate(steps)]
        chain = SparkChain(specs, ctx)
        chain.open()
        assert chain.paths.local_batches is not None and chain.paths.batch_jobs is not None, \
            "the Java helpers are not loaded: every batch would take the Python way"
        if tz is not None:
            # as a TaskManager whose taskmanager.spark.conf sets spark.sql.session.timeZone
            chain._session().conf.set("spark.sql.session.timeZone", tz)
        out.append(chain)
    return out


def close(subtasks: list[SparkChain]) -> None:
    for chain in subtasks:
        chain.close()


def run_path(path: str, query: str, batches: list[pa.Table], job: str, tz: Optional[str] = None) -> list[pa.Table]:
    """Each batch through ``query`` by ``path``, the first of them to analyse the plan (the
    Python way); the others' outputs, each checked to have taken ``path``:
    local: in the driver (LocalBatch); kept: a kept plan's job (BatchJob); fused: two subtasks'
    batches, ``batches[2k]`` and ``batches[2k + 1]``, in one job (BatchJob tagged); python: a
    timestamp input, which takes PySpark's path and keeps no plan. ``tz``: the chains' session
    time zone (None: the TaskManager's)."""
    if path == "fused":
        first, second = chains([query], job, parallelism=2, config=AS_JOBS, tz=tz)
        group = FusionGroup((job,))
        outputs = []
        try:
            for k in range(0, len(batches), 2):
                pair = batches[k:k + 2]
                out, ranges = first.process_parts(pair, group)
                assert out is not None, "the plan was not fused"
                outputs += [pa.concat_tables(parts) if parts else out.drop_columns(["__streamlab_partition__"])
                            .slice(0, 0) for parts in split_by_partition(out, ranges)]
            rounds = len(batches) // 2
            assert (first.fused_jobs, first.plans_reused, first.local_batch_count) == (rounds, rounds - 1, 0)
        finally:
            close([first, second])
        return outputs
    chain, = chains([query], job, config=AS_JOBS if path in ("kept", "python") else None, tz=tz)
    try:
        outputs = [pa.concat_tables(chain.process(t)) if t.num_rows else t for t in batches]
        later = len(batches) - 1
        if path == "local":
            assert (chain.local_batch_count, chain.plans_reused) == (later, 0), "not every later batch ran locally"
        elif path == "kept":
            assert (chain.local_batch_count, chain.plans_reused) == (0, later), \
                "not every later batch ran the kept plan"
        elif path == "python":
            assert (chain.local_batch_count, chain.plans_reused) == (0, 0)
        assert chain.metrics()["spark-batches"] == len(batches)
    finally:
        chain.close()
    return outputs


@pytest.fixture(autouse=True)
def plans(spark) -> PlanCache:
    """The TaskManager's plans, empty for each test: a plan another test analysed (in another
    session time zone, say) is not re-used."""
    runner = SparkRunner.get(TaskConfig.from_dict({}))
    runner.ready.wait()
    kept, runner.plans = runner.plans, PlanCache()
    yield runner.plans
    runner.plans = kept


def held(spark) -> tuple[int, int]:
    """What the TaskManager's JVM holds of batches now: BatchJob's local maps, BatchMemory's bytes."""
    return spark._jvm.streamlab.BatchJob.held(), SparkRunner.get(TaskConfig.from_dict({})).memory.held


# the batches of a chain: the first is analysed (the Python way), then one row, several sizes, a
# batch whose rows the filter all drops (ids 7k + 3), and edge ids
BATCHES = [ids(0, 300), ids(1, 1), ids(2, 457), ids(3, 2_000), np.arange(3, 700, 7), ids(4, 64), ids(5, 1),
           np.array([-(2 ** 33), -1, 0, 1, 2 ** 33 + 3, 2 ** 33 + 1], dtype=np.int64)]


AGGREGATED = [0, 1, 2, 4, 7]  # the batches an aggregation takes: each is two jobs and its oracle two more

# ---------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("tz", ["UTC", KOLKATA])
@pytest.mark.parametrize("path", ["local", "kept", "fused"])
def test_a_projection_of_every_type_gives_the_oracles_rows(spark, path, tz):
    tables = [typed(i) for i in BATCHES]
    outputs = run_path(path, PROJECT, tables, f"project-{path}-{tz}", tz)
    assert outputs[4].num_rows == 0  # the batch the filter empties: its schema is still compared
    # a projection and a filter work row by row: the oracle's rows of all batches at once (one
    # Spark job where one per batch took seconds), each batch's share of them its expected output
    expected, start = oracle(spark, PROJECT, pa.concat_tables(tables), tz), 0
    for n, (table, got) in enumerate(zip(tables, outputs)):
        share = expected.slice(start, sum(1 for k in table["id"].to_pylist() if k % 7 != 3))
        start += share.num_rows
        assert_as_oracle(got, share, tz, f"{path}, batch {n}")
        assert_project_by_python(got, table, tz)
    assert start == expected.num_rows
    assert held(spark) == (0, 0)


@pytest.mark.parametrize("tz", ["UTC", KOLKATA])
def test_an_aggregation_of_every_type_gives_the_oracles_rows(spark, tz):
    tables = [typed(BATCHES[i]) for i in AGGREGATED]
    outputs = run_path("kept", AGGREGATE, tables, f"aggregate-{tz}", tz)
    for n, (table, got) in enumerate(zip(tables, outputs)):
        assert_as_oracle(got, oracle(spark, AGGREGATE, table, tz), tz, f"batch {n}")
    first = outputs[0].to_pylist()[0]  # and one group by hand
    group = [r for r in tables[0].to_pylist() if r["id"] % 5 == 0]
    assert first["n"] == len(group) and first["d_sum"] == sum(r["d"] for r in group if r["d"] is not None)
    assert first["day_min"] == min(r["day"] for r in group if r["day"] is not None)


@pytest.mark.parametrize("tz", ["UTC", KOLKATA])
def test_timestamp_inputs_take_pysparks_path_and_give_the_oracles_rows(spark, tz):
    tables = [times(i) for i in BATCHES]
    outputs = run_path("python", TIMES_QUERY, tables, f"times-{tz}", tz)
    for n, (table, got) in enumerate(zip(tables, outputs)):
        assert_as_oracle(got, oracle(spark, TIMES_QUERY, table, tz), tz, f"batch {n}")
        rows = [r for r in table.to_pylist() if r["id"] % 7 != 3]
        # the instants, independently of Spark (a naive Arrow timestamp is read as UTC wall time)
        for column in ("ts", "berlin"):
            assert canonical(got[column].to_pylist()) == canonical([r[column] for r in rows]), column


SPLIT = 1_000  # rows per partition here (spark_arrow's MAX_PARTITION_ROWS is 250,000)


@pytest.fixture
def small_partitions(monkeypatch):
    """A batch of over SPLIT rows cut into partitions of SPLIT rows, as one of over 250k rows is
    (one partition per core under MAX_PARTITION_ROWS: local[1]'s single core never splits it)."""
    monkeypatch.setattr(spark_arrow, "SPLIT_ROWS", SPLIT)
    monkeypatch.setattr(spark_arrow, "MAX_PARTITION_ROWS", SPLIT)


class Stages:
    """The stages of the Spark jobs a chain ran since the last ``since()`` (Spark's status tracker,
    by the chain's job group)."""

    def __init__(self, spark, chain: SparkChain):
        self.tracker, self.group = spark.sparkContext.statusTracker(), chain.group
        self.since()

    def since(self) -> None:
        self.seen = set(self.tracker.getJobIdsForGroup(self.group))

    def new(self) -> list:
        jobs = sorted(set(self.tracker.getJobIdsForGroup(self.group)) - self.seen)
        self.since()
        # the tracker reads what Spark's listener bus has applied, after the job returned: its
        # end, which the bus delivers after its tasks' ends, says the counts are whole
        wait_for(lambda: all(self.tracker.getJobInfo(j).status in ("SUCCEEDED", "FAILED") for j in jobs), 30,
                 f"Spark's status of jobs {jobs}")
        return [self.tracker.getStageInfo(s) for j in jobs for s in self.tracker.getJobInfo(j).stageIds]


@pytest.mark.parametrize("query", [PROJECT, AGGREGATE], ids=["project", "aggregate"])
def test_a_table_split_into_several_partitions_gives_the_oracles_rows(spark, small_partitions, query):
    chain, = chains([query], "split", config=AS_JOBS)
    stages = Stages(spark, chain)
    try:
        tables = [typed(ids(0, 300)), typed(ids(1, 4_500)), typed(ids(2, 2_001))]
        for n, table in enumerate(tables):
            got = pa.concat_tables(chain.process(table))
            assert_as_oracle(got, oracle(spark, query, table), "UTC", f"batch {n}")
            # the stage that read the batch had a task per partition (an ORDER BY's sampling job
            # and the shuffles' stages have their own)
            tasks = [s.numTasks for s in stages.new()]
            assert -(-table.num_rows // SPLIT) in tasks, tasks
        assert chain.plans_reused == 2
    finally:
        chain.close()
    assert held(spark) == (0, 0)


def test_fused_batches_split_into_several_partitions_each_get_the_oracles_rows(spark, small_partitions):
    tables = [typed(ids(0, 300)), typed(ids(1, 200)), typed(ids(2, 2_500)), typed(ids(3, 3_200)),
              typed(ids(4, 1_000)), typed(np.arange(3, 7_000, 7))]  # the last keeps no row: its range is empty
    outputs = run_path("fused", PROJECT, tables, "fused-split", "UTC")
    for n, (table, got) in enumerate(zip(tables, outputs)):
        assert_as_oracle(got, oracle(spark, PROJECT, table), "UTC", f"batch {n}")
    assert held(spark) == (0, 0)


DIVIDE = "SELECT id, s, d, 100 DIV (id % 4500 - 4400) AS q FROM input"  # zero at id 4400 only


@pytest.mark.parametrize("path", ["kept", "fused"])
def test_a_failed_multi_partition_job_leaves_nothing_held(spark, small_partitions, path):
    """The job fails in its last partition, after the others finished and left their Arrow in
    BatchJob's map: the chain fails naming Spark's error, nothing of the job stays held (its
    maps, BatchMemory), and the chain's next batch gives the oracle's rows."""
    good, bad = typed(ids(0, 4_400)), typed(np.arange(4_500, dtype=np.int64))
    subtasks = chains([DIVIDE], f"failing-{path}", parallelism=2 if path == "fused" else 1, config=AS_JOBS)
    chain = subtasks[0]
    stages = Stages(spark, chain)
    group = FusionGroup((f"failing-{path}",))

    def run(tables: list[pa.Table]) -> list[pa.Table]:
        if path == "kept":
            return [pa.concat_tables(chain.process(t)) for t in tables]
        out, ranges = chain.process_parts(tables, group)
        return [pa.concat_tables(parts) for parts in split_by_partition(out, ranges)]
    try:
        pair = [good, typed(ids(1, 50))]
        for got, table in zip(run(pair if path == "fused" else pair[:1]), pair):  # analysed, the plan kept
            assert_as_oracle(got, oracle(spark, DIVIDE, table), what="before")
        stages.since()
        with pytest.raises(UserFunctionError) as failure:
            run([typed(ids(2, 10)), bad] if path == "fused" else [bad])
        assert "failed in Spark" in str(failure.value) and "DIVIDE_BY_ZERO" in str(failure.value)
        stage, = stages.new()
        # one task per partition (the fused job: the small batch's one first); the last failed
        # after the others had finished and left their output in BatchJob's map
        assert (stage.numTasks, stage.numFailedTasks, stage.numCompletedTasks) == \
            (5 + (path == "fused"), 1, 4 + (path == "fused"))
        assert held(spark) == (0, 0)
        for got, table in zip(run(pair if path == "fused" else pair[:1]), pair):  # the chain goes on
            assert_as_oracle(got, oracle(spark, DIVIDE, table), what="after")
        assert chain.plans_reused == 1  # the failed job counts for nothing
    finally:
        close(subtasks)
    assert held(spark) == (0, 0)


def shout(text: Optional[str]) -> Optional[str]:
    return None if text is None else text.upper() + "!"


def plus_one(v: pd.Series) -> pd.Series:
    return v + 1


def with_udfs(df):
    """A .spark step: a Python UDF and a pandas UDF, and one registered for the .sql after it."""
    from pyspark.sql import functions as F
    df.sparkSession.udf.register("shout", shout, "string")
    return df.withColumn("loud", F.udf(shout, "string", useArrow=False)(F.col("s"))) \
        .withColumn("next", F.pandas_udf(plus_one, "long")(F.col("id")))


UDF_QUERY = "SELECT id, loud, next, shout(s) AS registered, d, day, st FROM input WHERE id % 7 <> 3"


def test_a_python_udf_in_a_sql_chain_falls_back_to_pysparks_path(spark):
    """A .spark step (Python and pandas UDFs) before a .sql: no plan is kept, every batch takes
    PySpark's path (no batch in the driver, none through BatchJob), with the oracle's rows."""
    chain, = chains([with_udfs, UDF_QUERY], "udf-chain")
    try:
        tables = [typed(i) for i in BATCHES[:4]]
        for n, table in enumerate(tables):
            got = pa.concat_tables(chain.process(table))
            assert_as_oracle(got, oracle(spark, UDF_QUERY, table, step=with_udfs), what=f"batch {n}")
            rows = [r for r in table.to_pylist() if r["id"] % 7 != 3]
            assert got["loud"].to_pylist() == got["registered"].to_pylist() == [shout(r["s"]) for r in rows]
            assert got["next"].to_pylist() == [r["id"] + 1 for r in rows]
        assert (chain.plans_reused, chain.local_batch_count) == (0, 0)
        assert chain.metrics()["spark-batches"] == len(tables)
    finally:
        chain.close()


def test_a_kept_plan_with_a_python_udf_falls_back_from_the_driver_to_a_job(spark):
    """A .sql chain whose plan calls a Python UDF (registered in the chain's session): small as its
    batches are, Spark's optimiser leaves the UDF to execute, so LocalBatch gives them back and
    they run as kept-plan jobs (BatchJob, with Python workers), with the oracle's rows."""
    query = "SELECT id, shout(s) AS loud, upper(s) AS s_upper, d, day, st FROM input WHERE id % 7 <> 3"
    chain, = chains([query], "udf-sql")
    chain._session().udf.register("shout", shout, "string")
    try:
        tables = [typed(i) for i in BATCHES[:4]]
        for n, table in enumerate(tables):
            got = pa.concat_tables(chain.process(table))
            expected = oracle(spark, query, table, step=lambda df: (df.sparkSession.udf.register("shout", shout,
                                                                                                   "string"), df)[1])
            assert_as_oracle(got, expected, what=f"batch {n}")
            assert got["loud"].to_pylist() == [shout(r["s"]) for r in table.to_pylist() if r["id"] % 7 != 3]
        template = chain.paths.cached(tables[0].schema, False)
        assert template is not None and template.local is False
        assert (chain.local_batch_count, chain.plans_reused) == (0, len(tables) - 1)
    finally:
        chain.close()
    assert held(spark) == (0, 0)
