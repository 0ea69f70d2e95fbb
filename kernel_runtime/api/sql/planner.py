"""From Spark's analysed plan of a ``.sql`` query to what streamlab runs: per batch, or a
continuous aggregation (pure: plan.Node in, a plan out; tested without a cluster).

A plan whose nodes only project and filter (and explode, unite) answers each batch on its own:
it stays one Spark step, as before. A ``GROUP BY`` (or a global aggregate, or ``SELECT
DISTINCT``) over such a plan spans batches; it becomes, as Spark's own physical plan splits an
aggregation into partial and final steps:

1. per batch, on Spark: the rows below the aggregation, projected to the grouping keys and the
   aggregates' arguments (``pre``);
2. the keyed aggregate of the DataStream API: partial aggregates per batch inside the same Spark
   plan, merged into keyed state after the exchange by key (count, sum, min, max, avg);
3. per batch over the merged rows, on Spark, when the query's result is not just its keys and
   aggregates: the result expressions with each key and aggregate read from its merged column
   (``final``).

The result is an upsert stream keyed by the grouping keys, as in Flink SQL and Spark's update
mode. Every SQL text here is Spark's own rendering of the analysed expressions (``Expr.sql``).
Anything else that spans batches is refused with the clause, its line and what to write instead.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from cluster.graph.operator_kinds import HIDDEN_KEY_PREFIX as HIDDEN_KEY

from kernel_runtime.api.sql.plan import Expr, Node

PER_BATCH = frozenset({"Project", "Filter", "SubqueryAlias", "View", "LogicalRDD", "LocalRelation",
                       "OneRowRelation", "Generate", "Union", "ResolvedHint", "Sample"})
MERGEABLE = {"Count": "count", "Sum": "sum", "Min": "min", "Max": "max", "Average": "mean"}
WINDOW_STRUCT = "struct<start:timestamp"  # window(), session_window(): a struct of start and end

_REFUSED = {
    "Sort": "a stream has no last row to sort by: sort the collected result (handle.results(...)"
            ".sort_values(...)), or aggregate per window",
    "GlobalLimit": "a stream has no end to count rows from: take .head(n) of the collected result",
    "LocalLimit": "a stream has no end to count rows from: take .head(n) of the collected result",
    "Offset": "a stream has no end to count rows from: take the rows of the collected result",
    "Tail": "a stream has no end to count rows from: take .tail(n) of the collected result",
    "Window": "an analytic function (OVER ...) needs every row of its partition: for a running "
              "aggregate per key use GROUP BY",
    "Join": "joins of streams in .sql are not planned yet: use key_by(...).interval_join(...) or "
            "join(...).window(...) of the DataStream API",
    "Expand": "GROUPING SETS, ROLLUP and CUBE are not planned over a stream yet: write one GROUP BY per grouping",
    "Intersect": "INTERSECT needs both whole inputs: not planned over a stream",
    "Except": "EXCEPT needs both whole inputs: not planned over a stream",
    "Deduplicate": "dropDuplicates over a stream is not planned yet: use SELECT DISTINCT",
}


class UnsupportedQuery(Exception):
    """The query spans batches in a way streamlab does not plan: the clause, its line and why."""

    def __init__(self, query: str, node: Node, why: str):
        clause = node.origin.clause(query)
        where = f"{clause!r} (line {node.origin.line} of the query)" if clause else f"{node.kind} of the query"
        super().__init__(f"{where}: {why}")


@dataclass(frozen=True)
class PerBatch:
    """The query answers each batch on its own: one Spark step, as written."""


@dataclass(frozen=True)
class ContinuousAggregate:
    pre: str                              # per batch: keys and arguments, over the view input
    keys: list[str]                       # the key columns of pre's rows
    aggregations: dict                    # {merged column: [argument column, function]}
    final: Optional[str]                  # per batch over the merged rows (view input), or None
    upsert_key: list[str]                 # the result's key columns (hidden ones: HIDDEN_KEY...)
    grouping: str                         # how the query groups, for the operators' names

    def explain(self) -> str:
        lines = ["per batch, on Spark: the rows below the aggregation, and their partial aggregates",
                 f"  {self.pre}",
                 f"keyed state by {', '.join(self.keys) or '(all rows)'}: " + ", ".join(
                     f"{func}({column})" for column, func in self.aggregations.values()) + " merged across batches"]
        if self.final:
            lines += ["per batch, on Spark: the result over the merged rows", f"  {self.final}"]
        lines.append(f"output: an upsert stream keyed by {', '.join(self.upsert_key)}")
        return "\n".join(lines)


def plan(query: str, root: Node):
    """PerBatch or ContinuousAggregate for the analysed plan ``root`` of ``query``; UnsupportedQuery."""
    if all(n.kind in PER_BATCH for n in root.walk()):
        return PerBatch()
    if root.kind == "Aggregate" and any(g.data_type.startswith(WINDOW_STRUCT) for g in root.grouping):
        raise UnsupportedQuery(query, root, "GROUP BY window(...) in .sql is not planned yet: use "
                               "key_by(...).window(TumblingEventTimeWindows.of(...)).aggregate(...)")
    if root.kind == "Aggregate" and _per_batch(root.children[0]):
        return _aggregate(query, root, list(root.grouping), list(root.aggregates),
                          _from_item(query, root.children[0]))
    if root.kind == "Distinct" and _per_batch(root.children[0]):
        child = root.children[0]
        columns = [Expr("AttributeReference", quoted(c.name), c.name, (), c.data_type) for c in child.output]
        # the selected rows as a subquery of their own: its columns resolve by name alone
        return _aggregate(query, root, columns, columns, f"({_query(query, child)}) AS `__sql_rows`")
    raise UnsupportedQuery(query, _first_spanning(root), _why(root))


def _per_batch(node: Node) -> bool:
    return all(n.kind in PER_BATCH for n in node.walk())


def _first_spanning(root: Node) -> Node:
    """The node to name: the first that spans batches, or over an aggregation the clause that
    works on its result (HAVING's filter, an outer query's projection)."""
    parent = None
    for node in root.walk():
        if node.kind not in PER_BATCH:
            if node.kind in ("Aggregate", "Distinct") and parent is not None and parent.origin.start is not None:
                return parent
            return node
        parent = node
    raise ValueError("the plan has no node that spans batches")


def _why(root: Node) -> str:
    node = _first_spanning(root)
    if node.kind in _REFUSED:
        return _REFUSED[node.kind]
    if node.kind in PER_BATCH or node.kind in ("Aggregate", "Distinct"):
        return ("the query works on the running result of an aggregation (HAVING, or a query over a "
                "grouped subquery): its rows change as batches come, which needs retractions, not planned "
                "yet; filter the collected result instead")
    return f"{node.kind} spans batches and is not planned over a stream yet"


# ------------------------------------------------------------------ the aggregation
def _aggregate(query: str, node: Node, grouping: list[Expr], results: list[Expr],
               rows: str) -> ContinuousAggregate:
    """``rows``: the FROM item of the rows below the aggregation, their columns named as
    ``grouping`` and the aggregates' arguments name them."""
    keys: list[str] = []
    for i, g in enumerate(grouping):
        plain = g.kind == "AttributeReference" and g.name not in keys and not g.name.startswith("__")
        keys.append(g.name if plain else f"{HIDDEN_KEY}{i}")
    calls: dict[str, Expr] = {}  # each distinct aggregate call, by its SQL
    for r in results:
        for e in r.walk():
            if e.kind == "AggregateExpression":
                calls.setdefault(e.sql, e)
    aggregations: dict = {}
    arguments: list[str] = []
    names = {}
    for j, (text, call) in enumerate(calls.items()):
        function = call.children[0]
        if call.distinct or call.filtered or function.kind not in MERGEABLE or len(function.children) != 1:
            raise UnsupportedQuery(query, node, f"{text} is not merged across batches yet: the aggregates "
                                   "planned over a stream are count, sum, min, max and avg (without DISTINCT or FILTER)")
        arguments.append(f"{function.children[0].sql} AS `__sql_arg{j}`")
        names[text] = f"__sql_agg{j}"
        aggregations[names[text]] = [f"__sql_arg{j}", MERGEABLE[function.kind]]
    if not aggregations:  # SELECT DISTINCT, GROUP BY without aggregates: a key's rows, counted
        aggregations["__sql_rows"] = ["__sql_arg", "count"]
        arguments.append("1 AS `__sql_arg`")
    pre_columns = [f"{g.sql} AS {quoted(k)}" for g, k in zip(grouping, keys)] or [f"0 AS `{HIDDEN_KEY}0`"]
    if not keys:
        keys = [f"{HIDDEN_KEY}0"]
    pre = f"SELECT {', '.join(pre_columns + arguments)} FROM {rows}"
    renamed = _direct(keys, results, names, aggregations)
    if renamed is not None:  # the result is the merged rows as they are: no final step
        aggregations, final, upsert_key = renamed, None, list(keys)
    else:
        final, upsert_key = _result(grouping, keys, results, names)
    group_text = node.origin.clause(query) if node.kind == "Aggregate" else "DISTINCT"
    return ContinuousAggregate(pre, keys, aggregations, final, upsert_key, group_text or "GROUP BY")


