"""Nexmark's queries on a real cluster, each answer equal to pandas over the same events at once.

The events are NexmarkSource's (100k of them: 2k persons, 6k auctions, 92k bids), read at
parallelism 2 in batches of a random size (seeded, printed); the queries are nexmark-flink's as
Spark SQL (kernel_runtime.api.nexmark.QUERIES), whose projections and filters run by Arrow after
the first batches (cluster.spark.arrow_eval), and, where Flink's DataStream API has one, the same
query as a user writes it with the API. The expected tables are pandas', written here from
the queries' meaning, over cluster.connectors.nexmark's rows of all events at once.
"""
from __future__ import annotations

import random
from decimal import Decimal

import pandas as pd
import pytest

from cluster.connectors import nexmark as nx
from kernel_runtime import StreamEnvironment
from kernel_runtime.api import NexmarkSource
from kernel_runtime.api.nexmark import QUERIES
from tests.e2e.test_streaming_sql import naive_utc, same_table

EVENTS = 100_000
RATE = 1_000  # events per second of event time: 100 s of auctions, ten of q7's 10 s windows
# the queries of the one job below; q4 (a join and two aggregations, 8 more tasks) runs in a job of
# its own, at a rate that makes its retractions happen, and so do q5 and q8 (windows, then a window join)
ALL_AT_ONCE = [name for name in QUERIES if name not in ("q4", "q5", "q8")]


@pytest.fixture(scope="module")
def events() -> dict[str, pd.DataFrame]:
    config = nx.NexmarkConfig(events_per_second=RATE)
    return {table: nx.all_rows(table, EVENTS, config).to_pandas() for table in ("bid", "auction", "person")}


