"""Spark's analyser in the client: a query over the view ``input`` of a known schema, analysed by a
SparkSession of the client's own, turned into plain data (plan.Node).

This is the client's one reach into Catalyst (the TaskManagers' is cluster/spark/catalyst.py):
``queryExecution().analyzed()`` and the nodes' and expressions' accessors, through py4j. The
session starts on the first query that needs it (a few seconds and a JVM, so a notebook whose
queries only project and filter never starts one); it is a ``newSession()`` of the process's
active session when there is one, so the planner's view ``input`` never replaces a user's.

Thread use: any thread; one analysis at a time (the lock), as the view ``input`` is the session's.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

import pyarrow as pa

from kernel_runtime.api.sql.plan import Column, Expr, Node, Origin, WindowCall

_lock = threading.Lock()
_session: Any = None
# how the planner's session is made when the process has none active (tests give the suite's)
session_factory: Optional[Callable[[], Any]] = None
# what ``warm_up`` waits for before it starts the session, set by a notebook's session (its
# cluster's TaskManagers starting their JVMs: a first row waits for those, not for this one);
# None, as in scripts and exported jobs, starts none ahead of need
warm_up_after: Optional[Callable[[], None]] = None
_warming: Optional[threading.Thread] = None
WARM_UP_QUERY = "SELECT id, upper(name) AS name, id * 2 AS twice FROM input WHERE id > 1"
_views: set[str] = set()  # the views _over_views made in the planner's session (under _lock)
log = logging.getLogger(__name__)


class SqlAnalysisError(Exception):
    """Spark refused the query (its AnalysisException or ParseException): the message is Spark's."""

    def __init__(self, message: str, condition: str = ""):
        super().__init__(message)
        self.condition = condition  # Spark's error condition, e.g. TABLE_OR_VIEW_NOT_FOUND


# where the planner's JVM writes (its start-up notes and warnings): not into a notebook's cells
LOG_FILE = Path(tempfile.gettempdir()) / f"streamlab-sql-planner-{os.getuid()}.log"


