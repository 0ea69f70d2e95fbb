"""Nexmark's events (persons, auctions, bids) made from their event numbers, as the benchmark's
generator makes them (nexmark/nexmark's nexmark-flink, after Beam's NexmarkGenerator), written
here with numpy over whole batches.

Events are numbered 0, 1, 2, ...; of every 50, the first is a person, the next 3 auctions and the
last 46 bids (Nexmark's proportions 1:3:46). An event's id fields follow from its number (a person
or auction is the next id), its time is ``base_time_ms + number * 1000 / events_per_second`` ms,
and its random fields (hot auctions, hot bidders and sellers, prices, categories, strings) are
drawn with Nexmark's distributions. Nexmark draws them from a java.util.Random that walks the
events in order; here each draw is a hash of (seed, event number, field), so an event is the same
whichever subtask makes it, in whichever batch: a source of parallelism p, restored anywhere in
its sequence, gives the same events as one pass over all of them.

Each table is its own sequence (bid 0, 1, 2, ... are the bids among the events in order), so
``rows(table, seq)`` makes the rows of one table and ``count(table, events)`` says how many of the
first ``events`` events it holds. Strings are cut from fixed pools of random letters at random
places (their lengths as Nexmark's), which keeps them per event and fast to make.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from cluster.connectors.sources import GeneratorSource
from cluster.graph.nexmark import AUCTION, BID, FIRST_OFFSET, PERSON, PROPORTIONS, TOTAL, count

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
ID_LEAD = 10            # ids not yet created that a bid or auction may name (Nexmark's *_ID_LEAD)
HOT_BUCKET = 100        # a hot auction, bidder or seller is the first (a bidder: second) of 100 ids
DEFAULT_BASE_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: a fixed start, so runs agree

US_STATES = np.array("AZ,CA,ID,OR,WA,WY".split(","), dtype=object)
US_CITIES = np.array("Phoenix,Los Angeles,San Francisco,Boise,Portland,Bend,Redmond,Seattle,Kent,Cheyenne"
                     .split(","), dtype=object)
FIRST_NAMES = np.array("Peter,Paul,Luke,John,Saul,Vicky,Kate,Julie,Sarah,Deiter,Walter".split(","), dtype=object)
LAST_NAMES = np.array("Shultz,Abrams,Spencer,White,Bartels,Walton,Smith,Jones,Noris".split(","), dtype=object)

@dataclass(frozen=True)
class NexmarkConfig:
    """Nexmark's generator settings (its defaults); ``events_per_second`` spaces the event times
    (nexmark-flink's TPS), not the speed at which they are made."""
    seed: int = 0
    events_per_second: int = 10_000_000
    base_time_ms: int = DEFAULT_BASE_TIME_MS
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100

    @classmethod
    def of(cls, params: dict) -> "NexmarkConfig":
        return cls(**{k: int(v) for k, v in params.items() if k in cls.__dataclass_fields__})


# ---------------------------------------------------------------------- numbering
def event_numbers(table: str, seq: np.ndarray) -> np.ndarray:
    """The event numbers of a table's rows ``seq`` (its own sequence 0, 1, 2, ...)."""
    epoch, offset = np.divmod(np.asarray(seq, dtype=np.int64), PROPORTIONS[table])
    return epoch * TOTAL + FIRST_OFFSET[table] + offset


def event_time_ms(config: NexmarkConfig, numbers: np.ndarray) -> np.ndarray:
    return config.base_time_ms + (numbers * 1000) // config.events_per_second


def last_person(numbers: np.ndarray) -> np.ndarray:
    """The newest person id (base 0) when event ``numbers`` is made (Nexmark's lastBase0PersonId)."""
    return numbers // TOTAL


def last_auction(numbers: np.ndarray) -> np.ndarray:
    """The newest auction id (base 0) when event ``numbers`` is made (lastBase0AuctionId): a
    person names the previous epoch's last auction, a bid its own epoch's last."""
    epoch, offset = np.divmod(numbers, TOTAL)
    auctions = PROPORTIONS[AUCTION]
    is_person = offset < FIRST_OFFSET[AUCTION]
    is_bid = offset >= FIRST_OFFSET[BID]
    return np.where(is_person, (epoch - 1) * auctions + auctions - 1,
                    np.where(is_bid, epoch * auctions + auctions - 1, epoch * auctions + offset - FIRST_OFFSET[AUCTION]))


# ---------------------------------------------------------------------- draws
def _mix(value: int) -> int:
    """splitmix64 of one integer: every bit of a seed changes every draw."""
    z = (value * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


class Draws:
    """The random draws of a batch of events: draw ``field`` is a hash of (seed, number, field)."""

    def __init__(self, config: NexmarkConfig, numbers: np.ndarray):
        self.seed = np.uint64(_mix(config.seed))
        self.numbers = numbers.astype(np.uint64)

    def bits(self, field: int) -> np.ndarray:
        # splitmix64's finaliser over a distinct counter per (event, field), offset by the seed's own mix
        with np.errstate(over="ignore"):
            z = (self.numbers * np.uint64(64) + np.uint64(field) + self.seed) * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return z ^ (z >> np.uint64(31))

    def below(self, field: int, n) -> np.ndarray:
        """Uniform in [0, n) (Random.nextInt(n) for a scalar n, nextLong(n) for an array of them)."""
        n = np.asarray(n, dtype=np.int64)
        if n.ndim == 0 and n < 2**31:
            return ((self.bits(field) >> np.uint64(32)) * np.uint64(n) >> np.uint64(32)).astype(np.int64)
        return (self.bits(field) % np.maximum(n, 1).astype(np.uint64)).astype(np.int64)

    def unit(self, field: int) -> np.ndarray:
        """Uniform in [0, 1) (Random.nextDouble)."""
        return (self.bits(field) >> np.uint64(11)).astype(np.float64) / 2.0 ** 53


def next_person(config: NexmarkConfig, draws: Draws, numbers: np.ndarray, field: int) -> np.ndarray:
    """A person among the active ones, or a few not yet made (nextBase0PersonId)."""
    people = last_person(numbers) + 1
    active = np.minimum(people, config.num_active_people)
    return people - active + draws.below(field, active + ID_LEAD)


def next_auction(config: NexmarkConfig, draws: Draws, numbers: np.ndarray, field: int) -> np.ndarray:
    """An auction likely still open, or a few not yet made (nextBase0AuctionId)."""
    newest = last_auction(numbers)
    oldest = np.maximum(newest - config.num_in_flight_auctions, 0)
    return oldest + draws.below(field, newest - oldest + 1 + ID_LEAD)


def hot(draws: Draws, ratio: int, field: int, hot_id: np.ndarray, other: np.ndarray) -> np.ndarray:
    """``hot_id`` with probability 1 - 1/ratio, else ``other``."""
    return np.where(draws.below(field, ratio) > 0, hot_id, other)


def price(draws: Draws, field: int) -> np.ndarray:
    """Cents, log-uniform from 1 dollar to a million (PriceGenerator)."""
    return np.round(10.0 ** (draws.unit(field) * 6.0) * 100.0).astype(np.int64)


# ---------------------------------------------------------------------- strings
POOL_BYTES = 1 << 20
LONGEST = 4096  # no string is longer (Nexmark's padding tops out near 1.2 x its 500-byte auction)


def _pool(spaces: bool) -> np.ndarray:
    letters = np.random.default_rng(0x4E584D4B).integers(ord("a"), ord("z") + 1, POOL_BYTES, dtype=np.uint8)
    if spaces:  # Nexmark's words: a space for one character in 13
        letters[np.random.default_rng(13).integers(0, 13, POOL_BYTES) == 0] = ord(" ")
    return letters


LETTERS, WORDS = _pool(False), _pool(True)


def strings(draws: Draws, field: int, lengths: np.ndarray, pool: np.ndarray = LETTERS) -> pa.Array:
    """One string per event, ``lengths`` long, cut from ``pool`` at a place drawn for the event."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if lengths.max(initial=0) > LONGEST:
        raise ValueError(f"a string of {lengths.max()} characters: longer than {LONGEST}")
    # a bound of the batch's own (its longest string) would make an event's string depend on its batch
    starts = draws.below(field, POOL_BYTES - LONGEST)
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    data = pool[np.repeat(starts, lengths) + within]
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(data))


def short_string(draws: Draws, field: int, longest: int, pool: np.ndarray = LETTERS) -> pa.Array:
    """Nexmark's nextString(longest): 3 to longest - 1 characters."""
    return strings(draws, field, 3 + draws.below(field + 1, longest - 3), pool)


def extra(draws: Draws, field: int, sizes: np.ndarray, average: int) -> pa.Array:
    """Padding that brings an event to ``average`` bytes on average (nextExtra): 80 to 120 % of
    what the event's other fields leave."""
    wanted = np.maximum(average - sizes, 0)
    delta = np.round(wanted * 0.2).astype(np.int64)
    spread = np.where(delta > 0, draws.below(field + 1, np.maximum(2 * delta, 1)), 0)
    return strings(draws, field, np.where(sizes > average, 0, wanted - delta + spread))


def _lengths(array: pa.Array) -> np.ndarray:
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=len(array) + 1)
    return np.diff(offsets).astype(np.int64)


def _concat(*parts) -> pa.Array:
    import pyarrow.compute as pc
    return pc.binary_join_element_wise(*parts, "")


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms, pa.timestamp("ms"))


