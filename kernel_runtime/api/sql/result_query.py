"""A query over an aggregation's running result: ``HAVING``, and a ``WHERE`` or select list over
a grouped subquery (pure: plan.Node in, a plan out; tested without a cluster).

The aggregation is planned as any (planner.plan). What the query does with its rows, projections
and filters, runs per batch over each merged row, in the aggregation's own result step. A running
row that no longer passes a filter (``HAVING sum(v) < 10`` once the sum grows) must leave the
result, as Flink SQL's filter over an updating aggregate takes its row back: the step keeps each
row and marks whether it passes (the column ROW_KIND: ``+U`` or ``-D``), and the result's
consumers apply a ``-D`` by deleting the key's row. Over a time window the aggregate's rows are
final, so a filter just drops rows, as Spark's append mode does.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from cluster.graph.operator_kinds import HIDDEN_KEY_PREFIX as HIDDEN_KEY, ROW_KIND_COLUMN
from cluster.graph.schema import quoted

from kernel_runtime.api.sql.plan import Node, WindowCall
from kernel_runtime.api.sql.planner import PER_BATCH, ContinuousAggregate, UnsupportedQuery, plan

_OVER = ("Project", "Filter", "SubqueryAlias")  # what a query may do with the aggregation's rows
KEEP = "__sql_keep"


def aggregation_below(root: Node) -> Optional[Node]:
    """The aggregation a query works on the result of, if every node above it only projects and
    filters and every node below it is per batch (or a time window's projection)."""
    node = root
    above = 0
    while node.kind in _OVER and len(node.children) == 1:
        node, above = node.children[0], above + 1
    if above == 0 or node.kind not in ("Aggregate", "Distinct"):
        return None
    below = [n for n in node.walk()][1:]
    if any(n.kind not in PER_BATCH and n.kind != "Expand" for n in below):
        return None
    return node


def plan_over_aggregate(query: str, root: Node, aggregation: Node, windows: Sequence[WindowCall]) -> ContinuousAggregate:
    """The aggregation's plan with the query's projections and filters over its rows in its
    result step; UnsupportedQuery."""
    inner = plan(query, aggregation, windows)
    if not isinstance(inner, ContinuousAggregate):
        raise UnsupportedQuery(query, aggregation, f"{aggregation.kind} below the query is not planned over a stream")
    above = []
    node = root
    while node is not aggregation:
        above.append(node)
        node = node.children[0]
    updating = inner.window is None  # a window's rows are final: a filter drops them
    projects = [n for n in above if n.kind == "Project"]
    # a key column every projection passes on as it is keys the result as it shows it; any other
    # is carried along hidden
    shown = {k for k in inner.upsert_key if not k.startswith(HIDDEN_KEY) and all(
        any(e.kind == "AttributeReference" and e.name == k for e in n.expressions) for n in projects)}
    hidden = {k: f"{HIDDEN_KEY}_r{i}" for i, k in enumerate(inner.upsert_key) if k not in shown}
    keys = list(hidden.values())
    alias = _qualifier(aggregation)
    rows = f"({inner.final}) AS {quoted(alias)}" if inner.final else f"input AS {quoted(alias)}"
    start = [f"{quoted(k)} AS {quoted(h)}" for k, h in hidden.items()] + (["true AS " + KEEP] if updating else [])
    sql = f"SELECT {', '.join(['*'] + start)} FROM {rows}"
    for node in projects:
        names = [c.name for c in node.output]
        if len(set(names)) != len(names) or any(n.startswith("__sql") for n in names):
            raise UnsupportedQuery(query, node, f"the query's result names columns alike ({names}): name each once")
    sql, _ = rows_above(above, sql, alias, [quoted(k) for k in keys], KEEP if updating else None)
    top = [quoted(c.name) for c in root.output] + [quoted(k) for k in keys]
    if updating:
        top.append(f"CASE WHEN {KEEP} THEN '+U' ELSE '-D' END AS {quoted(ROW_KIND_COLUMN)}")
    final = f"SELECT {', '.join(top)} FROM ({sql}) AS `__sql_result`"
    upsert_key = [hidden.get(k, k) for k in inner.upsert_key]
    return dataclasses.replace(inner, final=final, upsert_key=upsert_key, rowtime=None, deletes=updating)


def rows_above(nodes: Sequence[Node], sql: str, alias: str, carried: Sequence[str],
               keep: Optional[str] = None) -> tuple[str, str]:
    """The SQL of ``nodes`` (projections, filters and subquery aliases, the top first) over the
    rows of ``sql`` named ``alias``, and the name of its rows. Each projection passes the
    ``carried`` columns on; a filter drops the rows that fail it, or with ``keep`` ANDs whether
    they pass into that column instead."""
    for node in reversed(nodes):
        if node.kind == "SubqueryAlias":
            alias = node.alias or alias
            sql = f"SELECT * FROM ({sql}) AS {quoted(alias)}"
        elif node.kind == "Filter" and keep is None:
            sql = f"SELECT * FROM ({sql}) AS {quoted(alias)} WHERE {node.expressions[0].sql}"
        elif node.kind == "Filter":
            columns = [quoted(c.name) for c in node.output] + list(carried)
            sql = (f"SELECT {', '.join(columns)}, {keep} AND coalesce({node.expressions[0].sql}, false) AS {keep} "
                   f"FROM ({sql}) AS {quoted(alias)}")
        else:
            listed = [e.sql for e in node.expressions] + list(carried) + ([keep] if keep else [])
            sql = f"SELECT {', '.join(listed)} FROM ({sql}) AS {quoted(alias)}"
    return sql, alias


def _qualifier(aggregation: Node) -> str:
    """The name the query's expressions above give the aggregation's rows (``input``, ``o``)."""
    return next((c.qualifier[-1] for c in aggregation.output if c.qualifier), "input")
