"""The operator vocabulary: every kind of operator a JobGraph may name, declared once.

Each kind says what it is (its role in a chain, whether it is keyed, keeps state in checkpoints,
runs on Spark, emits an upsert stream) and what a client can know of its output before the job
runs. Every part reads these properties instead of listing kind names: the JobGraph validates
roles, the client's API and its schema sampling (kernel_runtime.api) follow ``role`` and
``output``, the collected results follow ``upsert``, and the TaskManager runs each kind with the
class registered for it in cluster.operators. Adding a kind is one entry here and its class there.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional


class Role(Enum):
    SOURCE = "source"        # starts a chain and has no input
    TRANSFORM = "transform"
    SINK = "sink"            # ends a chain and has no output


class Output(Enum):
    """What a client can know of an operator's output schema from a few sample rows."""

    SEQUENCE = "sequence"    # the generator: its function of the sequence numbers, or the numbers ("seq")
    DECLARED = "declared"    # a connector's params["schema"] when given (no rows), else unknown
    FUNCTION = "function"    # whatever the user's function returns for the input sample
    INPUT = "input"          # the input's columns (rows dropped, none changed)
    KEY_COUNT = "key-count"  # the key columns and "count"
    ROWTIME = "rowtime"      # the input's columns, and params["column"] computed by a timestamp assigner
    UNKNOWN = "unknown"      # known only when it runs (Spark, connectors, keyed state), or no output


def _ends(params: dict) -> bool:
    return True


def _counted(params: dict) -> bool:
    """A generator with a count of rows; without one it runs until cancelled."""
    return params.get("count") is not None


def _unwatched(params: dict) -> bool:
    """Files read once; watching a folder for new ones never ends."""
    return not params.get("watch")


def _bounded_stream(params: dict) -> bool:
    """A Redis stream read up to its last entry at the start, or up to a count of entries."""
    return bool(params.get("bounded")) or params.get("count") is not None


def _bounded(params: dict) -> bool:
    """A Kafka source that stops at the offsets that were the latest when it started."""
    return bool(params.get("bounded"))


@dataclass(frozen=True)
class OperatorKind:
    name: str
    role: Role
    output: Output = Output.UNKNOWN
    keyed: bool = False     # its input is partitioned by params["key"] and its state by key group
    stateful: bool = False  # restores something from a checkpoint (a position, keyed state, pending files)
    spark: bool = False     # runs on the TaskManager's SparkSession; consecutive ones fuse into one plan
    upsert: bool = False    # emits, per batch, the new value of every key it touched
    two_inputs: bool = False  # a join: params["left_inputs"] of its input edges are its left side
    # a source: whether one with these params ends; its operator and the client's views (which
    # have the job graph's params and no operator) both ask this (source_ends)
    ends: Callable[[dict], bool] = _ends

    @property
    def is_source(self) -> bool:
        return self.role is Role.SOURCE

    @property
    def is_sink(self) -> bool:
        return self.role is Role.SINK


_SOURCE, _TRANSFORM, _SINK = Role.SOURCE, Role.TRANSFORM, Role.SINK


def declare(kinds: list[OperatorKind]) -> dict[str, OperatorKind]:
    declared: dict[str, OperatorKind] = {}
    for kind in kinds:
        if kind.name in declared:
            raise ValueError(f"operator kind {kind.name!r} is declared twice")
        declared[kind.name] = kind
    return declared


