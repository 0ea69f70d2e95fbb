"""From Spark's analysed plan of a join of two streams to what streamlab runs (pure: plan.Node in,
a StreamJoin out; the bounds' arithmetic is Spark's, through the ``offset`` it is given).

An inner join whose ``ON`` (with the ``WHERE`` above it) equates columns of the two sides is
planned as Flink SQL plans a streaming join:

* per batch of each side, on Spark: the side's rows (its ``FROM`` item, its own conditions pushed
  down to it, rows with a null key dropped as no null equals anything), projected to the columns
  the query reads and the key expressions;
* the two sides hash-partitioned by their keys into one keyed join operator:
  - with a time bound on both sides' event times (``a.ts BETWEEN b.ts - INTERVAL '5' SECOND AND
    b.ts + INTERVAL '5' SECOND``, or two comparisons) an interval join: rows wait until the
    watermark passes the bound, and a row behind the watermark is late (dropped and counted);
  - without one a regular join: each side's rows wait for ever, or for ``table.exec.state.ttl``;
* per batch over the joined rows, on Spark: the query's conditions that span both sides and its
  select list.

An inner join of two append streams is an append stream: each pair of rows once, when the later of
the two arrives; a side whose rows update their key makes it an upsert stream (join_updates).
Outer joins, joins of more than two relations and joins without an equality are refused, naming
the clause.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from cluster.graph.schema import quoted

from kernel_runtime.api.sql.join_updates import SIDES, keyed_final, upsert_positions, upserting_fields
from kernel_runtime.api.sql.join_windows import check_windows_read_event_time, computes_window, rows_per_batch, \
    side_rows, window_end_keys
from kernel_runtime.api.sql.plan import Column, Expr, Node, WindowCall
from kernel_runtime.api.sql.planner import ContinuousAggregate, UnsupportedQuery, _aggregate, _from_item, \
    _is_window, _per_batch, _refusal, _replace, quoted_if_needed

HOW = {"INNER": "inner", "LEFT OUTER": "left", "RIGHT OUTER": "right", "FULL OUTER": "full"}
# times a bound's constant is measured at: a function of the time (date_trunc, a month's interval)
# gives different ones, and is no bound
ORIGINS = ("1970-01-02 00:00:00", "2024-02-29 13:37:11.123", "2023-12-31 23:59:59.999")


def preserved(how: str) -> tuple[bool, bool]:
    """Whether each side's rows come out without a match (the outer sides)."""
    return how in ("left", "full"), how in ("right", "full")
_COMPARISONS = {"EqualTo": "=", "GreaterThan": ">", "GreaterThanOrEqual": ">=", "LessThan": "<",
                "LessThanOrEqual": "<="}
_FLIPPED = {"=": "=", ">": "<", ">=": "<=", "<": ">", "<=": ">="}
# offset(SQL of a constant timestamp, SQL of another): the first less the second, in µs (Spark's arithmetic)
Offset = Callable[[str, str], int]


