"""Nexmark's events as sources: the benchmark the field uses (Flink, Spark, RisingWave, Arroyo and
Feldera publish Nexmark figures), its three tables as three streams.

    NexmarkSource.create_views(events=10_000_000)      # views bid, auction, person
    env.sql_query(QUERIES["q2"])                       # SELECT auction, price FROM bid WHERE ...
    bids = env.from_source(NexmarkSource.bids(events=10_000_000), NexmarkSource.watermarks())

``events`` counts all events (persons, auctions and bids 1:3:46), as Nexmark's ``events.num``
does: ``bids(events=N)``, ``auctions(events=N)`` and ``persons(events=N)`` together are the first
N events, each table made by its own source from the same numbered sequence, deterministic for a
``seed`` (cluster.connectors.nexmark). The columns and their names are nexmark-flink's (``dateTime``,
``emailAddress``, ...), so its queries run as written, with Spark's ``window()`` for its TUMBLE/HOP.
"""
from __future__ import annotations

import datetime
from typing import Optional

from cluster.graph.nexmark import AUCTION, BID, PERSON, SCHEMAS, count

from kernel_runtime.api.connectors import Connector, _Check
from kernel_runtime.api.sql.views import create_temporary_view
from kernel_runtime.api.time import WatermarkStrategy

__all__ = ["NexmarkSource"]

WATERMARK_DELAY_MS = 4_000  # nexmark-flink's WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND

# nexmark-flink's queries (src/main/resources/queries/) as Spark SQL over the views that
# NexmarkSource.create_views makes; the select lists and conditions are theirs
QUERIES = {
    "q0": "SELECT auction, bidder, price, dateTime, extra FROM bid",
    "q1": "SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    "q3": "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P ON A.seller = P.id "
          "WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')",
    # the average closing price per category: each auction's highest bid while it was open (a
    # regular join, as Flink plans it: expires is no time bound), then the average of those maxima,
    # each auction's old maximum taken back as a new one comes (retraction)
    "q4": "SELECT Q.category, AVG(Q.final) FROM (SELECT MAX(B.price) AS final, A.category FROM auction A, bid B "
          "WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires GROUP BY A.id, A.category) Q "
          "GROUP BY Q.category",
    # the auctions with the most bids in each 10 s sliding window (every 2 s): the count per auction
    # and window (a view, below), the highest count of each window over it (a view: a group per
    # window's end, final when the watermark passes it), joined on the window (a window join)
    "q5": "SELECT AuctionBids.auction, AuctionBids.num FROM AuctionBids JOIN MaxBids "
          "ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime "
          "AND AuctionBids.num >= MaxBids.maxn",
    # the highest bids of each 10 s: a tumbling window's maximum (a view, below), joined back to
    # the bids of its window by price and time, an interval join
    "q7": "SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra FROM bid B JOIN B1 ON B.price = B1.maxprice "
          "WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL 10 SECONDS AND B1.dateTime",
    # the people who opened an auction in the 10 s window they joined in: two tumbling windows'
    # groups (views, below), a window join on their keys and windows
    "q8": "SELECT P.id, P.name, P.starttime FROM P JOIN A ON P.id = A.seller AND P.starttime = A.starttime "
          "AND P.endtime = A.endtime",
}
# the views a query reads besides the tables, made in order (nexmark-flink writes them as subqueries;
# a subquery of a join is a view of its own here): name -> its query
QUERY_VIEWS = {
    "q5": {"AuctionBids": "SELECT auction, count(*) AS num, window.start AS starttime, window.end AS endtime "
                          "FROM bid GROUP BY auction, window(dateTime, '10 seconds', '2 seconds')",
           "MaxBids": "SELECT max(num) AS maxn, starttime, endtime FROM AuctionBids GROUP BY starttime, endtime"},
    "q7": {"B1": "SELECT max(price) AS maxprice, window.end AS dateTime FROM bid GROUP BY window(dateTime, '10 seconds')"},
    "q8": {"P": "SELECT id, name, window.start AS starttime, window.end AS endtime FROM person "
                "GROUP BY id, name, window(dateTime, '10 seconds')",
           "A": "SELECT seller, window.start AS starttime, window.end AS endtime FROM auction "
                "GROUP BY seller, window(dateTime, '10 seconds')"},
}


