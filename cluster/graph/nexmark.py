"""What a Nexmark table is, for the client and the source alike: its columns, and how many of the
first N events are its rows (the generator itself is cluster.connectors.nexmark).

Of every 50 events the first is a person, the next 3 auctions and the last 46 bids (Nexmark's
proportions 1:3:46). The columns and their names are nexmark-flink's, so its SQL runs unchanged.
"""
from __future__ import annotations

PERSON, AUCTION, BID = "person", "auction", "bid"
TABLES = (PERSON, AUCTION, BID)
PROPORTIONS = {PERSON: 1, AUCTION: 3, BID: 46}
TOTAL = sum(PROPORTIONS.values())
FIRST_OFFSET = {PERSON: 0, AUCTION: 1, BID: 4}  # where a table's events start among every 50

SCHEMAS: dict[str, dict[str, str]] = {
    PERSON: {"id": "int64", "name": "string", "emailAddress": "string", "creditCard": "string",
             "city": "string", "state": "string", "dateTime": "timestamp[ms]", "extra": "string"},
    AUCTION: {"id": "int64", "itemName": "string", "description": "string", "initialBid": "int64",
              "reserve": "int64", "dateTime": "timestamp[ms]", "expires": "timestamp[ms]", "seller": "int64",
              "category": "int64", "extra": "string"},
    BID: {"auction": "int64", "bidder": "int64", "price": "int64", "dateTime": "timestamp[ms]", "extra": "string"},
}


def count(table: str, events: int) -> int:
    """How many of events 0 .. events-1 are rows of ``table``."""
    epochs, rest = divmod(events, TOTAL)
    return epochs * PROPORTIONS[table] + min(PROPORTIONS[table], max(0, rest - FIRST_OFFSET[table]))
