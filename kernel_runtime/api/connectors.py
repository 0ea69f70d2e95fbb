"""Source and sink connectors: what ``env.from_source(...)`` and ``stream.sink_to(...)`` take.

A connector is a description (an operator kind of cluster.graph.job_graph.OPERATOR_KINDS, its
parameters, an optional function); the TaskManagers' operators (cluster/operators/) do the work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class Connector:
    kind: str
    name: str
    params: dict = field(default_factory=dict)
    fn: Optional[Callable] = None