def _direct(keys: list[str], results: list[Expr], names: dict, aggregations: dict) -> Optional[dict]:
    """The aggregations named as the query names its result, if the result is the keys (as
    selected, in order) then one aggregate call each, as the keyed aggregate emits them."""
    head, tail = results[:len(keys)], results[len(keys):]
    if [r.name for r in head if r.kind == "AttributeReference"] != keys or len(tail) != len(aggregations):
        return None
    if any(r.kind != "Alias" or r.children[0].kind != "AggregateExpression" for r in tail):
        return None
    out = [r.name for r in tail]
    if len(set(out) | set(keys)) != len(out) + len(keys) or any(n.startswith("__") for n in out):
        return None
    calls = [names[r.children[0].sql] for r in tail]
    if len(set(calls)) != len(calls):
        return None
    return {name: aggregations[call] for name, call in zip(out, calls)}


def _result(grouping: list[Expr], keys: list[str], results: list[Expr],
            names: dict) -> tuple[str, list[str]]:
    """The final step's SQL over the merged rows and the result's key."""
    replacements = {g.sql: quoted(k) for g, k in zip(grouping, keys)}
    replacements.update({text: quoted(name) for text, name in names.items()})
    columns, visible = [], {}
    for r in results:
        body = r.children[0] if r.kind == "Alias" else r
        text = _replace(body.sql, replacements)
        columns.append(f"{text} AS {quoted(r.name or body.sql)}")
        for g, k in zip(grouping, keys):
            if body.sql == g.sql and k not in visible:
                visible[k] = r.name
    hidden = {k: k if k.startswith(HIDDEN_KEY) else f"{HIDDEN_KEY}{i}" for i, k in enumerate(keys) if k not in visible}
    upsert_key = [visible[k] if k in visible else hidden[k] for k in keys]
    columns += [f"{quoted(k)} AS {quoted(name)}" for k, name in hidden.items()]
    return f"SELECT {', '.join(columns)} FROM input", upsert_key


