"""Why the planner refuses a node of Spark's analysed plan that spans batches, by Catalyst's node
name: what a stream cannot answer, and what to write instead."""
from __future__ import annotations

REFUSED = {
    "Sort": "a stream has no last row to sort by: sort the collected result (handle.results(...)"
            ".sort_values(...)), or aggregate per window",
    "GlobalLimit": "a stream has no end to count rows from: take .head(n) of the collected result",
    "LocalLimit": "a stream has no end to count rows from: take .head(n) of the collected result",
    "Offset": "a stream has no end to count rows from: take the rows of the collected result",
    "Tail": "a stream has no end to count rows from: take .tail(n) of the collected result",
    "Window": "an analytic function (OVER ...) needs every row of its partition: for a running "
              "aggregate per key use GROUP BY",
    "Join": "a join of streams is planned as the query's own FROM (SELECT ... FROM a JOIN b ON ... WHERE ...), "
            "or under its GROUP BY; a subquery over a join is not planned yet",
    "Expand": "GROUPING SETS, ROLLUP and CUBE are not planned over a stream yet: write one GROUP BY per grouping",
    "Intersect": "INTERSECT needs both whole inputs: not planned over a stream",
    "Except": "EXCEPT needs both whole inputs: not planned over a stream",
    "Deduplicate": "dropDuplicates of a view is not planned in SQL: use stream.drop_duplicates(...) before it",
}