@contextmanager
def _output_to(path: Path):
    """This process's standard output and error (file descriptors 1 and 2) into ``path`` while
    the block runs: a process started meanwhile (the JVM) keeps writing there."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _new_session() -> Any:
    if session_factory is not None:
        return session_factory()
    from pyspark.sql import SparkSession

    from cluster.spark.class_data import driver_conf
    # the JVM analyses a few small plans: the C1 compiler alone starts it in about half the CPU
    conf = driver_conf({
        "spark.master": "local[1]", "spark.app.name": "streamlab SQL planner", "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "1",
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        # its catalog's folder, which Spark makes in the working directory (a user's notebooks) by default
        "spark.sql.warehouse.dir": str(LOG_FILE.with_name(f"streamlab-sql-planner-warehouse-{os.getuid()}")),
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"})
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    with _output_to(LOG_FILE):
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def planner_session() -> Any:
    global _session
    if _session is None:
        from pyspark.sql import SparkSession
        active = SparkSession.getActiveSession()
        _session = (active or _new_session()).newSession()
    return _session


def analyses_every_query() -> bool:
    """Whether a query that only projects and filters is analysed as it is written too: in a
    notebook (``warm_up_after`` set), once the session is up (an analysis then takes milliseconds,
    not a JVM's start). Elsewhere the job's first task analyses it, as it always does."""
    return warm_up_after is not None and _session is not None


def warm_up() -> None:
    """Start the session on a thread of its own after ``warm_up_after`` returns (nothing without
    it, or once started)."""
    global _warming
    gate = warm_up_after
    if gate is None or _session is not None or _warming is not None:
        return

    def start() -> None:
        try:
            gate()
            with _lock:
                planner_session()
            # a first analysis, so that a cell's is not the JVM's first (0.5 s, then 0.1 s)
            analyse(WARM_UP_QUERY, pa.schema([("id", pa.int64()), ("name", pa.string())]))
        except Exception:  # the next query that needs the session starts it, and says why it cannot
            log.warning("the SQL planner's SparkSession did not start ahead of need", exc_info=True)
    _warming = threading.Thread(target=start, name="streamlab-sql-planner-warm-up", daemon=True)
    _warming.start()


def analyse(query: str, schema: pa.Schema, view: str = "input") -> Node:
    """The analysed plan of ``query`` over the view ``view`` with ``schema``; SqlAnalysisError
    with Spark's message if Spark refuses it."""
    return analyse_views(query, {view: schema})


def analyse_views(query: str, schemas: dict[str, pa.Schema]) -> Node:
    """The analysed plan of ``query`` over empty views of these names and schemas; SqlAnalysisError
    with Spark's message if Spark refuses it."""
    from pyspark.errors import PySparkException
    from pyspark.logger import PySparkLogger
    with _lock:
        session = _over_views(schemas)
        # PySpark logs each refusal with its stack; its own getLogger, as a plain logging one of
        # that name would take the place of PySpark's and fail its calls (they pass errorClass=)
        quiet = PySparkLogger.getLogger("SQLQueryContextLogger")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # setLevel, not .level: it clears the loggers' cached levels
        try:
            plan = session.sql(query)._jdf.queryExecution().analyzed()
        except PySparkException as exc:
            condition = exc.getCondition() if hasattr(exc, "getCondition") else ""
            # Spark's message, without the plan it appends
            raise SqlAnalysisError(str(exc).strip().split("\n")[0].rstrip(";"), condition or "") from None
        finally:
            quiet.setLevel(level)
        return _node(plan)


def window_calls(query: str) -> list[WindowCall]:
    """The query's time window calls, as written (its parsed plan: no schema needed); SqlAnalysisError
    for a window whose durations are not literals."""
    from py4j.java_gateway import get_field
    with _lock:
        session = planner_session()
        parsed = _parsed(session, query)
        jvm = session._jvm
        calls = []
        for call in _calls_in(parsed, ("window", "session_window")):
            arguments = _seq(call.arguments())
            column = arguments[0]
            if column.getClass().getSimpleName() != "UnresolvedAttribute" or any(
                    a.getClass().getSimpleName() != "Literal" for a in arguments[1:]):
                raise SqlAnalysisError(f"{call.prettyName()}(...) takes a column and durations written as "
                                       f"strings ('10 seconds'), got {call.toString()}")
            durations = []
            for literal in arguments[1:]:
                interval = jvm.org.apache.spark.sql.catalyst.util.IntervalUtils.stringToInterval(literal.value())
                days, micros = get_field(interval, "days"), get_field(interval, "microseconds")  # public fields
                durations.append(days * 86_400_000 + micros // 1000)
            calls.append(WindowCall(call.prettyName().lower(), column.name(), tuple(durations)))
        return calls


def _parsed(session, query: str) -> Any:
    """The query's parsed (unresolved) plan: Spark's parser, no schema needed."""
    return session._jsparkSession.sessionState().sqlParser().parsePlan(query)


def _calls_in(plan, names: tuple[str, ...]) -> list:
    """The unresolved function calls of these names in every expression of a parsed plan."""
    found: list = []

    def visit(expression) -> None:
        if expression.getClass().getSimpleName() == "UnresolvedFunction" and \
                expression.nameParts().last().lower() in names:
            found.append(expression)
        for child in _seq(expression.children()):
            visit(child)

    def walk(node) -> None:
        for expression in _seq(node.expressions()):
            visit(expression)
        for child in _seq(node.children()):
            walk(child)
    walk(plan)
    return found


def output_schema(query: str, schema: pa.Schema) -> pa.Schema:
    """The schema of a per-batch query's rows over an input of ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema
    with _lock:
        return to_arrow_schema(_over_views({"input": schema}).sql(query).schema)


def query_output_schema(query: str, schemas: dict[str, pa.Schema]) -> pa.Schema:
    """The schema of the rows a query gives over views of ``schemas``, as Spark analyses it."""
    from pyspark.sql.pandas.types import to_arrow_schema
    with _lock:
        session = _over_views(schemas)
        return to_arrow_schema(session.sql(query).schema, timezone=session.conf.get("spark.sql.session.timeZone"))


def offset_us(timestamp: str, origin: str) -> int:
    """``timestamp - origin`` in microseconds, two constant timestamp expressions as SQL (a join's
    time bound: Spark's own interval arithmetic, time zones and all)."""
    with _lock:
        row = planner_session().sql(f"SELECT unix_micros(CAST({timestamp} AS TIMESTAMP)) - "
                                    f"unix_micros(CAST({origin} AS TIMESTAMP))").collect()[0]
        if row[0] is None:
            raise SqlAnalysisError(f"{timestamp} is not a fixed distance from a time")
        return int(row[0])


def _over_views(schemas: dict[str, pa.Schema]) -> Any:
    """The planner's session with an empty view of each schema (the only ones: the last query's
    are dropped). By the JVM's own calls: the catalog's list of tables and PySpark's
    createDataFrame took 0.3-0.8 s of a notebook's first analysis, these take 0.02 s."""
    from pyspark.sql.pandas.types import from_arrow_schema
    session = planner_session()
    for view in _views:
        session.catalog.dropTempView(view)
    _views.clear()
    jsession = session._jsparkSession
    for view, schema in schemas.items():
        struct = jsession.parseDataType(from_arrow_schema(schema).json())
        jsession.createDataFrame(session._jvm.java.util.ArrayList(), struct).createOrReplaceTempView(view)
        _views.add(view)
    return session


def relations(query: str) -> list[str]:
    """The names of the tables and views the query reads (its parsed plan's), lower case, in order."""
    with _lock:
        parsed = _parsed(planner_session(), query)
        names: list[str] = []

        def walk(node) -> None:
            if node.getClass().getSimpleName() == "UnresolvedRelation":
                names.append(str(node.tableName()).lower())
            for child in _seq(node.children()):
                walk(child)
        walk(parsed)
        return list(dict.fromkeys(names))


# ------------------------------------------------------------------ Catalyst objects -> plan data
def _seq(scala_seq) -> list:
    out, it = [], scala_seq.iterator()
    while it.hasNext():
        out.append(it.next())
    return out


def _option(value) -> Optional[Any]:
    return value.get() if value.isDefined() else None


def _origin(obj) -> Origin:
    origin = obj.origin()
    return Origin(_option(origin.line()), _option(origin.startIndex()), _option(origin.stopIndex()))


def _expr(e) -> Expr:
    kind = e.getClass().getSimpleName()
    name = e.name() if kind in ("AttributeReference", "Alias") else ""
    qualifier = tuple(_seq(e.qualifier())) if kind == "AttributeReference" else ()
    distinct = filtered = ignore_nulls = False
    if kind == "AggregateExpression":
        distinct, filtered = bool(e.isDistinct()), _option(e.filter()) is not None
    elif kind in ("First", "Last", "AnyValue"):
        ignore_nulls = bool(e.ignoreNulls())
    try:
        data_type = e.dataType().simpleString()
    except Exception:  # an expression without a type (a window spec, a sort order's direction)
        data_type = ""
    return Expr(kind, e.sql(), name, qualifier, data_type, tuple(_expr(c) for c in _seq(e.children())),
                distinct, filtered, ignore_nulls)


def _column(a) -> Column:
    return Column(a.name(), tuple(_seq(a.qualifier())), a.dataType().simpleString())


def _node(n) -> Node:
    kind = n.nodeName()
    fields: dict = {}
    if kind == "Project":
        fields["expressions"] = tuple(_expr(e) for e in _seq(n.projectList()))
    elif kind == "Filter":
        fields["expressions"] = (_expr(n.condition()),)
    elif kind == "Aggregate":
        fields["grouping"] = tuple(_expr(e) for e in _seq(n.groupingExpressions()))
        fields["aggregates"] = tuple(_expr(e) for e in _seq(n.aggregateExpressions()))
    elif kind == "SubqueryAlias":
        fields["alias"] = n.alias()
    elif kind == "Window":
        fields["expressions"] = tuple(_expr(e) for e in _seq(n.windowExpressions()))
        fields["grouping"] = tuple(_expr(e) for e in _seq(n.partitionSpec()))
        fields["order"] = tuple(_expr(e) for e in _seq(n.orderSpec()))
    elif kind == "Join":
        fields["join_type"] = n.joinType().sql()
        condition = _option(n.condition())
        fields["expressions"] = () if condition is None else (_expr(condition),)
    return Node(kind, tuple(_node(c) for c in _seq(n.children())), tuple(_column(a) for a in _seq(n.output())),
                _origin(n), **fields)