@dataclass(frozen=True)
class StreamJoin:
    views: tuple[str, str]                  # the view each side reads
    pre: tuple[str, str]                    # per batch over each side's batch (the view input)
    keys: tuple[list[str], list[str]]       # each side's key columns in pre's rows
    rowtimes: tuple[Optional[str], Optional[str]]  # each side's event-time column in pre's rows
    bounds: Optional[tuple[int, int]]       # interval join: right.ts - left.ts within [lower, upper] ms
    final: str                              # per batch over the joined rows (the view input)
    rowtime: Optional[str]                  # the result's event-time column, if it keeps the left's
    clause: str                             # the join as written, for the operators' names
    on: str = ""                            # the keys' equality, as Spark writes it
    side_schemas: tuple[Optional[str], Optional[str]] = (None, None)  # an outer join's: pre's rows (schema_to_text)
    how: str = "inner"                      # inner, left, right, full (an outer interval join)
    inclusive: tuple[bool, bool] = (True, True)  # whether each bound joins a pair right at it
    state_ttl_ms: int = 0                   # a regular join's table.exec.state.ttl (0: rows kept for ever)
    windowed: bool = False                  # a window join: each side's time is its rows' window's end
    upserts: tuple[Optional[list[str]], Optional[list[str]]] = (None, None)  # an updating side's key in pre's rows
    row_ids: tuple[Optional[str], Optional[str]] = (None, None)  # the id the join gives an append side's rows
    result_key: Optional[list[str]] = None  # the upsert key of final's rows, if a side updates
    deletes: bool = False                   # final marks a pair that stops passing the conditions '-D'

    @property
    def kind(self) -> str:
        return "interval-join" if self.bounds is not None else "regular-join"

    def explain(self) -> str:
        lines = []
        for side, view, pre in zip(("left", "right"), self.views, self.pre):
            lines += [f"per batch, on Spark: the {side} side's rows (view {view}) and its keys", f"  {pre}"]
        keys = self.on or ", ".join(f"{a} = {b}" for a, b in zip(*self.keys))
        if self.windowed:
            kind = "a window join" if self.how == "inner" else f"a {self.how} outer window join"
            lines.append(f"keyed state by {keys}: {kind}, rows of one window meeting; rows wait until the watermark "
                         "passes their window's end")
        elif self.bounds is not None:
            kind = "an interval join" if self.how == "inner" else f"a {self.how} outer interval join"
            lines.append(f"keyed state by {keys}: {kind}, a right row {self.bounds[0]} ms to "
                         f"{self.bounds[1]} ms from a left row's time; rows wait until the watermark passes "
                         "that bound")
        else:
            kept = f"for {self.state_ttl_ms} ms after they arrive (table.exec.state.ttl)" if self.state_ttl_ms else \
                "for ever (no time bound in ON; table.exec.state.ttl bounds it)"
            lines.append(f"keyed state by {keys}: a regular join, both sides' rows kept {kept}")
        if self.bounds is not None and self.how != "inner":
            outer = " or ".join(side for side, is_outer in zip(("left", "right"), preserved(self.how)) if is_outer)
            lines.append(f"  a {outer} row that met none leaves then, with the other side's columns null")
        if self.result_key is not None:
            output = ("output: an upsert stream keyed by each side's key (an append side's by a row id): a side's new "
                      "row replaces its old one, and its pairs the old ones"
                      + ("; a pair that stops passing the conditions is deleted" if self.deletes else ""))
        else:
            output = ("output: every joined pair once, when its later row arrives (append)"
                      + ("" if self.how == "inner" else "; a row without a match once its bound passed"))
        lines += ["per batch, on Spark: the result over the joined rows", f"  {self.final}", output]
        return "\n".join(lines)


def find_join(root: Node) -> Optional[Node]:
    for node in root.walk():
        if node.kind == "Join":
            return node
    return None


@dataclass(frozen=True)
class JoinedAggregate:
    """A GROUP BY over a join: the join's result rows carry each side's columns as a struct named
    as the side (``o``, ``p``), so that the aggregation's own SQL (``o.city``) reads them unchanged;
    then the continuous aggregation over them, as over any stream (the join's output is append)."""

    join: StreamJoin
    aggregate: ContinuousAggregate

    def explain(self) -> str:
        joined = self.join.explain().rsplit("\n", 1)[0]  # its rows go on to the aggregation
        return f"{joined}\nthe joined rows, then:\n{self.aggregate.explain()}"


def plan_join(query: str, root: Node, rowtimes: dict[str, Optional[str]], offset: Offset, carry: Sequence[str] = (),
              calls: Sequence[WindowCall] = (), upserts: Optional[dict[str, Optional[list[str]]]] = None):
    """The StreamJoin of ``root`` (Project? Filter? Join of two per-batch sides), or the
    JoinedAggregate of an Aggregate over Filter? Join; ``rowtimes``: each view's event-time column
    (None: the stream has none); ``carry``: as planner.plan's, of the aggregation; ``calls``: the
    query's window calls as written; ``upserts``: the key of each view whose rows update earlier
    rows of their key."""
    if root.kind != "Aggregate":
        return _plan(query, root, rowtimes, offset, calls=calls, upserts=upserts or {})
    if any(_is_window(g.data_type) for g in root.grouping):
        raise UnsupportedQuery(query, root, "a time window over a join of streams is not planned yet: window "
                               "each stream, or aggregate the joined rows without a window")
    reads = {a for e in root.grouping + root.aggregates for a in _attributes(e)}
    join = _plan(query, root.children[0], rowtimes, offset, reads, calls)
    return JoinedAggregate(join, _aggregate(query, root, list(root.grouping), list(root.aggregates), "input",
                                            carry=carry))