def expected(events: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    bid, auction, person = events["bid"], events["auction"], events["person"]
    q3 = auction[auction["category"] == 10].merge(person[person["state"].isin(["OR", "ID", "CA"])],
                                                  left_on="seller", right_on="id", suffixes=("_a", "_p"))
    return {
        "q0": bid[["auction", "bidder", "price", "dateTime", "extra"]],
        # Spark's 0.908 * price is a decimal(23, 3): exact
        "q1": bid.assign(price=[Decimal(p) * Decimal("0.908") for p in bid["price"]])[
            ["auction", "bidder", "price", "dateTime", "extra"]],
        "q2": bid.loc[bid["auction"] % 123 == 0, ["auction", "price"]],
        "q3": q3.rename(columns={"id_a": "id"})[["name", "city", "state", "id"]],
        "q7": q7(bid),
    }


def q4(bid: pd.DataFrame, auction: pd.DataFrame) -> pd.DataFrame:
    """Each auction's highest bid between its start and its expiry, both included, averaged per category."""
    met = auction.merge(bid, left_on="id", right_on="auction", suffixes=("_a", "_b"))
    met = met[(met["dateTime_b"] >= met["dateTime_a"]) & (met["dateTime_b"] <= met["expires"])]
    final = met.groupby(["id", "category"], as_index=False)["price"].max()
    return final.groupby("category", as_index=False)["price"].mean().rename(columns={"price": "avg(final)"})


def q7(bid: pd.DataFrame) -> pd.DataFrame:
    """The bids at their 10 s window's highest price, from the window's start to its end, both
    included (BETWEEN): a bid at the end of a window also meets that window's maximum."""
    ends = bid["dateTime"].dt.floor("10s") + pd.Timedelta("10s")
    maxima = bid.assign(end=ends).groupby("end", as_index=False)["price"].max().rename(columns={"price": "top"})
    met = bid.merge(maxima, left_on="price", right_on="top")
    met = met[(met["dateTime"] >= met["end"] - pd.Timedelta("10s")) & (met["dateTime"] <= met["end"])]
    return met[["auction", "price", "bidder", "dateTime", "extra"]]


def q5(bid: pd.DataFrame) -> pd.DataFrame:
    """Per 10 s window every 2 s, the auctions with the most bids in it (ties all kept)."""
    ms = bid["dateTime"].to_numpy().astype("datetime64[ms]").astype("int64")
    starts = pd.concat(pd.DataFrame({"auction": bid["auction"].to_numpy(), "start": (ms // 2_000 - back) * 2_000})
                       for back in range(5))  # each bid is in the five windows that started 0-8 s before its slot
    counts = starts.groupby(["auction", "start"], as_index=False).size().rename(columns={"size": "num"})
    return counts[counts["num"] == counts.groupby("start")["num"].transform("max")][["auction", "num"]]


def q8(person: pd.DataFrame, auction: pd.DataFrame) -> pd.DataFrame:
    """The people who opened an auction in the 10 s window in which they joined: each (person,
    window) once, however many auctions."""
    people = person.assign(starttime=person["dateTime"].dt.floor("10s"))[["id", "name", "starttime"]]
    sellers = auction.assign(starttime=auction["dateTime"].dt.floor("10s"))[["seller", "starttime"]]
    met = people.drop_duplicates().merge(sellers.drop_duplicates(), left_on=["id", "starttime"],
                                         right_on=["seller", "starttime"])
    return met[["id", "name", "starttime"]]


def test_nexmark_queries_in_sql_and_with_the_api_equal_pandas(cluster, client, events):
    batch = random.Random(39).choice([997, 4_096, None])
    print(f"batches of {batch or 'what is due'}")
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    NexmarkSource.create_views(EVENTS, env=env, events_per_second=RATE, batch_size=batch)
    for name in ALL_AT_ONCE:
        NexmarkSource.query(env, name).collect(f"sql {name}")
    bids = env.from_source(NexmarkSource.bids(EVENTS, events_per_second=RATE, batch_size=batch),
                           NexmarkSource.watermarks())
    bids.collect("api q0")
    bids.map_batches(lambda df: df.assign(price=df["price"] * 0.908), name="to euro").collect("api q1")
    bids.filter(lambda df: df["auction"] % 123 == 0).map_batches(lambda df: df[["auction", "price"]]).collect("api q2")
    result = env.execute_async("nexmark q0-q3", client=client).wait(240)

    answers = expected(events)
    for name, table in answers.items():
        assert len(table) > (5 if name == "q7" else 300), (name, len(table))  # enough rows that a wrong answer shows
        same_table(naive_utc(result.to_pandas(f"sql {name}")), table, f"sql {name}: {QUERIES[name]}")
    for name in ("q0", "q2"):
        same_table(naive_utc(result.to_pandas(f"api {name}")), answers[name], f"api {name}")
    euros = answers["q1"].assign(price=answers["q1"]["price"].astype(float))
    same_table(naive_utc(result.to_pandas("api q1")), euros, "api q1")
    # the queries' projections and filters ran by Arrow once Spark had answered a batch as it did
    # (cluster.spark.arrow_eval): the equal answers above are Arrow's as much as Spark's
    subtasks = client.job_details(result.job_id)["subtasks"]
    assert sum(s["metrics"].get("spark-arrow-batches", 0) for s in subtasks) > 0


def test_q4_takes_back_each_auctions_old_maximum(cluster, client):
    """q4 with the bids coming at a rate: each auction's maximum changes batch by batch, and the
    average per category holds the latest maximum of each auction only (a maximum not taken back
    would count twice)."""
    events, rate = 20_000, 1_000
    config = nx.NexmarkConfig(events_per_second=rate)
    answer = q4(*(nx.all_rows(table, events, config).to_pandas() for table in ("bid", "auction")))
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    NexmarkSource.create_views(events, env=env, events_per_second=rate, batch_size=200, rate=3_000)
    q = NexmarkSource.query(env, "q4")
    q.collect("q4")
    q.changelog().collect("changes")
    result = env.execute_async("nexmark q4 at a rate", client=client).wait(240)
    same_table(result.to_pandas("q4"), answer, "q4")
    assert (result.to_pandas("changes")["__sql_op"] == "+U").sum() > 2 * len(answer)  # updated as bids came


def test_q5_and_q8_join_windows_closed_as_the_rows_come(cluster, client, events):
    """q5 and q8 at a rate, so that windows close while rows still come: each windowed group is
    final when the watermark passes its end, q5's highest count per window is a group per window's
    end over those, and a window join keeps rows only until the watermark passes their window."""
    answers = {"q5": q5(events["bid"]), "q8": q8(events["person"], events["auction"])}
    assert len(answers["q5"]) > 40 and len(answers["q8"]) > 50
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    NexmarkSource.create_views(EVENTS, env=env, events_per_second=RATE, batch_size=200, rate=3_000,
                               tables=("person", "auction"))
    NexmarkSource.create_views(EVENTS, env=env, events_per_second=RATE, batch_size=2_000, rate=20_000, tables=("bid",))
    for name in answers:
        q = NexmarkSource.query(env, name)
        assert "a window join" in q.explain()
        q.collect(name)
    result = env.execute_async("nexmark q5 and q8 at a rate", client=client).wait(240)
    for name, answer in answers.items():
        same_table(naive_utc(result.to_pandas(name)), answer, name)
