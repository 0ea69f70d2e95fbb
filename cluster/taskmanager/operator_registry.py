"""Every operator kind's implementation, as a task builds its chain from them.

The implementations register themselves when their modules are imported (``class Filter(Operator,
kind="filter")``); they live in three packages (cluster.operators, cluster.connectors,
cluster.spark), so the one place that imports them all is here, above the three.
"""
from cluster.connectors import files, nexmark, redis_streams, sinks, sources  # noqa: F401 (they register)
from cluster.connectors.kafka import sink as kafka_sink, source as kafka_source  # noqa: F401
from cluster.graph.operator_kinds import KINDS
from cluster.operators import (deduplicate, interval_join, keyed, regular_join, retracting, stateless,  # noqa: F401
                               temporal_join, window_join)
from cluster.operators.base import OPERATORS
from cluster.operators.windowing import timestamps, window_operator  # noqa: F401
from cluster.spark import chain  # noqa: F401

_missing = sorted(set(KINDS) - set(OPERATORS))
if _missing:
    raise ImportError(f"operator kinds declared in cluster.graph.operator_kinds without an implementation: {_missing}")

__all__ = ["OPERATORS"]