KINDS: dict[str, OperatorKind] = declare([
    OperatorKind("generator-source", _SOURCE, Output.SEQUENCE, stateful=True, ends=_counted),
    # the generator with planned failures at chosen rows and attempts (cluster.connectors.sources)
    OperatorKind("testing-source", _SOURCE, Output.SEQUENCE, stateful=True, ends=_counted),
    # Nexmark's persons, auctions or bids (cluster.connectors.nexmark): the generator's splits, declared columns
    OperatorKind("nexmark-source", _SOURCE, Output.DECLARED, stateful=True, ends=_counted),
    OperatorKind("file-source", _SOURCE, Output.DECLARED, stateful=True, ends=_unwatched),
    OperatorKind("redis-stream-source", _SOURCE, Output.DECLARED, stateful=True, ends=_bounded_stream),
    OperatorKind("kafka-source", _SOURCE, Output.DECLARED, stateful=True, ends=_bounded),
    OperatorKind("map-batches", _TRANSFORM, Output.FUNCTION),
    OperatorKind("filter", _TRANSFORM, Output.INPUT),
    OperatorKind("spark", _TRANSFORM, spark=True),
    OperatorKind("local-aggregate", _TRANSFORM),  # partial aggregates before the exchange, no state
    OperatorKind("keyed-count", _TRANSFORM, Output.KEY_COUNT, keyed=True, stateful=True, upsert=True),
    OperatorKind("keyed-aggregate", _TRANSFORM, keyed=True, stateful=True, upsert=True),
    OperatorKind("keyed-reduce", _TRANSFORM, keyed=True, stateful=True, upsert=True),
    # an aggregation over another's running rows, taking back each old row (cluster.operators.retracting)
    OperatorKind("keyed-changelog-aggregate", _TRANSFORM, keyed=True, stateful=True, upsert=True),
    # one row kept per key: the first by an order, or by arrival (cluster.operators.deduplicate)
    OperatorKind("keyed-deduplicate", _TRANSFORM, Output.INPUT, keyed=True, stateful=True, upsert=True),
    # a process function emits whatever it likes, so its output is no upsert stream
    OperatorKind("keyed-process", _TRANSFORM, keyed=True, stateful=True),
    # event time (../shared/design/ARCHITECTURE.md section 9)
    OperatorKind("timestamps-watermarks", _TRANSFORM, Output.ROWTIME, stateful=True),
    # a window's row is its key and window: params["upsert_key"] = key + window_start, window_end
    OperatorKind("window", _TRANSFORM, keyed=True, stateful=True, upsert=True),
    OperatorKind("window-partial", _TRANSFORM),  # partial aggregates per key and window, no state
    # joins of two keyed inputs (params key / right_key): rows wait in keyed state for the other side
    OperatorKind("interval-join", _TRANSFORM, keyed=True, stateful=True, two_inputs=True),
    OperatorKind("window-join", _TRANSFORM, keyed=True, stateful=True, two_inputs=True),
    OperatorKind("temporal-join", _TRANSFORM, keyed=True, stateful=True, two_inputs=True),
    OperatorKind("regular-join", _TRANSFORM, keyed=True, stateful=True, two_inputs=True),
    OperatorKind("collect-sink", _SINK),
    OperatorKind("print-sink", _SINK),
    OperatorKind("file-sink", _SINK, stateful=True),
    OperatorKind("redis-stream-sink", _SINK),
    OperatorKind("discarding-sink", _SINK),
    # exactly-once: the records since the last barrier are written ahead into the checkpoint
    OperatorKind("kafka-sink", _SINK, stateful=True),
])


# the columns of a continuous SQL aggregation's key that its query does not select: they key the
# upsert stream and are not shown (kernel_runtime.client.results)
HIDDEN_KEY_PREFIX = "__sql_key"
# an upsert stream whose keys can also be deleted (a HAVING over a running aggregate) marks each
# row in this column: '+U' upserts its key's row, '-D' deletes it (Flink's RowKind, as a column)
ROW_KIND_COLUMN = "__sql_op"


def upsert_key(kind: str, params: dict) -> Optional[list[str]]:
    """The columns an upsert operator's rows are keyed by (None for any other operator)."""
    if not KINDS[kind].upsert and not (KINDS[kind].spark and params.get("upsert_key")):
        return None  # a Spark step over an upsert stream that keeps its key says so (the SQL planner)
    key = params.get("upsert_key", params.get("key"))
    return list(key) if key else None


def source_ends(kind: str, params: dict) -> bool:
    """Whether a source of this kind with these params ends (False for a kind that is no source)."""
    declared = operator_kind(kind)
    return declared.is_source and declared.ends(params)


def operator_kind(name: object) -> OperatorKind:
    """The kind called ``name``; a KeyError naming the known kinds otherwise."""
    try:
        return KINDS[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise KeyError(f"unknown operator kind {name!r} (known: {', '.join(KINDS)})") from None
