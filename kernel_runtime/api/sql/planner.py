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
from typing import Optional, Sequence

from cluster.graph.aggregations import WINDOW_AGGREGATE_FUNCTIONS
from cluster.graph.operator_kinds import HIDDEN_KEY_PREFIX as HIDDEN_KEY
from cluster.graph.schema import quoted

from kernel_runtime.api.sql.plan import Expr, Node, WindowCall
from kernel_runtime.api.sql.refusals import REFUSED

PER_BATCH = frozenset({"Project", "Filter", "SubqueryAlias", "View", "LogicalRDD", "LocalRelation",
                       "OneRowRelation", "Generate", "Union", "ResolvedHint", "Sample"})
# a per-batch query over a named view made of only these is written back over ``input``, which
# the TaskManager's Arrow path can run (not under a CTE, which it cannot); a view's relation is a
# LocalRelation since the planner makes its views by the JVM's createDataFrame (a VALUES leaf of
# the query is one too, and the write-back refuses it: the query then keeps its CTE)
WRITTEN_BACK = frozenset({"Project", "Filter", "SubqueryAlias", "View", "LogicalRDD", "LocalRelation"})
# a subquery in an expression (IN, EXISTS, a scalar one) has a plan of its own that Spark's SQL text
# of the expression leaves out (listquery()): such a query keeps its CTE
SUBQUERY = ("Query", "Subquery", "Exists")
# Spark's aggregate functions merged across batches (cluster.graph.aggregations): by Catalyst's
# class, without and with DISTINCT (min and max of the distinct values are theirs of all)
MERGEABLE = {"Count": "count", "Sum": "sum", "Min": "min", "Max": "max", "Average": "mean",
             "StddevSamp": "std", "StddevPop": "std_pop", "VarianceSamp": "var", "VariancePop": "var_pop",
             "CollectList": "collect_list", "CollectSet": "collect_set", "First": "first_row", "Last": "last_row",
             "AnyValue": "first_row"}
MERGEABLE_DISTINCT = {"Count": "nunique", "Sum": "sum_distinct", "Average": "mean_distinct", "Min": "min",
                      "Max": "max", "CollectSet": "collect_set"}
IGNORING_NULLS = {"first_row": "first", "last_row": "last"}  # first(v, true): the first non-null value
WINDOW_STRUCT = "struct<start:timestamp"  # window(), session_window(): a struct of start and end


def _is_window(data_type: str) -> bool:
    return data_type.startswith(WINDOW_STRUCT)



class UnsupportedQuery(Exception):
    """The query spans batches in a way streamlab does not plan: the clause, its line and why."""

    def __init__(self, query: str, node: Node, why: str):
        clause = node.origin.clause(query)
        where = f"{clause!r} (line {node.origin.line} of the query)" if clause else f"{node.kind} of the query"
        super().__init__(f"{where}: {why}")


@dataclass(frozen=True)
class PerBatch:
    """The query answers each batch on its own: one Spark step, as written."""

    def explain(self) -> str:
        return "per batch, on Spark: the query over each batch on its own (it only projects and filters)"


@dataclass(frozen=True)
class ContinuousAggregate:
    pre: str                              # per batch: keys and arguments, over the view input
    keys: list[str]                       # the key columns of pre's rows
    aggregations: dict                    # {merged column: [argument column, function]}
    final: Optional[str]                  # per batch over the merged rows (view input), or None
    upsert_key: list[str]                 # the result's key columns (hidden ones: HIDDEN_KEY...)
    grouping: str                         # how the query groups, for the operators' names
    window: Optional["EventTimeWindow"] = None  # GROUP BY window(...): windows per key, not a running value
    # the result's column holding its window's end, if selected: the event time of the window's row
    # (a later join or window reads the result by it, as Flink's window_end after a window TVF)
    rowtime: Optional[str] = None
    # a query's filter over the running rows: a row that stops passing deletes its key (result_query)
    deletes: bool = False

    def explain(self) -> str:
        state = f"keyed state by {', '.join(self.keys) or '(all rows)'}"
        if self.window is not None:
            state += f" and {self.window.describe()} on the watermark of {self.window.time_column}"
        lines = ["per batch, on Spark: the rows below the aggregation, and their partial aggregates",
                 f"  {self.pre}",
                 f"{state}: " + ", ".join(f"{func}({column})" for column, func in self.aggregations.values())
                 + " merged across batches"]
        if self.final:
            lines += ["per batch, on Spark: the result over the merged rows", f"  {self.final}"]
        if self.window is not None:
            lines.append(f"output: a row per key and window when the watermark passes its end (append), "
                         f"keyed by {', '.join(self.upsert_key)}")
        else:
            lines.append(f"output: an upsert stream keyed by {', '.join(self.upsert_key)}"
                         + (", a key deleted when its row leaves the result (marked -D)" if self.deletes else ""))
        return "\n".join(lines)


