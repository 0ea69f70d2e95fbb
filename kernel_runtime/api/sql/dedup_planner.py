"""``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...)`` kept where it is 1: deduplication over
a stream, as Flink SQL plans it (pure: plan.Node in, a plan out; tested without a cluster).

The query Flink's documentation gives for deduplication, and the one for "the latest row per
key" with ``ORDER BY ts DESC``::

    SELECT ... FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY ts) AS rn FROM input) t
    WHERE rn = 1

becomes

1. per batch, on Spark: the rows below the window function, and of them each key's first in the
   batch by the order (the same window function over the batch alone: fewer rows to shuffle);
2. the keyed deduplicate operator: each key's first row so far, in keyed state, emitted when it
   changes (an upsert stream keyed by the PARTITION BY columns);
3. per batch over the kept rows, on Spark: the outer query's select list.

Other uses of an analytic function (a running ``sum(...) OVER``, ``rank()``, ``rn <= 3``) are
refused with the clause and what to write instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cluster.graph.operator_kinds import HIDDEN_KEY_PREFIX as HIDDEN_KEY
from cluster.graph.schema import quoted

from kernel_runtime.api.sql.plan import Expr, Node
from kernel_runtime.api.sql.planner import UnsupportedQuery, _per_batch, _query

_FIRST = {"EqualTo": "1", "LessThanOrEqual": "1", "LessThan": "2"}  # rn = 1, rn <= 1, rn < 2
_PASS = ("Project", "SubqueryAlias")


@dataclass(frozen=True)
class Deduplicate:
    pre: str                              # per batch: the rows, each key's first in the batch
    keys: list[str]                       # the PARTITION BY columns of pre's rows
    order: list[tuple[str, bool, bool]]   # (column, descending, nulls first), most significant first
    final: str                            # per batch over the kept rows (view input): the select list
    upsert_key: list[str]                 # the result's key columns (hidden ones: HIDDEN_KEY...)
    clause: str                           # the window function, for the operators' names
    time_column: Optional[str] = None     # a key column that is the stream's event time: the watermark ends a key

    @property
    def keep_latest(self) -> bool:
        """Rows equal in the order go to the latest (ORDER BY ... DESC: Flink's keep-last row)."""
        return bool(self.order) and self.order[0][1]

    def explain(self) -> str:
        order = ", ".join(f"{c} {'DESC' if d else 'ASC'}" for c, d, _ in self.order)
        return "\n".join([
            "per batch, on Spark: the rows, and each key's first of the batch by the order",
            f"  {self.pre}",
            f"keyed state by {', '.join(self.keys)}: the first row of each key so far"
            + (f" by {order}" if order else " to arrive")
            + (f" (one row per key, until the watermark passes its {self.time_column}; a row behind the watermark "
               "is late: dropped and counted)" if self.time_column else " (one row per key, for as long as the job "
                                                                           "runs)"),
            "per batch, on Spark: the result over the kept rows", f"  {self.final}",
            f"output: an upsert stream keyed by {', '.join(self.upsert_key)}"])


def find_window(root: Node) -> Optional[Node]:
    return next((n for n in root.walk() if n.kind == "Window"), None)


def plan_deduplicate(query: str, root: Node, rowtime: Optional[str] = None) -> Deduplicate:
    """The plan of a query whose analytic function is ``ROW_NUMBER() ... = 1``; UnsupportedQuery.
    ``rowtime``: the input's event-time column (partitioned by it, a key ends at the watermark)."""
    above: list[Node] = []
    node = root
    while node.kind != "Window":
        if len(node.children) != 1:
            raise _analytic(query, root)
        above.append(node)
        node = node.children[0]
    window = node
    rank = _row_number(query, window)
    filters = [n for n in above if n.kind == "Filter"]
    if len(filters) != 1 or any(n.kind not in _PASS + ("Filter",) for n in above):
        raise _analytic(query, window)
    where = filters[0]
    _first_only(query, where, rank)
    at = above.index(where)
    outer, inner = above[:at], above[at + 1:]
    alias = inner[0] if inner and inner[0].kind == "SubqueryAlias" else None
    if alias is None or len(outer) != 1 or outer[0].kind != "Project" or \
            any(n.kind != "Project" or any(e.kind != "AttributeReference" for e in n.expressions) for n in inner[1:]):
        raise UnsupportedQuery(query, where, "deduplication is planned as Flink writes it: SELECT ... FROM (SELECT "
                               "*, ROW_NUMBER() OVER (PARTITION BY k ORDER BY ts) AS rn FROM ...) t WHERE rn = 1")
    rows = window.children[0]
    if not _per_batch(rows):
        raise UnsupportedQuery(query, window, "ROW_NUMBER() over rows that span batches (an aggregation, a join) is "
                               "not planned yet: deduplicate the rows of a stream")
    names = [c.name for c in rows.output]
    if len(set(names)) != len(names):
        raise UnsupportedQuery(query, window, f"the rows below ROW_NUMBER() have two columns of one name ({names}): "
                               "name each once")
    keys = [_column(query, window, e, "PARTITION BY") for e in window.grouping]
    if not keys:
        raise UnsupportedQuery(query, window, "ROW_NUMBER() without PARTITION BY keeps one row of the whole "
                               "stream: not planned yet; partition by the columns a row is a duplicate by")
    order = [_sort(query, window, e) for e in window.order]
    ranking = ", ".join(f"{quoted(c)} {'DESC' if d else 'ASC'} NULLS {'FIRST' if n else 'LAST'}" for c, d, n in order)
    over = f"PARTITION BY {', '.join(map(quoted, keys))}" + (f" ORDER BY {ranking}" if ranking else "")
    pre = (f"SELECT * FROM (SELECT *, row_number() OVER ({over}) AS {quoted(rank)} "
           f"FROM ({_query(query, rows)}) AS `__sql_below`) "
           f"AS `__sql_rows` WHERE {quoted(rank)} = 1")
    final, upsert_key = _result(outer[0], alias, keys)
    return Deduplicate(pre, keys, order, final, upsert_key, window.origin.clause(query) or "ROW_NUMBER()",
                       _time_key(keys, rowtime))


def plan_distinct(query: str, root: Node, rowtime: Optional[str]) -> Optional[Deduplicate]:
    """``SELECT DISTINCT`` of rows with the input's event time among their columns: each row's first
    sight, kept until the watermark passes its time (Spark's dropDuplicates with a watermark);
    None for any other query (a DISTINCT without the time is an aggregation, kept for ever)."""
    if root.kind != "Distinct" or not _per_batch(root.children[0]):
        return None
    child = root.children[0]
    keys = [c.name for c in child.output]
    time_column = _time_key(keys, rowtime)
    if time_column is None or len(set(keys)) != len(keys):
        return None
    pre = f"SELECT DISTINCT * FROM ({_query(query, child)}) AS `__sql_rows`"
    return Deduplicate(pre, keys, [], f"SELECT {', '.join(map(quoted, keys))} FROM input", keys, "SELECT DISTINCT",
                       time_column)


def _time_key(keys: list[str], rowtime: Optional[str]) -> Optional[str]:
    return next((k for k in keys if rowtime is not None and k.lower() == rowtime.lower()), None)


def _analytic(query: str, node: Node) -> UnsupportedQuery:
    return UnsupportedQuery(query, node, "an analytic function (OVER ...) needs every row of its partition: for "
                            "a running aggregate per key use GROUP BY; for one row per key, ROW_NUMBER() OVER "
                            "(PARTITION BY ... ORDER BY ...) = 1 in the WHERE of a query over it")


def _row_number(query: str, window: Node) -> str:
    """The name of the window's one function, a ROW_NUMBER()."""
    if len(window.expressions) != 1 or window.expressions[0].kind != "Alias":
        raise _analytic(query, window)
    function = window.expressions[0].children[0]
    inner = function.children[0] if function.kind == "WindowExpression" else function
    if inner.kind in ("Rank", "DenseRank"):
        raise UnsupportedQuery(query, window, f"{inner.sql} keeps every row that ties for first: deduplication is "
                               "ROW_NUMBER(), one row per key")
    if inner.kind != "RowNumber":
        raise _analytic(query, window)
    return window.expressions[0].name


def _first_only(query: str, where: Node, rank: str) -> None:
    condition = where.expressions[0]
    first = (condition.kind in _FIRST and len(condition.children) == 2
             and condition.children[0].kind == "AttributeReference" and condition.children[0].name == rank
             and condition.children[1].sql == _FIRST[condition.kind])
    if not first:
        raise UnsupportedQuery(query, where, f"{condition.sql}: only the first row per key ({rank} = 1) is planned "
                               "over a stream; a top N needs a row taken back when it leaves the top, not planned "
                               "yet (other conditions go in the WHERE below the ROW_NUMBER())")


def _column(query: str, window: Node, e: Expr, clause: str) -> str:
    if e.kind != "AttributeReference":
        raise UnsupportedQuery(query, window, f"{e.sql} in {clause} is not planned yet: compute it as a column below")
    return e.name


def _sort(query: str, window: Node, e: Expr) -> tuple[str, bool, bool]:
    column = _column(query, window, e.children[0], "ORDER BY")
    return column, " DESC " in f"{e.sql} ", e.sql.endswith("NULLS FIRST")


def _result(project: Node, alias: Node, keys: list[str]) -> tuple[str, list[str]]:
    """The outer select list over the kept rows, named by the subquery's alias; the result's key
    (a key it does not select is kept hidden)."""
    columns = [e.sql for e in project.expressions]
    selected = {e.name: e.name for e in project.expressions if e.kind == "AttributeReference"}
    upsert_key = []
    for i, key in enumerate(keys):
        if key in selected:
            upsert_key.append(selected[key])
        else:
            columns.append(f"{quoted(key)} AS {quoted(f'{HIDDEN_KEY}{i}')}")
            upsert_key.append(f"{HIDDEN_KEY}{i}")
    return f"SELECT {', '.join(columns)} FROM input AS {quoted(alias.alias or '')}", upsert_key