def _plan(query: str, root: Node, rowtimes: dict[str, Optional[str]], offset: Offset,
          aggregated: Optional[set] = None, calls: Sequence[WindowCall] = (),
          upserts: Optional[dict[str, Optional[list[str]]]] = None) -> StreamJoin:
    """``aggregated``: the side columns an aggregation above reads (the result is then each side's
    columns as a struct), or None (the result is the select list above the join)."""
    above, join = _above_join(query, root, aggregated is not None)
    if join.join_type not in HOW:
        raise UnsupportedQuery(query, join, f"a {join.join_type} join of streams is not planned yet: write an inner "
                               "or outer join")
    how = HOW[join.join_type]
    kept = preserved(how)
    sides = join.children
    for side in sides:
        if not rows_per_batch(side) or sum(n.kind == "View" for n in side.walk()) != 1:
            raise _refusal(query, side) if not rows_per_batch(side) else UnsupportedQuery(
                query, join, "each side of a join of streams reads one view: join two streams at a time")
    views = tuple(_view(side) for side in sides)
    owner = {(c.qualifier, c.name): i for i, side in enumerate(sides) for c in side.output}
    if len(owner) != sum(len(side.output) for side in sides):
        raise UnsupportedQuery(query, join, "both sides of the join have a column of one name and qualifier: "
                               "give the sides their own aliases (FROM bids b JOIN bids c ...)")
    # an outer join's WHERE filters its rows, the null-padded ones too: it is only checked after the join
    conditions = [(c, how != "inner") for node in above if node.kind == "Filter"
                  for c in _conjuncts(node.expressions[0])]
    conditions += [(c, False) for c in _conjuncts(join.expressions[0])] if join.expressions else []
    times = [_time_column(side, rowtimes.get(view)) for side, view in zip(sides, views)]
    check_windows_read_event_time(query, join, sides, [rowtimes.get(view) for view in views], calls)
    windowing = [computes_window(side) for side in sides]  # each side's own select computes window()
    updating = [(upserts or {}).get(view) for view in views]  # each side's upsert key, if its rows update

    keys: tuple[list[str], list[str]] = ([], [])
    pushed: tuple[list[str], list[str]] = ([], [])
    residual: list[Expr] = []
    lower: list[tuple[int, bool]] = []  # (µs, strict)
    upper: list[tuple[int, bool]] = []
    ends: Optional[list[int]] = None  # a window join: the position of each side's window end among its keys
    plain: tuple[list, list] = ([], [])  # per side, each key's column name if it is a column as it is
    for condition, after in conditions:
        reads = {owner.get(a) for a in _attributes(condition)}
        if None in reads:
            raise UnsupportedQuery(query, join, f"{condition.sql} reads a column of neither side of the join")
        if after:
            residual.append(condition)
            continue
        # an updating side's condition is judged on each version, after the join (a pair may stop passing)
        if len(reads) == 1 and not kept[0 if 0 in reads else 1] and updating[0 if 0 in reads else 1] is None:
            # one side's own condition: its rows are cut before they wait
            pushed[0 if 0 in reads else 1].append(_sql(query, join, condition))
            continue
        pair = _key_pair(condition, owner)
        aligned = window_end_keys(pair, sides, times, calls) if pair is not None else None
        if aligned is not None and ends is None:
            ends = [len(keys[0]) + aligned[2], len(keys[1]) + aligned[2]]
        if aligned is not None:
            keys[0].extend(aligned[0])
            keys[1].extend(aligned[1])
            plain[0].extend([None] * len(aligned[0]))
            plain[1].extend([None] * len(aligned[1]))
            continue
        if pair is not None:
            if any(_is_window(e.data_type) for e in pair):
                raise UnsupportedQuery(query, join, f"{condition.sql}: a join on time windows equates windows that "
                                       "each side computes with window() on its event time, or the two views' event "
                                       "times (a windowed aggregation's window.end AS ...)")
            keys[0].append(pair[0].sql)
            keys[1].append(pair[1].sql)
            for i, e in enumerate(pair):
                plain[i].append(e.name if e.kind == "AttributeReference" else None)
            continue
        # a window join's times are its windows' ends, not the times a bound reads
        bound = _bound(condition, owner, times, offset) if not any(windowing) else None
        if bound is not None:
            (lower if bound[0] == ">=" else upper).append(bound[1:])
        _sql(query, join, condition)
        if how != "inner" and bound is None:
            raise UnsupportedQuery(query, join, f"{condition.sql} in ON of an outer join of streams is not planned "
                                   "yet: ON may hold the keys' equalities, the time bound and conditions on the "
                                   "side whose rows need a match; filter the result in WHERE")
        if how == "inner":  # checked again exactly: the operator's bounds are whole milliseconds
            residual.append(condition)
    if not keys[0]:
        raise UnsupportedQuery(query, join, "a join of streams needs an equality of the two sides' columns in ON "
                               "(a.k = b.k): without one every row would meet every row of the other stream")

    on = " AND ".join(f"{a} = {b}" for a, b in zip(*keys))
    if ends is not None:  # rows of one window: the windows' ends equal
        lower, upper = lower + [(0, False)], upper + [(0, False)]
    interval = bool(lower) and bool(upper) and (all(times) or ends is not None)
    if how != "inner" and not interval:
        raise UnsupportedQuery(query, join, "an outer join of streams needs a bound on both sides' event times in ON "
                               "(b.ts BETWEEN a.ts AND a.ts + INTERVAL 1 MINUTE): a row without a match is known only "
                               "once the watermark passes its bound; without one it needs retractions, not planned yet")
    low = max(lower) if interval else (0, False)  # the highest lower bound; at a tie, the strict one
    high = min(upper, key=lambda b: (b[0], not b[1])) if interval else (0, False)
    if how != "inner" and (low[0] % 1000 or high[0] % 1000):
        raise UnsupportedQuery(query, join, "an outer join's time bound is checked in whole milliseconds: write "
                               "its intervals in milliseconds or coarser")
    if interval and (low[0] > high[0] or (low[0] == high[0] and (low[1] or high[1]))):
        raise UnsupportedQuery(query, join, f"the join's time bound is empty: the right time less the left from "
                               f"{low[0] / 1000:g} ms to {high[0] / 1000:g} ms")
    if any_updating := any(u is not None for u in updating):
        upsert_at = upsert_positions(query, join, views, updating, plain, interval or how != "inner")
    project = next((n for n in above if n.kind == "Project"), None)
    read = {a for e in (project.expressions if project is not None else ()) + tuple(residual) for a in _attributes(e)}
    read |= aggregated or set()
    names: dict[str, str] = {}  # a side column's SQL -> its name in the joined rows
    pre = []
    for i, side in enumerate(sides):
        columns = [c for c in side.output if (project is None and aggregated is None) or (c.qualifier, c.name) in read
                   or (interval and c == times[i])]
        projections = []
        for j, column in enumerate(columns):
            names[_column_sql(column)] = f"__sql_{SIDES[i]}{j}"
            projections.append(f"{_column_sql(column)} AS {quoted(names[_column_sql(column)])}")
        key_names = [f"__sql_{SIDES[i]}k{j}" for j in range(len(keys[i]))]
        projections += [f"{k} AS {quoted(n)}" for k, n in zip(keys[i], key_names)]
        # a null key meets nothing: a side whose rows need a match drops them at once (an outer
        # side keeps them, to leave alone)
        cut = ([] if kept[i] else [f"({k}) IS NOT NULL" for k in keys[i]]) + pushed[i]
        named, rows = side_rows(query, side, views[i]) if windowing[i] else ("", _from_item(query, side))
        pre.append(f"{named}SELECT {', '.join(projections)} FROM {rows}"
                   + (f" WHERE {' AND '.join(cut)}" if cut else ""))
        keys[i][:] = key_names
    rowtime_names: tuple[Optional[str], ...] = tuple(
        keys[i][ends[i]] if ends is not None else names[_column_sql(t)] if interval and t is not None else None
        for i, t in enumerate(times))
    renamed = {text: quoted(name) for text, name in names.items()}
    after_join = " AND ".join(_replace(r.sql, renamed) for r in residual)
    if aggregated is not None:
        final, rowtime = _structs(sides, read, renamed), None
    else:
        # the left's time stays the result's event time only where every row has one
        # ... and a window join's left time is its window's end, not a column selected
        left_time = times[0] if interval and not kept[1] and not windowing[0] else None
        final, rowtime = _final(project, join, renamed, left_time)
    upserting: dict = {}
    if any_updating:
        upserting = upserting_fields(keys, upsert_at)
        final, upserting["result_key"] = keyed_final(final, upserting.pop("pairs"), after_join)
        upserting["deletes"] = bool(after_join)
    elif after_join:
        final += f" WHERE {after_join}"
    bounds = (low[0] // 1000, -(-high[0] // 1000)) if interval else None
    inclusive = (True, True) if how == "inner" else (not low[1], not high[1])  # inner: WHERE checks exactly
    return StreamJoin((views[0], views[1]), (pre[0], pre[1]), keys, (rowtime_names[0], rowtime_names[1]), bounds,
                      final, rowtime, join.origin.clause(query) or "JOIN", on, how=how, inclusive=inclusive,
                      windowed=ends is not None, **upserting)


# ------------------------------------------------------------------ the plan's shape
def _above_join(query: str, root: Node, aggregated: bool = False) -> tuple[list[Node], Node]:
    """The Project and Filter nodes above the join (top first), and the join; below an
    aggregation, Filter nodes only."""
    above, node = [], root
    while node.kind in ("Project", "Filter", "SubqueryAlias") and node.children:
        above.append(node)
        node = node.children[0]
    if node.kind != "Join":
        raise _refusal(query, root)
    projects = [n.kind for n in above if n.kind != "Filter"]
    top = "Filter" if aggregated else "Project"  # an aggregation reads the join's rows; a query, its select list
    if projects not in ([], ["Project"]) or (above and above[0].kind != top) or (aggregated and projects):
        raise UnsupportedQuery(query, node, "a query over a join's subquery is not planned yet: select from the "
                               "join itself (SELECT ... FROM a JOIN b ON ... WHERE ...)")
    if sum(n.kind == "Join" for n in root.walk()) > 1:
        raise UnsupportedQuery(query, node, "a join of more than two streams is not planned yet: join two in a "
                               "view of their own (create_temporary_view) and that view with the third")
    return above, node


def _view(side: Node) -> str:
    """The view a side reads: the name of the alias over its View node."""
    for node in side.walk():
        if node.kind == "SubqueryAlias" and node.children and node.children[0].kind == "View":
            return (node.alias or "").lower()
    raise ValueError("a side without a view")


def _time_column(side: Node, rowtime: Optional[str]) -> Optional[Column]:
    """The side's column that is its view's event time, read as it is."""
    if rowtime is None:
        return None
    found = [c for c in side.output if c.name == rowtime]
    return found[0] if len(found) == 1 else None


def _column_sql(column: Column) -> str:
    """As Spark writes an attribute in an expression's SQL."""
    return ".".join(quoted_if_needed(p) for p in (*column.qualifier, column.name))


# ------------------------------------------------------------------ conditions
def _conjuncts(condition: Expr) -> list[Expr]:
    if condition.kind == "And":
        return [c for child in condition.children for c in _conjuncts(child)]
    if condition.kind == "Between":  # analysed as With(lower AND upper, the tested expression)
        shape = condition.children[0]
        if shape.kind != "With" or len(shape.children) != 2 or shape.children[0].kind != "And":
            return [condition]
        tested, both = shape.children[1].children[0], shape.children[0]
        return [Expr(c.kind, f"({tested.sql} {_COMPARISONS[c.kind]} {c.children[1].sql})", data_type="boolean",
                     children=(tested, c.children[1])) for c in both.children]
    return [condition]


def _sql(query: str, join: Node, condition: Expr) -> str:
    if "commonexpressionref()" in condition.sql:  # a BETWEEN that _conjuncts could not take apart
        raise UnsupportedQuery(query, join, f"{condition.sql}: write this BETWEEN of the join as two comparisons "
                               "(x >= low AND x <= high)")
    return condition.sql


def _attributes(e: Expr) -> list[tuple[tuple[str, ...], str]]:
    return [(a.qualifier, a.name) for a in e.walk() if a.kind == "AttributeReference"]


def _side_of(e: Expr, owner: dict) -> Optional[int]:
    sides = {owner.get(a) for a in _attributes(e)}
    return sides.pop() if len(sides) == 1 and None not in sides else None


def _key_pair(condition: Expr, owner: dict) -> Optional[tuple[Expr, Expr]]:
    """(left expression, right expression) of an equality of the two sides."""
    if condition.kind != "EqualTo":
        return None
    a, b = condition.children
    sides = (_side_of(a, owner), _side_of(b, owner))
    if sides == (0, 1):
        return a, b
    if sides == (1, 0):
        return b, a
    return None


def _bound(condition: Expr, owner: dict, times: Sequence[Optional[Column]],
           offset: Offset) -> Optional[tuple[str, int, bool]]:
    """A comparison of the two sides' event times (each plus a constant) as a bound on
    right.ts - left.ts: (">=" or "<=", µs, strict); None for any other condition."""
    if condition.kind not in _COMPARISONS or condition.kind == "EqualTo" or None in times:
        return None
    a, b = condition.children
    at = []
    for e in (a, b):
        side = _side_of(e, owner)
        time = times[side] if side is not None else None
        if time is None or set(_attributes(e)) != {(time.qualifier, time.name)}:
            return None
        constants = set()
        for origin in ORIGINS:
            at_origin = f"CAST(TIMESTAMP '{origin}' AS {time.data_type.upper()})"
            constants.add(offset(_replace(e.sql, {_column_sql(time): at_origin}), at_origin))
        if len(constants) != 1:  # not the time plus a fixed length
            return None
        at.append((side, constants.pop()))
    (side_a, c_a), (side_b, c_b) = at
    if side_a == side_b:
        return None
    op = _COMPARISONS[condition.kind]
    # a.ts + c_a  op  b.ts + c_b, with d = right.ts - left.ts
    if side_a == 0:   # left + c_a op right + c_b  <=>  c_a - c_b op d  <=>  d (flipped op) c_a - c_b
        op, constant = _FLIPPED[op], c_a - c_b
    else:             # right + c_a op left + c_b  <=>  d op c_b - c_a
        constant = c_b - c_a
    return (">=" if ">" in op else "<="), constant, op in (">", "<")


def _structs(sides: Sequence[Node], read: set, columns: dict[str, str]) -> str:
    """The result step's select for an aggregation above: each side's columns it reads as a struct
    named as the side, so that ``o.city`` reads the struct ``o``'s field ``city``. ``columns``: each
    side column's SQL -> its column in the joined rows."""
    structs = []
    for side in sides:
        fields = [f"'{c.name.replace(chr(39), chr(39) * 2)}', {columns[_column_sql(c)]}"
                  for c in side.output if (c.qualifier, c.name) in read]
        if fields:
            structs.append(f"named_struct({', '.join(fields)}) AS {quoted(side.output[0].qualifier[-1])}")
    return f"SELECT {', '.join(structs) or '1 AS `__sql_row`'} FROM input"


def _final(project: Optional[Node], join: Node, columns: dict[str, str],
           left_time: Optional[Column]) -> tuple[str, Optional[str]]:
    """The result step's select over the joined rows (``columns``: each side column's SQL -> its
    column there), and the result's event-time column (the left's time selected as it is)."""
    outputs = project.expressions if project is not None else tuple(
        Expr("AttributeReference", _column_sql(c), c.name, c.qualifier, c.data_type) for c in join.output)
    seen: Counter = Counter()
    selected, rowtime = [], None
    for e in outputs:
        body = e.children[0] if e.kind == "Alias" else e
        name = e.name or body.sql
        if seen[name]:  # as Flink names a repeated column of a join: ts, ts0, ts1, ...
            name = f"{name}{seen[name] - 1}"
        seen[e.name or body.sql] += 1
        selected.append(f"{_replace(body.sql, columns)} AS {quoted(name)}")
        if left_time is not None and rowtime is None and body.kind == "AttributeReference" and \
                (body.qualifier, body.name) == (left_time.qualifier, left_time.name):
            rowtime = name
    return f"SELECT {', '.join(selected)} FROM input", rowtime