@dataclass(frozen=True)
class EventTimeWindow:
    """The window of a ``GROUP BY window(...)``/``session_window(...)``, in the DataStream API's terms."""

    kind: str            # tumbling | sliding | session
    time_column: str     # the rows' event-time column the call reads
    size_ms: int = 0
    slide_ms: int = 0
    offset_ms: int = 0
    gap_ms: int = 0
    # GROUP BY the input's event-time column itself (a window's end, after a window): a group per
    # instant, final once the watermark passes it (Flink's window aggregate after a window TVF)
    instant: bool = False

    def describe(self) -> str:
        if self.instant:
            return f"each instant of {self.time_column}"
        if self.kind == "session":
            return f"session windows (gap {self.gap_ms} ms)"
        if self.kind == "sliding":
            return f"sliding windows ({self.size_ms} ms every {self.slide_ms} ms)"
        return f"tumbling windows ({self.size_ms} ms)"


WINDOW_START, WINDOW_END = "window_start", "window_end"  # the window operator's columns


def plan(query: str, root: Node, windows: Sequence[WindowCall] = (), carry: Sequence[str] = (),
         rowtime: Optional[str] = None):
    """PerBatch or ContinuousAggregate for the analysed plan ``root`` of ``query`` (``windows``:
    its window calls as written; ``carry``: columns the merged rows have beside the keys and
    aggregates, which the result step passes on; ``rowtime``: the input's event-time column);
    UnsupportedQuery."""
    if all(n.kind in PER_BATCH for n in root.walk()):
        return PerBatch()
    if root.kind == "Aggregate" and any(_is_window(g.data_type) for g in root.grouping):
        return _windowed(query, root, windows, carry)
    instant = next((g for g in root.grouping if g.kind == "AttributeReference" and rowtime is not None
                    and g.name.lower() == rowtime.lower()), None) if root.kind == "Aggregate" else None
    if instant is not None and _per_batch(root.children[0]):
        spec = EventTimeWindow("tumbling", instant.name, size_ms=1, instant=True)
        return _aggregate(query, root, [g for g in root.grouping if g is not instant], list(root.aggregates),
                          _from_item(query, root.children[0]), window=(spec, instant.sql, instant.sql,
                                                                       quoted(WINDOW_START)), carry=carry)
    if root.kind == "Aggregate" and _per_batch(root.children[0]):
        return _aggregate(query, root, list(root.grouping), list(root.aggregates),
                          _from_item(query, root.children[0]), carry=carry)
    if root.kind == "Distinct" and _per_batch(root.children[0]):
        child = root.children[0]
        columns = [Expr("AttributeReference", quoted(c.name), c.name, (), c.data_type) for c in child.output]
        # the selected rows as a subquery of their own: its columns resolve by name alone
        return _aggregate(query, root, columns, columns, f"({_query(query, child)}) AS `__sql_rows`", carry=carry)
    raise _refusal(query, root)


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


def _refusal(query: str, root: Node) -> UnsupportedQuery:
    """Why the plan under ``root`` is not planned over a stream, at the clause to name."""
    join = next((n for n in root.walk() if n.kind == "Join"), None)
    node = join or _first_spanning(root)
    if node.kind in REFUSED:
        why = REFUSED[node.kind]
    elif node.kind in PER_BATCH or node.kind in ("Aggregate", "Distinct"):
        why = ("the query works on the running result of an aggregation (HAVING, or a query over a "
               "grouped subquery): its rows change as batches come, which needs retractions, not planned "
               "yet; filter the collected result instead")
    else:
        why = f"{node.kind} spans batches and is not planned over a stream yet"
    return UnsupportedQuery(query, node, why)


