"""Operator implementations: each class registers for its kind of cluster.graph.operator_kinds
(``class Filter(Operator, kind="filter")``); importing this package imports them all."""
from cluster.graph.operator_kinds import KINDS

from . import (files, joins, keyed, redis_streams, sinks, sources, spark, stateless,  # noqa: F401 (they register)
               timestamps, window_operator)
from .base import OPERATORS

_missing = sorted(set(KINDS) - set(OPERATORS))
if _missing:
    raise ImportError(f"operator kinds declared in cluster.graph.operator_kinds without an implementation: {_missing}")

__all__ = ["OPERATORS"]