class NexmarkSource(Connector):
    """One Nexmark table as a source: ``NexmarkSource.bids``, ``.auctions`` or ``.persons``.

    ``events``: how many events (of all three tables) the source covers; None: unbounded.
    ``events_per_second``: how far apart the events' times are (nexmark-flink's TPS, default
    10M/s: 10M events span one second of event time), not how fast they are made; ``rate`` limits
    that (rows per second of this table, all subtasks together). ``seed`` changes every random
    field. ``batch_size``/``split_size`` as ``env.from_generator``."""

    @classmethod
    def bids(cls, events: Optional[int] = None, **options) -> "NexmarkSource":
        return cls._table(BID, "NexmarkSource.bids", events, **options)

    @classmethod
    def auctions(cls, events: Optional[int] = None, **options) -> "NexmarkSource":
        return cls._table(AUCTION, "NexmarkSource.auctions", events, **options)

    @classmethod
    def persons(cls, events: Optional[int] = None, **options) -> "NexmarkSource":
        return cls._table(PERSON, "NexmarkSource.persons", events, **options)

    @staticmethod
    def watermarks() -> WatermarkStrategy:
        """Nexmark's watermark: the event time ``dateTime``, 4 s out of order at most."""
        return WatermarkStrategy.for_bounded_out_of_orderness(WATERMARK_DELAY_MS).with_timestamp_column("dateTime")

    @classmethod
    def create_views(cls, events: Optional[int] = None, env=None, tables=(BID, AUCTION, PERSON), **options) -> None:
        """Each table as a stream with Nexmark's watermark, registered as a view of its name (bid,
        auction, person) for ``sql_query`` and ``%%stream_sql``: in ``env``, or without one for
        every environment of the process (the notebook's cells), as ``create_temporary_view`` does."""
        factories = {BID: cls.bids, AUCTION: cls.auctions, PERSON: cls.persons}
        for table in tables:
            source = factories[table](events, **options)
            stream = (lambda e, source=source: e.from_source(source, cls.watermarks()))
            if env is None:
                create_temporary_view(table, stream)
            else:
                env.create_temporary_view(table, stream(env))

    @staticmethod
    def query(env, name: str, parallelism: Optional[int] = None):
        """Nexmark's query ``name`` (q0, q1, ...) over the views of ``create_views`` in ``env``:
        the views it reads besides the tables made first, then its stream."""
        for view, query in QUERY_VIEWS.get(name, {}).items():
            env.create_temporary_view(view, env.sql_query(query, name=f"{name}: {view}", parallelism=parallelism))
        return env.sql_query(QUERIES[name], name=name, parallelism=parallelism)

    @classmethod
    def _table(cls, table: str, factory: str, events: Optional[int], *, seed: int = 0,
               events_per_second: int = 10_000_000, base_time: Optional[datetime.datetime] = None,
               rate: Optional[float] = None, batch_size: Optional[int] = None, split_size: Optional[int] = None,
               name: Optional[str] = None) -> "NexmarkSource":
        check = _Check(factory)
        events = check.integer("events", events, low=0, optional=True)
        params = {"table": table, "count": None if events is None else count(table, events),
                  "seed": check.integer("seed", seed, low=0),
                  "events_per_second": check.integer("events_per_second", events_per_second),
                  "rate": None if rate is None else check.number("rate", rate),
                  "batch_size": check.integer("batch_size", batch_size, optional=True),
                  "split_size": check.integer("split_size", split_size, optional=True),
                  "schema": dict(SCHEMAS[table])}
        if base_time is not None:
            if not isinstance(base_time, datetime.datetime) or base_time.tzinfo is None:
                check.fail("base_time", "a datetime with a time zone", base_time)
            params["base_time_ms"] = int(base_time.timestamp() * 1000)
        return cls(kind="nexmark-source", name=check.text("name", name or table), params=params)
