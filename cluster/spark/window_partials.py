"""The window pre-aggregation as a step of a Spark plan: the partial rows that
cluster.operators.windowing.pre_aggregation makes in pandas (key, window_start, window_end, the
partial columns, __rows__, __latest__), made by one Spark SQL query per batch upstream of the
exchange.

It lives in the Spark runner, not beside the window operator: the operator is generic over where
its partial rows come from, and SQL text for Spark is the runner's business (cluster.spark.chain
puts this step into a chain's plan).

Thread use: whichever thread runs the chain's Spark plan (the task's, or the Spark stage's).
"""
from __future__ import annotations

from typing import Callable

from cluster.graph.windows import SessionWindows, assigner_of
from cluster.graph.schema import quoted
from cluster.operators.aggregates import partial_columns
from cluster.operators.windowing.pre_aggregation import LATEST, ROWS


def spark_window_partials(spec: dict) -> Callable:
    """The same partial rows as a step of a Spark plan: a function DataFrame -> DataFrame that
    runs one SQL query (a few py4j calls per batch, where building the plan of column expressions
    took dozens: some 0.5 s a batch with the task's other threads holding the GIL)."""
    assigner = assigner_of(spec["assigner"], "the window pre-aggregation")
    if isinstance(assigner, SessionWindows):
        raise ValueError("the window pre-aggregation: session windows cannot be pre-aggregated (they merge)")
    key, rowtime, aggregations = list(spec["key"]), spec["rowtime"], spec["aggregations"]
    view = "__window_input"
    queries: dict[str, str] = {}  # by the rowtime column's Spark type

    def step(df):
        from pyspark.sql import types as T
        schema = df.schema  # one round trip to the JVM
        if rowtime not in schema.names:
            raise ValueError(f"the timestamp column {rowtime!r} is not in its input (columns: {schema.names})")
        kind = schema[rowtime].dataType
        if isinstance(kind, (T.TimestampType, T.TimestampNTZType, T.DateType)):
            ts = f"unix_millis(CAST({quoted(rowtime)} AS TIMESTAMP))"
        elif isinstance(kind, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
            ts = f"CAST({quoted(rowtime)} AS BIGINT)"
        else:
            raise ValueError(f"the timestamp column {rowtime!r} is {kind.simpleString()}, not a time: give a "
                             "timestamp column or integer epoch milliseconds")
        query = queries.get(ts)
        if query is None:
            query = queries[ts] = window_partials_sql(view, key, ts, assigner, aggregations)
        df.createOrReplaceTempView(view)
        return df.sparkSession.sql(query)

    return step


def window_partials_sql(view: str, key: list[str], ts: str, assigner, aggregations: dict) -> str:
    """The partial rows of every batch row's windows, as Spark SQL over ``view`` whose event time
    in epoch ms is the expression ``ts``: key, window_start, window_end, the partial columns,
    __rows__ and __latest__."""
    size = assigner.size
    slide = getattr(assigner, "slide", size)
    count = -(-size // slide)
    keys = "".join(f"{quoted(k)}, " for k in key)
    last = f"(__ts__ - pmod(__ts__ - {assigner.offset}, {slide}))"  # the start of a row's latest window
    functions = {"s": "sum", "c": "count", "min": "min", "max": "max"}
    partials = partial_columns(aggregations)
    rows = f"SELECT *, {ts} AS __ts__ FROM {view}"
    if count == 1:
        spread = f"SELECT *, {last} AS window_start FROM ({rows})"
        aggs = [f"{functions[k]}({quoted(c)}) AS {quoted(n)}" for n, k, c in partials]
        aggs += [f"count(1) AS {ROWS}", f"count(1) AS {LATEST}"]
    elif size % slide == 0:
        # a row's windows then depend on its pane (its latest window's start) alone: aggregate per
        # key and pane first and spread the panes over their windows, count times fewer rows
        # through the explode than spreading the rows
        pane_aggs = ", ".join([f"{functions[k]}({quoted(c)}) AS {quoted(n)}" for n, k, c in partials]
                              + [f"count(1) AS {ROWS}"])
        panes = f"SELECT {keys}{last} AS __pane__, {pane_aggs} FROM ({rows}) GROUP BY {keys}{last}"
        spread = (f"SELECT *, __pane__ - __k__ * {slide} AS window_start FROM ({panes}) "
                  f"LATERAL VIEW explode(sequence(0, {count - 1})) AS __k__")
        merge = {"s": "sum", "c": "sum", "min": "min", "max": "max"}
        aggs = [f"{merge[k]}({quoted(n)}) AS {quoted(n)}" for n, k, _ in partials]
        aggs += [f"CAST(sum({ROWS}) AS BIGINT) AS {ROWS}",
                 f"CAST(sum(CASE WHEN __k__ = 0 THEN {ROWS} ELSE 0 END) AS BIGINT) AS {LATEST}"]
    else:
        spread = (f"SELECT * FROM (SELECT *, {last} - __k__ * {slide} AS window_start FROM ({rows}) "
                  f"LATERAL VIEW explode(sequence(0, {count - 1})) AS __k__) WHERE window_start > __ts__ - {size}")
        aggs = [f"{functions[k]}({quoted(c)}) AS {quoted(n)}" for n, k, c in partials]
        aggs += [f"count(1) AS {ROWS}", f"CAST(sum(CASE WHEN __k__ = 0 THEN 1 ELSE 0 END) AS BIGINT) AS {LATEST}"]
    return (f"SELECT {keys}window_start, window_start + {size} AS window_end, {', '.join(aggs)} "
            f"FROM ({spread}) GROUP BY {keys}window_start")
