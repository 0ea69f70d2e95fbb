"""Spark's analysed logical plan as plain data: what the planner reads of it.

``analysis`` makes these from Catalyst's objects; the planner (pure, tested without Spark's
internals) reads only these. Expressions keep Spark's own SQL text of themselves (``sql``), which
is what the planner writes its per-batch steps with: no SQL is parsed or printed here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class Origin:
    """Where in the query text a plan node came from (Spark's parser records it)."""

    line: Optional[int] = None
    start: Optional[int] = None   # index of the clause's first character in the query
    stop: Optional[int] = None    # index of its last character

    def clause(self, query: str, limit: int = 60) -> str:
        if self.start is None or self.stop is None:
            return ""
        text = " ".join(query[self.start:self.stop + 1].split())
        return text if len(text) <= limit else text[:limit - 3] + "..."


class _Tree:
    """A node of a tree whose ``children`` are of its own kind."""

    children: tuple

    def walk(self):
        """This node, then every node under it, depth first."""
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(frozen=True)
class Expr(_Tree):
    kind: str                          # Catalyst's class name: AttributeReference, Alias, Count, ...
    sql: str                           # Spark's SQL text of it
    name: str = ""                     # a named expression's name (column, alias)
    qualifier: tuple[str, ...] = ()    # an attribute's relation name(s)
    data_type: str = ""                # Spark's simple type name
    children: tuple["Expr", ...] = ()
    distinct: bool = False             # an AggregateExpression's DISTINCT
    filtered: bool = False             # an AggregateExpression's FILTER (WHERE ...)
    ignore_nulls: bool = False         # first(v, true), last(v, true): Spark's SQL of them leaves it out


@dataclass(frozen=True)
class Column:
    name: str
    qualifier: tuple[str, ...]
    data_type: str


@dataclass(frozen=True)
class Node(_Tree):
    kind: str                                   # Catalyst's node name: Project, Filter, Aggregate, ...
    children: tuple["Node", ...] = ()
    output: tuple[Column, ...] = ()
    origin: Origin = field(default_factory=Origin)
    alias: Optional[str] = None                 # a SubqueryAlias's name
    expressions: tuple[Expr, ...] = ()          # Project: its list; Filter: its condition; Window: its functions
    grouping: tuple[Expr, ...] = ()             # Aggregate; Window: its PARTITION BY
    order: tuple[Expr, ...] = ()                # Window: its ORDER BY (SortOrder expressions)
    aggregates: tuple[Expr, ...] = ()           # Aggregate: its result expressions
    join_type: str = ""                         # Join: INNER, LEFT OUTER, ... (its condition: expressions)


@dataclass(frozen=True)
class WindowCall:
    """A ``window(...)`` or ``session_window(...)`` call as the query writes it (from Spark's
    parsed plan: the analysed one has it rewritten into arithmetic)."""

    function: str                    # window | session_window
    time_column: str                 # the column it reads
    durations_ms: tuple[int, ...]    # window: size[, slide[, start]]; session_window: gap