def _windowed(query: str, root: Node, calls: Sequence[WindowCall], carry: Sequence[str] = ()) -> ContinuousAggregate:
    """GROUP BY window(ts, ...)[, keys]: Spark's analysed plan computes the window struct in a
    projection (an expansion for sliding windows) over the rows; the rows below it go to the
    DataStream API's event-time window, and the struct is made back from its start and end."""
    windows = [g for g in root.grouping if _is_window(g.data_type)]
    calls = list(dict.fromkeys(calls))  # the same call in the select list and in GROUP BY is one window
    if len(windows) != 1 or len(calls) != 1:
        raise UnsupportedQuery(query, root, "one time window per query: GROUP BY window(ts, '1 minute') "
                               "or session_window(ts, '5 minutes'), once")
    call = calls[0]
    rows = root.children[0]
    while any(_is_window(c.data_type) for c in rows.output):
        if rows.kind not in ("Filter", "Project", "Expand") or not rows.children:
            raise UnsupportedQuery(query, root, f"{rows.kind} around a time window is not planned over a stream yet")
        rows = rows.children[0]
    if not _per_batch(rows):
        raise _refusal(query, rows)
    times = [c for c in rows.output if c.name.lower() == call.time_column.lower()]
    if len(times) != 1:
        raise UnsupportedQuery(query, root, f"the window's time column {call.time_column!r} is not one column "
                               "of the rows below it")
    spec = _window_spec(call, times[0].name)
    time_sql = ".".join(quoted_if_needed(p) for p in (*times[0].qualifier, times[0].name))
    window = windows[0]
    grouping = [g for g in root.grouping if g is not window]
    # the window operator's start and end are of the time column's type, a timestamp (Spark's window takes no other)
    struct = f"named_struct('start', {quoted(WINDOW_START)}, 'end', {quoted(WINDOW_END)})"
    return _aggregate(query, root, grouping, list(root.aggregates), _from_item(query, rows),
                      window=(spec, time_sql, window.sql, struct), carry=carry)


def _window_spec(call: WindowCall, time_column: str) -> EventTimeWindow:
    durations = call.durations_ms
    if call.function == "session_window":
        return EventTimeWindow("session", time_column, gap_ms=durations[0])
    size = durations[0]
    slide = durations[1] if len(durations) > 1 else size
    offset = durations[2] if len(durations) > 2 else 0
    if slide == size:
        return EventTimeWindow("tumbling", time_column, size_ms=size, offset_ms=offset)
    return EventTimeWindow("sliding", time_column, size_ms=size, slide_ms=slide, offset_ms=offset)