# ---------------------------------------------------------------------- the tables
def persons(config: NexmarkConfig, numbers: np.ndarray) -> pa.Table:
    d = Draws(config, numbers)
    name = _concat(pa.array(FIRST_NAMES[d.below(1, len(FIRST_NAMES))], pa.string()), " ",
                   pa.array(LAST_NAMES[d.below(2, len(LAST_NAMES))], pa.string()))
    email = _concat(strings(d, 3, np.full(len(numbers), 7)), "@", strings(d, 5, np.full(len(numbers), 5)), ".com")
    digits = [pa.array(np.char.zfill(d.below(10 + i, 10_000).astype(str), 4), pa.string()) for i in range(4)]
    card = _concat(digits[0], " ", digits[1], " ", digits[2], " ", digits[3])
    city = pa.array(US_CITIES[d.below(20, len(US_CITIES))], pa.string())
    state = pa.array(US_STATES[d.below(21, len(US_STATES))], pa.string())
    size = 8 + np.sum([_lengths(a) for a in (name, email, card, city, state)], axis=0)
    return pa.table({"id": last_person(numbers) + FIRST_PERSON_ID, "name": name, "emailAddress": email,
                     "creditCard": card, "city": city, "state": state,
                     "dateTime": _timestamps(event_time_ms(config, numbers)),
                     "extra": extra(d, 30, size, config.avg_person_bytes)})


