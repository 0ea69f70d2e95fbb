"""A join of two streams on their time windows (Flink SQL's window join), for the join planner.

Two forms reach it, each a Spark user's way to write Flink's ``L.window_start = R.window_start AND
L.window_end = R.window_end`` after window table functions:

* each side computes its windows itself, as Spark's documentation joins on event-time windows:
  ``(SELECT *, window(ts, '10 seconds') AS w FROM bids) b JOIN (...) a ON b.k = a.k AND b.w = a.w``
  (a sliding window repeats a row once per window it is in, as Spark's window() does);
* each side is a view whose event time is its window's end (a windowed aggregation selecting
  ``window.end AS endtime``, Nexmark q8), and ``ON`` equates the two ends.

Rows of one window meet only rows of that window, so a row is useless once the watermark passes
its window's end: the join is an interval join whose two times are the windows' ends and whose
bound is 0. A row is late only once its window has passed, as in Flink's window join.
"""
from __future__ import annotations

from typing import Optional, Sequence

from cluster.graph.schema import quoted

from kernel_runtime.api.sql.plan import Column, Expr, Node, WindowCall
from kernel_runtime.api.sql.planner import PER_BATCH, UnsupportedQuery, _is_window, _per_batch


def _above_view(side: Node) -> list[Node]:
    """The side's nodes down to its view (the view's own plan is another stream's)."""
    nodes, stack = [], [side]
    while stack:
        node = stack.pop()
        nodes.append(node)
        if node.kind != "View":
            stack.extend(node.children)
    return nodes


def computes_window(side: Node) -> bool:
    """Whether the side's own select computes a window() (not one its view has as a column)."""
    return any(_is_window(c.data_type) for n in _above_view(side) if n.kind in ("Project", "Expand")
               for c in n.output)


def rows_per_batch(side: Node) -> bool:
    """A side planned per batch: projections and filters, and the expansion of a sliding window()."""
    return _per_batch(side) or (computes_window(side) and all(n.kind in PER_BATCH or n.kind == "Expand"
                                                              for n in _above_view(side)))


def side_rows(query: str, side: Node, view: str) -> tuple[str, str]:
    """(a WITH clause naming the batch as its view, the side's FROM item) for a side computing its
    windows: taken as the query writes it, as Spark's analysed plan has window() rewritten into
    arithmetic that its SQL cannot read back."""
    child = side.children[0] if side.kind == "SubqueryAlias" and side.children else None
    if child is None or child.origin.start is None or child.origin.stop is None:
        raise UnsupportedQuery(query, side, "a side of a join computing its windows is planned as a subquery "
                               "with an alias: (SELECT *, window(ts, '10 seconds') AS w FROM bids) b")
    text = query[child.origin.start:child.origin.stop + 1]
    return f"WITH {quoted(view)} AS (SELECT * FROM input) ", f"({text}) AS {quoted(side.alias or '')}"


def check_windows_read_event_time(query: str, join: Node, sides: Sequence[Node], rowtimes: Sequence[Optional[str]],
                                  calls: Sequence[WindowCall]) -> None:
    """A side's windows decide when its rows are useless only if they are on the time its
    watermark follows (``rowtimes``: each side's view's event-time column)."""
    computing = [time for side, time in zip(sides, rowtimes) if computes_window(side)]
    if None in computing:
        raise UnsupportedQuery(query, join, "a join on time windows needs each side's event time: give the "
                               "stream a watermark strategy on the column its window() reads")
    times = {time.lower() for time in computing if time is not None}
    wrong = [c for c in calls if c.function != "window" or c.time_column.lower() not in times]
    if computing and wrong:
        raise UnsupportedQuery(query, join, f"a join on time windows takes window() on each side's event time "
                               f"({', '.join(sorted(times))}, whose watermarks the stream carries), not "
                               f"{wrong[0].function}({wrong[0].time_column}, ...)")


def window_end_keys(pair: tuple[Expr, Expr], sides: Sequence[Node], times: Sequence[Optional[Column]],
                    calls: Sequence[WindowCall]) -> Optional[tuple[list[str], list[str], int]]:
    """For an equality of the two sides that aligns their windows: each side's key expressions
    and the position among them of the window's end, the time the join bounds; None for any other
    equality. A window, or its start, is keyed by its start and end (equal starts of windows of
    one size are equal ends)."""
    a, b = pair
    if all(e.kind == "AttributeReference" and time is not None and (e.qualifier, e.name) == (time.qualifier, time.name)
           for e, time in zip(pair, times)):
        return [a.sql], [b.sql], 0  # both views' event times (each a window's end)
    if not all(computes_window(side) for side in sides):
        return None
    if all(e.kind == "AttributeReference" and _is_window(e.data_type) for e in pair):
        return [f"{a.sql}.start", f"{a.sql}.end"], [f"{b.sql}.start", f"{b.sql}.end"], 1
    fields = {_field(e) for e in pair}
    if fields == {"end"}:
        return [a.sql], [b.sql], 0
    if fields == {"start"} and len({c.durations_ms[:1] for c in calls}) == 1:
        return ([a.sql, f"{a.children[0].sql}.end"], [b.sql, f"{b.children[0].sql}.end"], 1)
    return None


def _field(e: Expr) -> Optional[str]:
    """"start" or "end" for a field of a window struct."""
    if e.kind != "GetStructField" or not _is_window(e.children[0].data_type):
        return None
    name = e.sql.rsplit(".", 1)[-1].strip("`").lower()
    return name if name in ("start", "end") else None