def _replace(text: str, replacements: dict[str, str]) -> str:
    """Spark's SQL of an expression with each sub-expression's text put by its column."""
    if not replacements:
        return text
    alternatives = "|".join(re.escape(t) for t in sorted(replacements, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w`.])(?:{alternatives})(?![\w`])")
    return pattern.sub(lambda m: replacements[m.group(0)], text)


# ------------------------------------------------------------------ the rows below it, as SQL
def _query(query: str, node: Node) -> str:
    if node.kind == "SubqueryAlias" and node.children[0].kind == "View":
        return f"SELECT * FROM {quoted(node.alias or 'input')}"
    child = node.children[0] if node.children else None
    if node.kind == "SubqueryAlias" and child is not None:
        return f"SELECT * FROM ({_query(query, child)}) AS {quoted(node.alias or '')}"
    if node.kind == "Filter" and child is not None:
        return f"SELECT * FROM {_from_item(query, child)} WHERE {node.expressions[0].sql}"
    if node.kind == "Project" and child is not None:
        return f"SELECT {', '.join(e.sql for e in node.expressions)} FROM {_from_item(query, child)}"
    raise UnsupportedQuery(query, node, f"{node.kind} below an aggregation is not planned over a stream yet: "
                           "do it in a .sql step of its own before the aggregating one")


def _from_item(query: str, node: Node) -> str:
    """``node``'s rows as a FROM item whose columns resolve as the expressions above name them."""
    if node.kind == "SubqueryAlias" and node.children[0].kind == "View":
        return quoted(node.alias or "input")
    qualifiers = {c.qualifier for c in node.output}
    if len(qualifiers) != 1 or len(next(iter(qualifiers))) > 1:
        raise UnsupportedQuery(query, node, "the columns below the aggregation come from several relations: "
                               "not planned over a stream yet")
    (qualifier,) = qualifiers
    return f"({_query(query, node)}) AS {quoted(qualifier[0] if qualifier else '__sql_rows')}"


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def quoted_if_needed(name: str) -> str:
    """As Spark's quoteIfNeeded renders a name part in an expression's SQL."""
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", name) else quoted(name)
