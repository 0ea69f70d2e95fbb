"""A join of streams where a side updates earlier rows of its key (a running aggregate's view,
the latest row per key), planned as Flink plans a join input with a unique key (pure: the join
planner's findings in, a StreamJoin's fields out).

The updating side's rows are keyed in the join's state by that key, so ``ON`` must equate each of
its columns: every version of a row then comes to one key group and meets the rows the old
version met, and replaces it there. The result is an upsert stream keyed by each side's key (an
append side's rows numbered by the join), so an update's pairs replace the old ones; the
conditions over an updating side are judged on each version, and a pair that stops passing them
is marked '-D'.
"""
from __future__ import annotations

from typing import Optional, Sequence

from cluster.graph.operator_kinds import HIDDEN_KEY_PREFIX as HIDDEN_KEY, ROW_KIND_COLUMN
from cluster.graph.schema import quoted

from kernel_runtime.api.sql.plan import Node
from kernel_runtime.api.sql.planner import UnsupportedQuery

SIDES = ("l", "r")  # the sides' prefixes in the names of the join's columns (__sql_l0, __sql_rk0)


def upsert_positions(query: str, join: Node, views: Sequence[str], updating: Sequence[Optional[list[str]]],
                     plain: tuple[list, list], bounded: bool) -> list[Optional[list[int]]]:
    """Per updating side, the position among its keys of each column of its upsert key: ON must
    equate each, so that every version of a row comes to one key group and meets the same rows.
    ``bounded``: the join has a time bound or an outer side, which an updating side cannot have."""
    if bounded:
        raise UnsupportedQuery(query, join, f"the rows of {' and '.join(v for v, u in zip(views, updating) if u)} "
                               "update earlier rows of their key (an aggregation's running rows), and a time-"
                               "bounded or outer join of them is not planned: join them without a time bound, "
                               "or aggregate per time window, whose rows are final")
    at: list[Optional[list[int]]] = []
    for i, upsert in enumerate(updating):
        if upsert is None:
            at.append(None)
            continue
        names = [n.lower() if n else None for n in plain[i]]
        missing = [c for c in upsert if c.lower() not in names]
        if not upsert or any(c.startswith(HIDDEN_KEY) for c in missing):
            raise UnsupportedQuery(query, join, f"the rows of {views[i]} update earlier rows of their key, which its "
                                   "query does not select: select the key (its GROUP BY columns) in that query, and "
                                   "equate it in ON")
        if missing:
            alias = join.children[i].output[0].qualifier[-1] if join.children[i].output else views[i]
            raise UnsupportedQuery(query, join, f"the rows of {views[i]} update earlier rows of their key "
                                   f"({', '.join(upsert)}): ON must equate {'each column' if len(upsert) > 1 else 'it'} "
                                   f"with the other side ({alias}.{missing[0]} = ...), so that a row's new version "
                                   "meets the rows its old version met")
        at.append([names.index(c.lower()) for c in upsert])
    return at


def upserting_fields(keys: tuple[list[str], list[str]], upsert_at: list[Optional[list[int]]]) -> dict:
    """The StreamJoin fields of a join with an updating side: the sides' upsert keys among their key
    columns (pre's names) and an append side's row id; "pairs": the joined rows' columns that key
    a pair."""
    upserts = tuple(None if at is None else [keys[i][j] for j in at] for i, at in enumerate(upsert_at))
    row_ids = tuple(None if at is not None else f"__sql_{SIDES[i]}row" for i, at in enumerate(upsert_at))
    pairs = [c for upsert, row_id in zip(upserts, row_ids) for c in (upsert if upsert is not None else [row_id])]
    return {"upserts": upserts, "row_ids": row_ids, "pairs": pairs}


def keyed_final(select: str, pairs: list[str], condition: str) -> tuple[str, list[str]]:
    """The result step of a join with an updating side: its select with the key of a pair (the
    joined rows' columns ``pairs``) as hidden columns, and the conditions over both sides as the
    row's kind ('-D' for a pair that fails them: its earlier version may have passed); the hidden
    key's names."""
    hidden = [f"{HIDDEN_KEY}{j}" for j in range(len(pairs))]
    head, tail = select.rsplit(" FROM input", 1)
    kind = f", CASE WHEN {condition} THEN '+U' ELSE '-D' END AS {quoted(ROW_KIND_COLUMN)}" if condition else ""
    columns = ", ".join(f"{quoted(c)} AS {quoted(h)}" for c, h in zip(pairs, hidden))
    return f"{head}, {columns}{kind} FROM input{tail}", hidden
