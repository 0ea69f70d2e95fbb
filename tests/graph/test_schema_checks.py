"""Schemas before the job runs: Spark and Arrow type names in connectors' schemas, and the columns
an operator names checked at submission against what the client knows it will receive."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from cluster.graph.job_graph import GraphValidationError
from cluster.graph.operator_kinds import KINDS
from cluster.graph.schema import parse_schema
from kernel_runtime import StreamEnvironment
from kernel_runtime.api import FileSource
from kernel_runtime.api.connectors import RedisStreamSource

ARROW = pa.schema([("city", pa.string()), ("amount", pa.int64()), ("price", pa.float32()),
                   ("day", pa.date32()), ("at", pa.timestamp("us")), ("ok", pa.bool_())])


@pytest.mark.parametrize("schema", [
    {"city": "string", "amount": "bigint", "price": "float", "day": "date", "at": "timestamp", "ok": "boolean"},
    {"city": "varchar(20)", "amount": "long", "price": "real", "day": "DATE", "at": "timestamp_ntz", "ok": "bool"},
    {"city": "string", "amount": "int64", "price": "float", "day": "date32", "at": "timestamp[us]", "ok": "bool"},
    "city string, amount bigint, price float, day date, at timestamp, ok boolean",
    "`city`: STRING, amount: BIGINT NOT NULL, price float, day date, at timestamp, ok boolean",
    ARROW,
])
def test_spark_and_arrow_type_names_give_the_same_arrow_schema_on_the_taskmanager(tmp_path, schema):
    source = FileSource.csv(tmp_path, schema=schema)
    # the params travel as Arrow alias names, which the TaskManager's source parses
    assert parse_schema(source.params["schema"], "test") == ARROW


def test_a_pyspark_struct_type_is_a_schema(tmp_path):
    from pyspark.sql.types import LongType, StringType, StructField, StructType
    struct = StructType([StructField("user", StringType()), StructField("n", LongType())])
    assert FileSource.parquet(tmp_path, schema=struct).params["schema"] == {"user": "string", "n": "int64"}


@pytest.mark.parametrize("schema, message", [
    ({"city": "string", "amount": "bigintt"}, "schema column 'amount' has unknown type 'bigintt' (accepted: Spark: "
                                              "boolean, tinyint, byte, smallint, short, int, integer, bigint, long"),
    ("city string, amount", "schema 'city string, amount' is not a DDL column list ('amount' is not 'name type')"),
    ("city string, city bigint", "schema names column 'city' twice"),
    ("a decimal(10,2)", "schema column 'a' has unknown type 'decimal(10,2)'"),
])
def test_a_wrong_schema_names_the_column_and_the_accepted_names(tmp_path, schema, message):
    with pytest.raises(GraphValidationError) as info:
        FileSource.csv(tmp_path, schema=schema)
    assert f"FileSource.csv (test_schema_checks.py:" in str(info.value) and message in str(info.value)


def orders(seq):
    return pd.DataFrame({"city": pd.Series(seq % 3).map({0: "Oslo", 1: "Lima", 2: "Pune"}), "amount": seq})


def test_a_key_by_column_the_generator_does_not_make_fails_at_submission():
    env = StreamEnvironment(parallelism=2)
    env.from_generator(orders, count=10).key_by("y").count(name="by y").collect()
    with pytest.raises(GraphValidationError, match=r"^operator 'by y' \(test_schema_checks.py:\d+\): key_by column "
                                                   r"`y` does not exist; the input has city, amount$"):
        env.get_job_graph()


def test_an_aggregated_column_the_declared_schema_lacks_fails_at_submission_with_a_hint(tmp_path):
    env = StreamEnvironment(parallelism=2)
    (env.from_source(FileSource.csv(tmp_path, schema="city string, amount bigint"))
        .filter(lambda d: d.amount > 0)
        .key_by("city").aggregate(name="totals", total=("amout", "sum")).collect())
    with pytest.raises(GraphValidationError, match=r"operator 'totals \(partial\)' \(test_schema_checks.py:\d+\): "
                                                   r"column `amout` of total=\('amout', 'sum'\) does not exist; "
                                                   r"the input has city, amount. Did you mean `amount`\?"):
        env.get_job_graph()


def test_a_redis_source_with_a_schema_emits_its_id_field_first():
    env = StreamEnvironment(parallelism=1)
    (env.from_source(RedisStreamSource("redis://127.0.0.1:6379", "s", schema="n bigint", id_field="id"))
        .key_by("id", "n").count().collect())
    env.get_job_graph()  # both columns are known: no error
    # what the graph's checks know the source emits: the id first, as text, then the schema's fields
    other = StreamEnvironment(parallelism=1)
    (other.from_source(RedisStreamSource("redis://127.0.0.1:6379", "s", schema="n bigint", id_field="id"))
        .key_by("nn").count(name="by nn").collect())
    with pytest.raises(GraphValidationError, match=r"key_by column `nn` does not exist; the input has id, n\b"):
        other.get_job_graph()
    env = StreamEnvironment(parallelism=1)
    env.from_source(RedisStreamSource("redis://127.0.0.1:6379", "s", schema="n bigint")).key_by("id").count().collect()
    with pytest.raises(GraphValidationError, match="key_by column `id` does not exist; the input has n$"):
        env.get_job_graph()


def test_spark_steps_get_the_declared_schema_and_the_key_columns_their_consumers_need(tmp_path):
    env = StreamEnvironment(parallelism=2)
    (env.from_source(FileSource.csv(tmp_path, schema="city string, amount bigint"))
        .sql("SELECT city AS town, amount FROM input", name="rename")
        .key_by("city").count(name="per city")
        .collect())
    env.get_job_graph()  # built twice (a script may), annotated once
    (spark,) = [o for v in env.get_job_graph().vertices for o in v.operators if KINDS[o.kind].spark]
    assert pa.ipc.read_schema(pa.py_buffer(spark.params["input_schema"])).names == ["city", "amount"]
    # the client cannot know a Spark step's output: the TaskManager checks it after analysing it
    (need,) = spark.params["consumer_columns"]
    assert need[0] == "city" and need[2].startswith("operator 'per city' (test_schema_checks.py:")


def test_without_a_declared_schema_nothing_is_checked_before_the_job_runs(tmp_path):
    env = StreamEnvironment(parallelism=1)
    env.from_source(FileSource.csv(tmp_path)).key_by("anything").count().collect()
    env.get_job_graph()
