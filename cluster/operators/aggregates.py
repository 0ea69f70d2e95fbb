"""The aggregate functions of ``aggregate(...)``: how each is computed per batch as partial
aggregates (in pandas, or in Spark SQL when a Spark step comes before the exchange), merged into
keyed state across batches, and read out as the function's value.

A function is a few partials (Flink's accumulator, Spark's partial aggregation buffer): a sum, a
count, a minimum, a maximum, a sum of squares (variance), the set or list of values (DISTINCT,
collect_set, collect_list), the first or last value. Each partial merges two of itself, which is
what lets a batch's partials be computed before the shuffle and merged with the state after it.

Functions are named as pandas names them (sum, count, min, max, mean, nunique, first, last, std,
var), and as Spark does where pandas has no name (std_pop, var_pop, collect_list, collect_set,
sum_distinct, mean_distinct, first_row, last_row). pandas' first and last skip nulls; Spark's
``first(v)``, the first row's value null or not, is first_row.

Thread use: any thread (pure functions and constants).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from cluster.graph.aggregations import AGGREGATE_FUNCTIONS, WINDOW_AGGREGATE_FUNCTIONS


def _null(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _both(merge: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A merge of two partials where either may be null (a sum of only nulls, in Spark)."""
    return lambda a, b: b if _null(a) else a if _null(b) else merge(a, b)


def _values(value: Any) -> tuple:
    """A set or list partial as a tuple: Spark's collect_set comes as an array, a state as a tuple."""
    if _null(value):
        return ()
    return tuple(value.tolist() if isinstance(value, np.ndarray) else value)


def _union(a: Any, b: Any) -> tuple:
    return tuple(dict.fromkeys(_values(a) + _values(b)))


def _concat(a: Any, b: Any) -> tuple:
    return _values(a) + _values(b)


def _first_valid(a: Any, b: Any) -> Any:
    return b if _null(a) else a


def _last_valid(a: Any, b: Any) -> Any:
    return a if _null(b) else b


def _squares(frame: pd.DataFrame, column: str, key: list[str]) -> pd.Series:
    squares = frame[column].astype(float) ** 2
    return squares.groupby([frame[k] for k in key], sort=False, dropna=False).sum()


def _first_valid_of(values: pd.Series) -> Any:
    return next((v for v in values.tolist() if not _null(v)), None)


def _last_valid_of(values: pd.Series) -> Any:
    return next((v for v in reversed(values.tolist()) if not _null(v)), None)


def _distinct_of(values: pd.Series) -> tuple:
    return tuple(dict.fromkeys(v for v in values.tolist() if not _null(v)))


def _list_of(values: pd.Series) -> tuple:
    return tuple(v for v in values.tolist() if not _null(v))


@dataclass(frozen=True)
class Partial:
    """One partial aggregate of a column: over a batch's rows, in Spark SQL, and merged."""

    spark: str                                           # SQL over the rows, {c}: the column
    rows: Callable[[pd.DataFrame, str, list[str]], pd.Series]  # pandas over the rows, by key
    merge: Callable[[Any, Any], Any]                     # two partials of a key, the earlier first
    vectorised: bool = True                              # a number: the windows' Arrow and numpy paths take it


def _grouped(how: str) -> Callable[[pd.DataFrame, str, list[str]], pd.Series]:
    return lambda frame, column, key: getattr(frame.groupby(key, sort=False, dropna=False)[column], how)()


def _grouped_by(fn: Callable[[pd.Series], Any]) -> Callable[[pd.DataFrame, str, list[str]], pd.Series]:
    return lambda frame, column, key: frame.groupby(key, sort=False, dropna=False)[column].agg(fn)


PARTIALS: dict[str, Partial] = {
    "s": Partial("sum({c})", _grouped("sum"), _both(lambda a, b: a + b)),
    "c": Partial("count({c})", _grouped("count"), lambda a, b: a + b),
    "min": Partial("min({c})", _grouped("min"), _both(min)),
    "max": Partial("max({c})", _grouped("max"), _both(max)),
    "q": Partial("sum(CAST({c} AS DOUBLE) * CAST({c} AS DOUBLE))", _squares, _both(lambda a, b: a + b)),
    "set": Partial("collect_set({c})", _grouped_by(_distinct_of), _union, vectorised=False),
    "list": Partial("collect_list({c})", _grouped_by(_list_of), _concat, vectorised=False),
    "first": Partial("first({c}, true)", _grouped_by(_first_valid_of), _first_valid,
                     vectorised=False),
    "last": Partial("last({c}, true)", _grouped_by(_last_valid_of), _last_valid,
                    vectorised=False),
    "first_row": Partial("first({c})", _grouped_by(lambda s: s.iloc[0]), lambda a, b: a, vectorised=False),
    "last_row": Partial("last({c})", _grouped_by(lambda s: s.iloc[-1]), lambda a, b: b, vectorised=False),
}


