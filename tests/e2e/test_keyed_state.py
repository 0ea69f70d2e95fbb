"""Keyed state operators on a real cluster, with both backends, against pandas."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

from kernel_runtime import StreamEnvironment

N = 20_000


def sales(seq):
    return pd.DataFrame({"shop": (seq * 7) % 23, "item": seq % 3, "price": (seq % 89).astype("float64"), "seq": seq})


def all_sales() -> pd.DataFrame:
    return sales(np.arange(N, dtype=np.int64))


def latest(frame: pd.DataFrame, key: list[str], order: str) -> pd.DataFrame:
    return frame.sort_values(order).groupby(key).tail(1).sort_values(key).reset_index(drop=True)


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_aggregate_equals_pandas(cluster, client, backend):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config={"state.backend.type": backend})
    (env.from_generator(sales, count=N, batch_size=1_000)
        .key_by("shop", "item")
        .aggregate(revenue=("price", "sum"), n=("price", "count"), low=("price", "min"), high=("price", "max"),
                   avg=("price", "mean"), parallelism=3)
        .collect())
    out = latest(env.execute_async(f"aggregate {backend}", client=client).wait(60).to_pandas(), ["shop", "item"], "n")
    expected = (all_sales().groupby(["shop", "item"])
                .agg(revenue=("price", "sum"), n=("price", "count"), low=("price", "min"), high=("price", "max"),
                     avg=("price", "mean")).reset_index())
    pd.testing.assert_frame_equal(out, expected, check_dtype=False)


def test_aggregate_pre_aggregates_inside_the_spark_plan(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(sales, count=N, batch_size=2_000)
        .spark(lambda df: df.withColumn("price", F.col("price") * 2), name="double")
        .key_by("shop").aggregate(revenue=("price", "sum"), n=("seq", "count"))
        .collect())
    handle = env.execute_async("spark partials", client=client)
    out = latest(handle.wait(120).to_pandas(), ["shop"], "n")
    expected = all_sales().assign(price=lambda d: d.price * 2).groupby("shop").agg(
        revenue=("price", "sum"), n=("seq", "count")).reset_index()
    pd.testing.assert_frame_equal(out, expected, check_dtype=False)
    details = client.job_details(handle.job_id)
    source = next(v for v in details["vertices"] if v["name"].startswith("Source"))
    assert source["name"] == "Source: generator -> double -> aggregate (partial)"
    # one Spark job per batch: the partial aggregation is part of the same plan
    chain = [s["metrics"] for s in details["subtasks"] if s["vertex_id"] == source["id"]]
    assert all(m["spark-jobs"] == m["spark-batches"] > 0 for m in chain)
    # and the exchange carries one row per key and batch, not every row
    assert source["metrics"]["write-records"] <= 23 * sum(m["spark-batches"] for m in chain)


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_reduce_folds_each_key(cluster, client, backend):
    def keep_max(acc, new):
        return acc.where(acc.price >= new.price, new)

    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config={"state.backend.type": backend})
    env.from_generator(sales, count=N, batch_size=700).key_by("shop").reduce(keep_max).collect()
    out = env.execute_async(f"reduce {backend}", client=client).wait(60).to_pandas()
    final = out.groupby("shop")["price"].max().sort_index()
    pd.testing.assert_series_equal(final, all_sales().groupby("shop")["price"].max().sort_index(),
                                   check_dtype=False)


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_process_with_value_list_and_map_state(cluster, client, backend):
    def per_shop(key, rows, state):
        seen = state.value_state("seen")
        recent = state.list_state("recent")
        per_item = state.map_state("per_item")
        seen.update((seen.value() or 0) + len(rows))
        recent.add_all(rows["seq"].tolist()[-2:])
        recent.update(recent.get()[-3:])
        for item, n in rows.groupby("item").size().items():
            per_item.put(int(item), per_item.get(int(item), 0) + int(n))
        return pd.DataFrame({"shop": [key], "seen": [seen.value()], "recent": [str(recent.get())],
                             "items": [sum(v for _, v in per_item.items())]})

    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config={"state.backend.type": backend})
    env.from_generator(sales, count=N, batch_size=500).key_by("shop").process(per_shop).collect()
    out = latest(env.execute_async(f"process {backend}", client=client).wait(60).to_pandas(), ["shop"], "seen")
    counts = all_sales().groupby("shop").size()
    assert out.set_index("shop")["seen"].to_dict() == counts.to_dict()
    assert (out["items"] == out["seen"]).all()
    # the list keeps the last 3 sequence numbers added, all of that shop's sales; how many batches a
    # shop's rows came in (and from which of the two source subtasks first) depends on timing
    for shop, recent in zip(out["shop"], out["recent"]):
        recent = eval(recent)
        assert 2 <= len(recent) <= 3 and len(set(recent)) == len(recent)
        assert all((seq * 7) % 23 == shop for seq in recent)


def test_at_least_once_checkpoints_complete_without_alignment(cluster, client):
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config={
        "execution.checkpointing.interval": "200 ms", "execution.checkpointing.mode": "AT_LEAST_ONCE"})
    (env.from_generator(sales, count=N, rate=10_000, batch_size=500).key_by("shop")
        .aggregate(n=("price", "count")).collect())
    handle = env.execute_async("at least once", client=client)
    out = latest(handle.wait(60).to_pandas(), ["shop"], "n")
    assert out["n"].sum() == N
    from tests.conftest import rest
    stats = rest(cluster, f"/jobs/{handle.job_id}/checkpoints")[1]
    assert stats["counts"]["completed"] >= 3
    assert rest(cluster, f"/jobs/{handle.job_id}/checkpoints/config")[1]["mode"] == "at_least_once"
