"""Nexmark's generator (cluster.connectors.nexmark) against Nexmark's own rules, on its first 1M
events: the 1:3:46 proportions and their interleaving, ids made in order, event times from the
event numbers, and the random fields drawn as Nexmark draws them (hot auctions, bidders and
sellers; log-uniform prices; categories; auction lengths; strings and sizes)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from cluster.connectors import nexmark as nx
from cluster.graph.nexmark import SCHEMAS, TABLES, count
from cluster.graph.schema import parse_schema

EVENTS = 1_000_000
RATE = 10_000  # events per second of event time: 1M events span 100 s


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    config = nx.NexmarkConfig(events_per_second=RATE)
    return {table: nx.all_rows(table, EVENTS, config).to_pandas() for table in TABLES}


def ms(column: pd.Series) -> np.ndarray:
    return column.to_numpy().astype("datetime64[ms]").astype(np.int64)


def test_the_tables_hold_one_person_three_auctions_and_46_bids_of_every_50_events(tables):
    assert {t: len(tables[t]) for t in TABLES} == {"person": 20_000, "auction": 60_000, "bid": 920_000}
    # a partial epoch: events 0..56 hold persons 0 and 50, auctions 1-3 and 51-53, bids 4-49 and 54-56
    assert [count(t, 57) for t in TABLES] == [2, 6, 49]
    merged = np.sort(np.concatenate([nx.event_numbers(t, np.arange(count(t, EVENTS))) for t in TABLES]))
    assert np.array_equal(merged, np.arange(EVENTS))


def test_columns_are_nexmark_flinks_and_as_declared(tables):
    for table in TABLES:
        made = nx.rows(table, np.arange(10, dtype=np.int64))
        assert made.schema == parse_schema(SCHEMAS[table], table), table


def test_ids_follow_the_event_numbers_and_event_times_their_rate(tables):
    persons, auctions, bids = tables["person"], tables["auction"], tables["bid"]
    assert persons["id"].tolist() == list(range(1000, 1000 + len(persons)))
    assert auctions["id"].tolist() == list(range(1000, 1000 + len(auctions)))
    for table, frame in tables.items():
        numbers = nx.event_numbers(table, np.arange(len(frame)))
        assert np.array_equal(ms(frame["dateTime"]) - nx.DEFAULT_BASE_TIME_MS, numbers * 1000 // RATE), table
    # a bid names an auction and a bidder already made, or one of the next 10 (Nexmark's id lead)
    numbers = nx.event_numbers("bid", np.arange(len(bids)))
    assert (bids["auction"] - 1000 <= (numbers // 50) * 3 + 2 + 10).all()
    assert (bids["bidder"] - 1000 <= numbers // 50 + 10).all()
    assert (bids["auction"] >= 1000).all() and (bids["bidder"] >= 1000).all()


def test_hot_auctions_bidders_and_sellers_as_nexmark_draws_them(tables):
    bids, auctions = tables["bid"], tables["auction"]
    # hot: the first auction (a bidder: the second person) of the newest bucket of 100, with
    # probability 1 - 1/ratio (ratio 2 for auctions, 4 for bidders and sellers); the others
    # land on those ids once in 100
    assert ((bids["auction"] - 1000) % 100 == 0).mean() == pytest.approx(0.5 + 0.5 / 100, abs=0.005)
    assert ((bids["bidder"] - 1000) % 100 == 1).mean() == pytest.approx(0.75 + 0.25 / 100, abs=0.005)
    assert ((auctions["seller"] - 1000) % 100 == 0).mean() == pytest.approx(0.75 + 0.25 / 100, abs=0.01)
    # a cold bid names one of the last 100 auctions or the next 10, evenly
    cold = bids[(bids["auction"] - 1000) % 100 != 0]
    numbers = nx.event_numbers("bid", cold.index.to_numpy())
    behind = (numbers // 50) * 3 + 2 - (cold["auction"].to_numpy() - 1000)
    late = behind[numbers > 5_000]  # once 100 auctions exist
    assert late.min() == -10 and late.max() == 100
    assert np.histogram(late, bins=10, range=(-10, 100))[0].std() / (len(late) / 10) < 0.05


def test_prices_categories_and_auction_lengths_follow_nexmarks_distributions(tables):
    bids, auctions = tables["bid"], tables["auction"]
    # log-uniform: 10^(6u) dollars in cents, so each decade holds a sixth of the prices
    decades = np.floor(np.log10(bids["price"].to_numpy() / 100.0)).clip(0, 5)
    assert np.bincount(decades.astype(int), minlength=6) / len(bids) == pytest.approx([1 / 6] * 6, abs=0.005)
    assert bids["price"].between(100, 100_000_000).all()
    assert (auctions["reserve"] > auctions["initialBid"]).all()
    assert sorted(auctions["category"].unique()) == [10, 11, 12, 13, 14]
    assert auctions["category"].value_counts(normalize=True).to_numpy() == pytest.approx([0.2] * 5, abs=0.01)
    # an auction lasts 1 .. 2 * horizon ms, the horizon being the time until 100 more auctions
    # (1,666 events: 166 ms at 10,000 events/s): on average about the horizon
    length = ms(auctions["expires"]) - ms(auctions["dateTime"])
    assert length.min() >= 1 and length.max() <= 2 * 166 + 1
    assert length.mean() == pytest.approx(166, rel=0.02)


def test_people_strings_and_sizes_are_nexmarks(tables):
    persons, bids, auctions = tables["person"], tables["bid"], tables["auction"]
    assert set(persons["state"]) == {"AZ", "CA", "ID", "OR", "WA", "WY"}
    assert len(set(persons["city"])) == 10 and len(set(persons["name"])) == 11 * 9
    assert persons["emailAddress"].str.fullmatch(r"[a-z]{7}@[a-z]{5}\.com").all()
    assert persons["creditCard"].str.fullmatch(r"\d{4} \d{4} \d{4} \d{4}").all()
    assert auctions["itemName"].str.len().between(3, 19).all()
    # the padding brings each kind to Nexmark's average size: a bid 100 bytes, an auction 500, a person 200
    assert (32 + bids["extra"].str.len()).mean() == pytest.approx(100, rel=0.02)
    assert bids["extra"].str.fullmatch(r"[a-z]+").all()
    auction_bytes = 48 + auctions["itemName"].str.len() + auctions["description"].str.len() + auctions["extra"].str.len()
    assert auction_bytes.mean() == pytest.approx(500, rel=0.02)
    person_bytes = 8 + sum(persons[c].str.len() for c in ("name", "emailAddress", "creditCard", "city", "state", "extra"))
    assert person_bytes.mean() == pytest.approx(200, rel=0.02)


@pytest.mark.parametrize("table", TABLES)
def test_an_event_is_the_same_in_any_batch_and_a_seed_changes_it(table):
    whole = nx.rows(table, np.arange(2_000, dtype=np.int64))
    cuts = (0, 1, 2, 7, 1_000, 1_001, 1_777, 2_000)  # batches of 1 too: no batch's own figure draws
    parts = pa.concat_tables([nx.rows(table, np.arange(a, b, dtype=np.int64)) for a, b in zip(cuts, cuts[1:])])
    assert whole.equals(parts)
    if table != "bid":
        return
    for seed in (1, 2**24):  # every bit of the seed counts
        other = nx.rows("bid", np.arange(2_000, dtype=np.int64), nx.NexmarkConfig(seed=seed))
        assert not whole.column("price").equals(other.column("price"))
        assert whole.column("dateTime").equals(other.column("dateTime"))