# ------------------------------------------------------------------ the aggregation
def _aggregate(query: str, node: Node, grouping: list[Expr], results: list[Expr], rows: str,
               window: Optional[tuple[EventTimeWindow, str, str, str]] = None, carry: Sequence[str] = (),
               carry_in: Sequence[str] = ()) -> ContinuousAggregate:
    """``rows``: the FROM item of the rows below the aggregation, their columns named as
    ``grouping`` and the aggregates' arguments name them. ``window``: its spec, the SQL of the
    time column below, the SQL of the window attribute above, and the SQL making it back.
    ``carry``: columns of the merged rows the result step passes on; ``carry_in``: columns of
    the rows below that the rows to aggregate keep (a changelog's row kind)."""
    keys: list[str] = []
    for i, g in enumerate(grouping):
        plain = g.kind == "AttributeReference" and g.name not in keys and not g.name.startswith("__")
        keys.append(g.name if plain else f"{HIDDEN_KEY}{i}")
    calls: dict[str, Expr] = {}  # each distinct aggregate call, by its SQL
    for r in results:
        for e in r.walk():
            if e.kind == "AggregateExpression" and calls.setdefault(e.sql, e) != e:
                raise UnsupportedQuery(query, node, f"two aggregates Spark writes alike, {e.sql}: first(v) and "
                                       "first(v, true), say; compute one of them in a query of its own")
    aggregations: dict = {}
    arguments: list[str] = []
    columns: dict[str, str] = {}  # each argument's SQL -> its column
    names = {}
    for j, (text, call) in enumerate(calls.items()):
        function = call.children[0]
        merged = _merged_function(query, node, text, call, window is not None)
        argument = function.children[0].sql
        if argument not in columns:  # sum(v) and avg(v) read one column
            columns[argument] = f"__sql_arg{len(columns)}"
            arguments.append(f"{argument} AS {quoted(columns[argument])}")
        names[text] = f"__sql_agg{j}"
        aggregations[names[text]] = [columns[argument], merged]
    if not aggregations:  # SELECT DISTINCT, GROUP BY without aggregates: a key's rows, counted
        aggregations["__sql_rows"] = ["__sql_arg", "count"]
        arguments.append("1 AS `__sql_arg`")
    pre_columns = [f"{g.sql} AS {quoted(k)}" for g, k in zip(grouping, keys)]
    where = ""
    if window is not None:  # the rows keep their event time, by its name (the stream's rowtime)
        spec, time_sql, _, _ = window
        pre_columns.append(f"{time_sql} AS {quoted(spec.time_column)}")
        where = f" WHERE {time_sql} IS NOT NULL"  # as Spark's window drops a row without a time
    elif not keys:  # a global aggregate: one key for every row
        pre_columns.append(f"0 AS `{HIDDEN_KEY}0`")
        keys = [f"{HIDDEN_KEY}0"]
    pre = f"SELECT {', '.join(pre_columns + arguments + [quoted(c) for c in carry_in])} FROM {rows}{where}"
    renamed = None if window is not None else _direct(keys, results, names, aggregations)
    rowtime = None
    if renamed is not None:  # the result is the merged rows as they are: no final step
        aggregations, final, upsert_key = renamed, None, list(keys)
    else:
        final, upsert_key = _result(grouping, keys, results, names, window[2:] if window else None, carry,
                                    instant=window is not None and window[0].instant)
    if window is not None and window[0].instant:  # the time column selected as it is
        rowtime = next((r.name for r in results if (r.children[0] if r.kind == "Alias" else r).sql == window[2]), None)
    elif window is not None:
        ends = {f"{window[2]}.end", f"{window[2]}.`end`"}
        rowtime = next((r.name for r in results if r.kind == "Alias" and r.children[0].sql in ends), None)
    group_text = node.origin.clause(query) if node.kind == "Aggregate" else "DISTINCT"
    return ContinuousAggregate(pre, keys, aggregations, final, upsert_key, group_text or "GROUP BY",
                               window[0] if window else None, rowtime)


def _merged_function(query: str, node: Node, text: str, call: Expr, windowed: bool) -> str:
    """The keyed aggregate's function (cluster.graph.aggregations) merging ``call`` across batches."""
    function = call.children[0]
    functions = MERGEABLE_DISTINCT if call.distinct else MERGEABLE
    if call.filtered or function.kind not in functions or len(function.children) != 1:
        if call.filtered:
            why = "an aggregate's FILTER is not planned over a stream yet: filter in WHERE, or a CASE in the argument"
        elif len(function.children) != 1:
            why = "an aggregate of several columns is not merged across batches yet: aggregate one column"
        else:
            why = ("not merged across batches yet: the aggregates planned over a stream are count, sum, min, max, "
                   "avg, stddev, variance (and their _pop), collect_list, collect_set, first, last, any_value, and "
                   "count, sum and avg DISTINCT")
        raise UnsupportedQuery(query, node, f"{text}: {why}")
    merged = functions[function.kind]
    if function.ignore_nulls:
        merged = IGNORING_NULLS.get(merged, merged)
    if windowed and merged not in WINDOW_AGGREGATE_FUNCTIONS:
        raise UnsupportedQuery(query, node, f"{text} is merged across batches in a running GROUP BY, not yet "
                               "per time window: a window's aggregates are count, sum, min, max and avg")
    return merged


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


