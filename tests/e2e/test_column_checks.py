"""A wrong column fails the job before any row is read, naming the column, on a real cluster.

A Spark step is analysed on an empty DataFrame of its input schema when its task opens, and no
source reads before every task downstream of it has opened; key columns the client can check
fail the submission itself (tests/graph/test_schema_checks.py)."""
from __future__ import annotations

import pandas as pd
import pytest

from kernel_runtime import JobExecutionError, StreamEnvironment
from kernel_runtime.api import FileSource


def failure_and_rows_read(client, handle) -> tuple[str, int]:
    with pytest.raises(JobExecutionError) as info:
        handle.wait(180)
    subtasks = client.job_details(handle.job_id)["subtasks"]
    read = sum(s["metrics"].get("records-in", 0) for s in subtasks if s["vertex"].startswith("Source:"))
    return str(info.value), read


@pytest.mark.parametrize("rows", [5_000, 0])
def test_a_wrong_sql_column_over_a_declared_csv_schema_fails_before_a_row_is_read(cluster, client, tmp_path, rows):
    if rows:
        pd.DataFrame({"city": ["Oslo", "Lima"] * (rows // 2), "amount": range(rows)}).to_csv(
            tmp_path / "orders.csv", index=False)
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    # the query in another task than the source's: the source must wait for it to open
    (env.from_source(FileSource.csv(tmp_path, schema="city string, amount bigint", batch_size=500))
        .rebalance()
        .sql("SELECT cty, sum(amount) AS total FROM input GROUP BY cty", name="by_city", per_batch=True)
        .collect())
    text, read = failure_and_rows_read(client, env.execute_async(f"wrong column, {rows} rows", client=client))
    assert "operator 'by_city' (test_column_checks.py:" in text and "`cty`" in text, text
    assert "`city`" in text  # Spark's own suggestion is kept
    assert read == 0


def test_a_key_by_column_a_spark_step_does_not_output_fails_before_a_row_is_read(cluster, client):
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    (env.from_generator(lambda seq: pd.DataFrame({"city": seq % 5, "amount": seq}), count=100_000)
        .sql("SELECT city AS town, amount FROM input", name="rename")
        .key_by("city").count(name="per city")
        .collect())
    text, read = failure_and_rows_read(client, env.execute_async("wrong key", client=client))
    assert "operator 'per city' (test_column_checks.py:" in text, text
    assert "key_by column `city` does not exist; the input (the output of operator 'rename'" in text
    assert read == 0


def _drifting(seq):
    values = seq if seq[0] < 1_000 else seq.astype(str)  # numbers, then strings from row 1,000 on
    return pd.DataFrame({"k": seq % 3, "v": values})


def test_a_column_that_changes_type_fails_naming_the_users_column_operator_and_line(cluster, client):
    from tests.conftest import rest
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    env.from_generator(_drifting, count=3_000, batch_size=500).key_by("k").aggregate(t=("v", "sum")).collect()
    handle = env.execute_async("a drifting column", client=client)
    with pytest.raises(JobExecutionError) as info:
        handle.wait(120)
    text = str(info.value)
    assert "operator 'generator' (test_column_checks.py:" in text, text
    assert "column 'v' is string in this batch but was int64" in text, text
    assert "__t__" not in text and "Unable to merge" not in text, text  # no internal column, no Arrow wording
    (entry,) = rest(cluster, f"/jobs/{handle.job_id}/exceptions")[1]["exceptionHistory"]["entries"]
    assert entry["taskName"].startswith("Source: generator -> aggregate (partial) ("), entry
    assert entry["taskManagerId"] in {tm["id"] for tm in rest(cluster, "/taskmanagers")[1]["taskmanagers"]}
    assert entry["endpoint"] and ":" in entry["endpoint"], entry