def _mean(s: Any, c: Any) -> Any:
    return None if not c or _null(s) else s / c


def _variance(ddof: int) -> Callable[[Any, Any, Any], Any]:
    def variance(s: Any, c: Any, q: Any) -> Any:
        if _null(s) or c is None or c - ddof <= 0:
            return None
        return max(q - s * s / c, 0.0) / (c - ddof)  # rounding can take an exact 0 below it
    return variance


def _root(variance: Callable[[Any, Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
    def deviation(s: Any, c: Any, q: Any) -> Any:
        value = variance(s, c, q)
        return None if value is None else math.sqrt(value)
    return deviation


def _distinct_sum(values: Any) -> Any:
    values = _values(values)
    return sum(values) if values else None


def _distinct_mean(values: Any) -> Any:
    values = _values(values)
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Function:
    """An aggregate function: its partials, and its value from them (one key's)."""

    partials: tuple[str, ...]
    value: Callable[..., Any]

    @property
    def vectorised(self) -> bool:
        return all(PARTIALS[p].vectorised for p in self.partials)


_SAME = lambda x: x  # noqa: E731: the partial is the value

FUNCTIONS: dict[str, Function] = {
    "sum": Function(("s",), _SAME),
    "count": Function(("c",), _SAME),
    "min": Function(("min",), _SAME),
    "max": Function(("max",), _SAME),
    "mean": Function(("s", "c"), _mean),
    "var": Function(("s", "c", "q"), _variance(1)),
    "var_pop": Function(("s", "c", "q"), _variance(0)),
    "std": Function(("s", "c", "q"), _root(_variance(1))),
    "std_pop": Function(("s", "c", "q"), _root(_variance(0))),
    "nunique": Function(("set",), lambda values: len(_values(values))),
    "sum_distinct": Function(("set",), _distinct_sum),
    "mean_distinct": Function(("set",), _distinct_mean),
    "collect_set": Function(("set",), lambda values: list(_values(values))),
    "collect_list": Function(("list",), lambda values: list(_values(values))),
    "first": Function(("first",), _SAME),
    "last": Function(("last",), _SAME),
    "first_row": Function(("first_row",), _SAME),
    "last_row": Function(("last_row",), _SAME),
}

# the pandas aggregation that merges a numeric partial's values within a batch
MERGE_IN_BATCH = {"s": "sum", "c": "sum", "min": "min", "max": "max", "q": "sum"}

assert set(FUNCTIONS) == set(AGGREGATE_FUNCTIONS) and all(FUNCTIONS[f].vectorised for f in WINDOW_AGGREGATE_FUNCTIONS)


def partial_columns(aggregations: dict) -> list[tuple[str, str, str]]:
    """(partial column name, partial kind, source column) for named aggregations {out: [col, func]}."""
    return [(f"__{out}__{kind}", kind, column) for out, (column, func) in aggregations.items()
            for kind in FUNCTIONS[func].partials]


def values(func: str, partials: dict[str, Any]) -> Any:
    """The function's values from its partials' columns by kind (equal-length sequences): a
    numpy array for a mean, else the values as a list (a count stays an integer column)."""
    function = FUNCTIONS[func]
    if function.value is _SAME:
        return partials[function.partials[0]]
    if func == "mean":
        return np.asarray(partials["s"], dtype=float) / np.asarray(partials["c"])
    columns = [list(partials[p]) for p in function.partials]
    return [function.value(*row) for row in zip(*columns)]


def values_of(out: str, func: str, columns: Mapping[str, Any]) -> Any:
    """``values`` of the aggregation named ``out`` from its partials' columns, by their names in
    partial_columns."""
    return values(func, {kind: columns[f"__{out}__{kind}"] for kind in FUNCTIONS[func].partials})


def value_of(out: str, func: str, partials: Mapping[str, Any]) -> Any:
    """One key's value of the aggregation named ``out`` from its partials, by their names in
    partial_columns."""
    return FUNCTIONS[func].value(*(partials[f"__{out}__{kind}"] for kind in FUNCTIONS[func].partials))