def _result(grouping: list[Expr], keys: list[str], results: list[Expr], names: dict,
            window: Optional[tuple[str, str]] = None, carry: Sequence[str] = (),
            instant: bool = False) -> tuple[str, list[str]]:
    """The final step's SQL over the merged rows and the result's key (``window``: the SQL of the
    window attribute and of the struct made back from the window's columns; ``instant``: the
    attribute is the time column grouped by, made back from the window's start)."""
    replacements = {g.sql: quoted(k) for g, k in zip(grouping, keys)}
    replacements.update({text: quoted(name) for text, name in names.items()})
    if window is not None:
        replacements[window[0]] = window[1]
    columns, visible = [], {}
    # a window's start names it among its key's windows: a selected window.start keys the result
    starts = {f"{window[0]}.start", f"{window[0]}.`start`"} if window is not None else set()
    if window is not None and instant:
        starts = {window[0]}
    for r in results:
        body = r.children[0] if r.kind == "Alias" else r
        text = _replace(body.sql, replacements)
        columns.append(f"{text} AS {quoted(r.name or body.sql)}")
        for g, k in zip(grouping, keys):
            if body.sql == g.sql and k not in visible:
                visible[k] = r.name
        if body.sql in starts and WINDOW_START not in visible:
            visible[WINDOW_START] = r.name
    hidden = {k: k if k.startswith(HIDDEN_KEY) else f"{HIDDEN_KEY}{i}" for i, k in enumerate(keys) if k not in visible}
    upsert_key = [visible[k] if k in visible else hidden[k] for k in keys]
    columns += [f"{quoted(k)} AS {quoted(name)}" for k, name in hidden.items()]
    if window is not None and WINDOW_START in visible:
        upsert_key.append(visible[WINDOW_START])
    elif window is not None:  # a window's row is its key and window, whatever the query selects
        columns += [f"{quoted(c)} AS {quoted(HIDDEN_KEY + '_' + c)}" for c in (WINDOW_START, WINDOW_END)]
        upsert_key += [HIDDEN_KEY + "_" + c for c in (WINDOW_START, WINDOW_END)]
    return f"SELECT {', '.join(columns + [quoted(c) for c in carry])} FROM input", upsert_key


_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def _replace(text: str, replacements: dict[str, str]) -> str:
    """Spark's SQL of an expression with each sub-expression's text put by its column, outside
    string literals (a literal 'b.price' stays as written)."""
    if not replacements:
        return text
    alternatives = "|".join(re.escape(t) for t in sorted(replacements, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w`.])(?:{alternatives})(?![\w`])")
    out, at = [], 0
    for literal in _LITERAL.finditer(text):
        out.append(pattern.sub(lambda m: replacements[m.group(0)], text[at:literal.start()]))
        out.append(literal.group(0))
        at = literal.end()
    out.append(pattern.sub(lambda m: replacements[m.group(0)], text[at:]))
    return "".join(out)


# ------------------------------------------------------------------ the rows below it, as SQL
def per_batch_query(query: str, root: Optional[Node], view: str) -> str:
    """A per-batch query that reads the view ``view`` as the TaskManager's Spark step runs it,
    over the batch as the view ``input``: written back from the analysed plan when it only
    projects and filters, else the query whole under a CTE of that name."""
    if view == "input":
        return query
    if root is not None and all(n.kind in WRITTEN_BACK and not any(
            e.kind.endswith(SUBQUERY) for x in n.expressions for e in x.walk()) for n in root.walk()):
        try:
            return _query(query, root)
        except UnsupportedQuery:
            pass
    return f"WITH {quoted(view)} AS (SELECT * FROM input) SELECT * FROM ({query}) AS `__sql_query`"


def _leaf(node: Node) -> str:
    """A view the query reads: on the TaskManager, the batch is the view ``input``."""
    alias = node.alias or "input"
    return "input" if alias == "input" else f"input AS {quoted(alias)}"


def _query(query: str, node: Node) -> str:
    if node.kind == "SubqueryAlias" and node.children[0].kind == "View":
        return f"SELECT * FROM {_leaf(node)}"
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
        return _leaf(node)
    qualifiers = {c.qualifier for c in node.output}
    if len(qualifiers) != 1 or len(next(iter(qualifiers))) > 1:
        raise UnsupportedQuery(query, node, "the columns below the aggregation come from several relations: "
                               "not planned over a stream yet")
    (qualifier,) = qualifiers
    return f"({_query(query, node)}) AS {quoted(qualifier[0] if qualifier else '__sql_rows')}"


def quoted_if_needed(name: str) -> str:
    """As Spark's quoteIfNeeded renders a name part in an expression's SQL."""
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", name) else quoted(name)
