"""An aggregation over an aggregation's running rows (pure: plan.Node in, a plan out; tested
without a cluster): Nexmark q4's average per category of each auction's maximum bid, a histogram
of running counts.

The inner aggregation's row of a key changes as batches come, so the outer one must take the old
row back before it adds the new, as Flink's GroupAggregate does with retraction: the inner keyed
aggregate emits each key's old row marked '-U' before its update (the column ROW_KIND_COLUMN), its
result step and the outer one's rows step pass the mark on (a filter between them judges each row
on its own, as Flink's Calc does a changelog's), and the outer aggregate adds or takes back each
row (cluster.operators.retracting): count, sum and avg, and min and max from each value's count. An outer key whose rows all moved away is
deleted. Over a time window the inner rows are final, and the outer aggregation is a plain one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from cluster.graph.operator_kinds import ROW_KIND_COLUMN
from cluster.graph.schema import quoted

from kernel_runtime.api.sql.plan import Node, WindowCall
from kernel_runtime.api.sql.planner import ContinuousAggregate, UnsupportedQuery, _aggregate, _is_window, plan
from kernel_runtime.api.sql.join_planner import JoinedAggregate, find_join
from kernel_runtime.api.sql.result_query import rows_above

RETRACTABLE = ("Count", "Sum", "Average", "Min", "Max")  # Catalyst's classes cluster.operators.retracting takes back


@dataclass(frozen=True)
class NestedAggregate:
    inner: Union[ContinuousAggregate, JoinedAggregate]  # its rows, each key's old row marked -U first unless windowed
    outer: ContinuousAggregate   # over the inner's rows, taking back each -U

    @property
    def retracting(self) -> bool:
        aggregate = self.inner.aggregate if isinstance(self.inner, JoinedAggregate) else self.inner
        return aggregate.window is None

    def explain(self) -> str:
        how = ("each key's old row taken back (-U) before its update is added (Flink's retraction)" if self.retracting
               else "the windows' final rows (append)")
        return "\n".join(["the inner aggregation:", self.inner.explain(),
                          f"the outer aggregation, over the inner's rows: {how}", self.outer.explain()])


def inner_aggregation(root: Node) -> Optional[Node]:
    """The aggregation whose rows ``root``, an aggregation, aggregates in turn (through a subquery
    that may project and filter them)."""
    if root.kind != "Aggregate" or len(root.children) != 1:
        return None
    node = root.children[0]
    while node.kind in ("Project", "Filter", "SubqueryAlias") and len(node.children) == 1:
        node = node.children[0]
    return node if node.kind == "Aggregate" and node is not root.children[0] else None


def plan_nested(query: str, root: Node, inner_node: Node, windows: Sequence[WindowCall],
                plan_inner_join: Callable[[Node, Sequence[str]], JoinedAggregate]) -> NestedAggregate:
    """``plan_inner_join(node, carry)``: the JoinedAggregate of an inner aggregation over a join."""
    if any(_is_window(g.data_type) for g in root.grouping):
        raise UnsupportedQuery(query, root, "a time window over an aggregation's rows is not planned yet: "
                               "window the rows below it")
    # a window's rows are final: nothing of them is taken back
    retracting = not any(_is_window(g.data_type) for g in inner_node.grouping)
    marks: tuple[str, ...] = (ROW_KIND_COLUMN,) if retracting else ()
    inner: Union[ContinuousAggregate, JoinedAggregate]
    if find_join(inner_node) is not None:  # Nexmark q4: the maximum bid of each auction, by a join
        inner = plan_inner_join(inner_node, marks)
    else:
        inner = plan(query, inner_node, windows, carry=marks)  # the outer groups by no window: any is the inner's
        if not isinstance(inner, ContinuousAggregate):
            raise UnsupportedQuery(query, inner_node, f"{inner_node.kind} is not planned over a stream")
    rows = _rows_over(query, root.children[0], inner_node, marks)
    outer = _aggregate(query, root, list(root.grouping), list(root.aggregates), rows, carry=marks, carry_in=marks)
    if retracting:
        wrong = list(dict.fromkeys(e.sql for r in root.aggregates for e in r.walk() if e.kind == "AggregateExpression"
                                   and (e.distinct or e.children[0].kind not in RETRACTABLE)))
        if wrong:
            raise UnsupportedQuery(query, root, f"{', '.join(wrong)} over an aggregation's running rows is not planned "
                                   "yet: the aggregates over them are count, sum, avg, min and max")
        outer = dataclasses.replace(outer, deletes=True)
    return NestedAggregate(inner, outer)


def _rows_over(query: str, top: Node, inner_node: Node, marks: Sequence[str]) -> str:
    """The FROM item of the outer aggregation: the nodes between the two over the inner's rows
    (the view input), as SQL; each projection passes the marks on."""
    between = []
    node = top
    while node is not inner_node:
        between.append(node)
        node = node.children[0]
    alias = next((c.qualifier[-1] for c in inner_node.output if c.qualifier), "input")
    sql, alias = rows_above(between, f"SELECT * FROM input AS {quoted(alias)}", alias, [quoted(m) for m in marks])
    return f"({sql}) AS {quoted(alias)}"
