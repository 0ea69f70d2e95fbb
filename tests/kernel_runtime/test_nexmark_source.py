"""NexmarkSource's arguments and views, checked where they are written (no cluster)."""
from __future__ import annotations

import datetime

import pytest

from kernel_runtime import StreamEnvironment
from kernel_runtime.api import GraphValidationError, NexmarkSource
from kernel_runtime.api.sql.views import definitions, drop_temporary_view


def test_a_table_counts_its_own_rows_of_the_events_and_declares_its_columns():
    bids = NexmarkSource.bids(events=1_000, seed=7, events_per_second=5_000)
    assert (bids.kind, bids.name, bids.params["count"], bids.params["seed"]) == ("nexmark-source", "bid", 920, 7)
    assert list(bids.params["schema"]) == ["auction", "bidder", "price", "dateTime", "extra"]
    assert NexmarkSource.persons(events=1_000).params["count"] == 20
    assert NexmarkSource.auctions(events=None).params["count"] is None  # unbounded
    start = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    assert NexmarkSource.auctions(10, base_time=start).params["base_time_ms"] == 1_893_456_000_000


@pytest.mark.parametrize("call, says", [
    (lambda: NexmarkSource.bids(events=-1), "NexmarkSource.bids (test_nexmark_source.py:"),
    (lambda: NexmarkSource.persons(events=10, events_per_second=0), "events_per_second must be an integer >= 1"),
    (lambda: NexmarkSource.auctions(events=10, base_time=datetime.datetime(2030, 1, 1)), "a datetime with a time zone"),
])
def test_a_wrong_argument_is_refused_at_the_users_line(call, says):
    with pytest.raises(GraphValidationError) as error:
        call()
    assert says in str(error.value)


def test_views_go_to_the_environment_given_or_to_every_environment_of_the_process():
    env = StreamEnvironment()
    NexmarkSource.create_views(100, env=env, tables=("bid",))
    assert "bid" in env._views and "bid" not in definitions()
    NexmarkSource.create_views(100, tables=("person", "auction"))
    try:
        assert {"person", "auction"} <= set(definitions())
    finally:
        for table in ("person", "auction"):
            drop_temporary_view(table)