def auctions(config: NexmarkConfig, numbers: np.ndarray) -> pa.Table:
    d = Draws(config, numbers)
    ms = event_time_ms(config, numbers)
    seller = hot(d, config.hot_sellers_ratio, 1, (last_person(numbers) // HOT_BUCKET) * HOT_BUCKET,
                 next_person(config, d, numbers, 2))
    initial = price(d, 3)
    # an auction lasts on average until num_in_flight_auctions more auctions have been made
    ahead = config.num_in_flight_auctions * TOTAL // PROPORTIONS[AUCTION]
    horizon = event_time_ms(config, numbers + ahead) - ms
    length = 1 + d.below(4, np.maximum(horizon * 2, 1))
    item, description = short_string(d, 5, 20, WORDS), short_string(d, 7, 100, WORDS)
    size = 8 + _lengths(item) + _lengths(description) + 40
    return pa.table({"id": last_auction(numbers) + FIRST_AUCTION_ID, "itemName": item, "description": description,
                     "initialBid": initial, "reserve": initial + price(d, 9), "dateTime": _timestamps(ms),
                     "expires": _timestamps(ms + length), "seller": seller + FIRST_PERSON_ID,
                     "category": FIRST_CATEGORY_ID + d.below(10, NUM_CATEGORIES),
                     "extra": extra(d, 11, size, config.avg_auction_bytes)})


def bids(config: NexmarkConfig, numbers: np.ndarray) -> pa.Table:
    d = Draws(config, numbers)
    auction = hot(d, config.hot_auction_ratio, 1, (last_auction(numbers) // HOT_BUCKET) * HOT_BUCKET,
                  next_auction(config, d, numbers, 2))
    # the second person of a bucket, so that hot bidders and hot sellers differ
    bidder = hot(d, config.hot_bidders_ratio, 3, (last_person(numbers) // HOT_BUCKET) * HOT_BUCKET + 1,
                 next_person(config, d, numbers, 4))
    return pa.table({"auction": auction + FIRST_AUCTION_ID, "bidder": bidder + FIRST_PERSON_ID,
                     "price": price(d, 5), "dateTime": _timestamps(event_time_ms(config, numbers)),
                     "extra": extra(d, 6, np.full(len(numbers), 32), config.avg_bid_bytes)})


MAKERS: dict[str, Callable[[NexmarkConfig, np.ndarray], pa.Table]] = {PERSON: persons, AUCTION: auctions, BID: bids}


def rows(table: str, seq: np.ndarray, config: NexmarkConfig = NexmarkConfig()) -> pa.Table:
    """Rows ``seq`` of ``table`` (person, auction or bid)."""
    return MAKERS[table](config, event_numbers(table, seq))


def all_rows(table: str, events: int, config: NexmarkConfig = NexmarkConfig()) -> pa.Table:
    """Every row of ``table`` among the first ``events`` events."""
    return rows(table, np.arange(count(table, events), dtype=np.int64), config)


class NexmarkSource(GeneratorSource, kind="nexmark-source"):
    """params: table (person, auction, bid), count (its rows among the events), the NexmarkConfig
    fields, and the generator's batch_size, split_size and rate (rows/s); splits and positions are
    the generator's, so a restore or a rescale gives every row once."""

    def open(self) -> None:
        super().open()
        self.table: str = self.params["table"]
        self.config = NexmarkConfig.of(self.params)

    def make_rows(self, seq: np.ndarray) -> pa.Table:
        return rows(self.table, seq, self.config)
