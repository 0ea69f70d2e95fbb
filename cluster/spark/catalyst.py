"""The one module that touches Spark's internals: every py4j reach into Catalyst and PySpark's private
entry points goes through here, so that a Spark upgrade that moves one breaks this file, not six.

Four fast paths stand on those internals, each a step faster than the one below it:
* the Arrow bridge (arrow.py): batches in by ``PythonSQLUtils``' Arrow file reader, SQL straight
  on the Java session, rows out by ``collectAsArrowToPython``'s socket;
* the kept plan (plans.py): a chain's analysed plan copied over each batch's input leaf;
* the local batch (local.py, jvm/LocalBatch.java): a small batch in the driver, without a job;
* the BatchJob (plans.py, jvm/BatchJob.java): a batch through a kept plan in one py4j call.

pyspark is pinned (pyproject.toml), yet a pin is no proof: when the TaskManager's session starts,
``probe`` runs each path once over a few rows and compares them with PySpark's public path
(``createDataFrame``, ``sql``, ``toArrow``). A path that fails or gives other rows is turned off
with a warning that names it, and so is every path that stands on it. At run time a path that
fails inside the internals (``internal_failure``: a method or class py4j cannot find, a linkage
error or a cast of our helpers) sends its chain to the public path; a failure of the user's query
(an AnalysisException, a division by zero under ANSI mode, a bad cast) is Spark's answer to that
query, not ours, and fails the task as before.

Thread use: any thread (the functions hold no state; ``probe`` runs once, on the session's start).
"""
from __future__ import annotations

import json
import logging
from contextlib import AbstractContextManager
from typing import Any, Callable, Optional, Protocol, TypeVar

import pyarrow as pa

log = logging.getLogger(__name__)

SPARK_VERSION = "4.3"  # the Spark (major.minor) whose internals this module was written against
ARROW_BRIDGE, KEPT_PLAN, LOCAL_BATCH, BATCH_JOB = "Arrow bridge", "kept plan", "local batch", "BatchJob"
FAST_PATHS = (ARROW_BRIDGE, KEPT_PLAN, LOCAL_BATCH, BATCH_JOB)  # in probing order: each after what it needs
NEEDS = {KEPT_PLAN: ARROW_BRIDGE, LOCAL_BATCH: KEPT_PLAN, BATCH_JOB: KEPT_PLAN}
# Java's linkage and cast errors: the JVM's word that our code and this Spark do not fit together
INTERNAL_JAVA_ERRORS = frozenset({
    "java.lang.NoSuchMethodError", "java.lang.NoSuchFieldError", "java.lang.ClassNotFoundException",
    "java.lang.NoClassDefFoundError", "java.lang.ClassCastException", "java.lang.AbstractMethodError",
    "java.lang.IncompatibleClassChangeError", "java.lang.IllegalAccessError"})

INPUT_LEAF = "LogicalRDD"  # an Arrow batch's relation (arrow.ArrowBridge, PySpark's createDataFrame)
# the leaves besides its input that a plan shared by every job may read: constants, the same for all
CONSTANT_LEAVES = ("LocalRelation", "OneRowRelation", "Range")
NAME_ONLY = ("SubqueryAlias", "View")  # analysed-plan nodes that only name what is below them

T = TypeVar("T")


class Refs(Protocol):
    """What a batch's Java objects are released with (arrow.JvmRefs)."""

    def add(self, obj: T) -> T: ...


# ------------------------------------------------------------------ the probe and the fallback
def probe(version: str, trials: dict[str, Optional[Callable[[], pa.Table]]], expected: pa.Table) -> frozenset[str]:
    """The fast paths that work on this Spark: each trial (None: its helper is not loaded) must
    give ``expected``, PySpark's public path's rows; the others are off, each with a warning."""
    if ".".join(version.split(".")[:2]) != SPARK_VERSION:
        log.warning("Spark %s is not the Spark %s streamlab's fast paths were written for: each is probed",
                    version, SPARK_VERSION)
    working: set[str] = set()
    for name in FAST_PATHS:
        trial = trials.get(name)
        need = NEEDS.get(name)
        why = None
        if need is not None and need not in working:
            why = f"it needs the {need}, which is off"
        elif trial is None:
            why = "its Java helper is not loaded"
        else:
            try:
                got = trial()
            except Exception as exc:
                why = f"its probe failed: {type(exc).__name__}: {first_line(exc)}"
            else:
                if got.to_pydict() != expected.to_pydict():
                    why = f"its probe gave {got.to_pydict()} where PySpark gives {expected.to_pydict()}"
        if why is None:
            working.add(name)
        else:
            log.warning("Spark's fast path '%s' is off: %s; its batches take a slower path", name, why)
    return frozenset(working)


def internal_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a fast path failing inside Spark's internals, not Spark's answer to a query."""
    from py4j.protocol import Py4JError, Py4JJavaError
    if isinstance(exc, Py4JJavaError):
        return java_class(exc) in INTERNAL_JAVA_ERRORS
    if isinstance(exc, Py4JError):
        return True  # a method py4j cannot find ("... does not exist"), a field, a class
    # a class py4j cannot find is a package, which is not callable
    return isinstance(exc, TypeError) and "'JavaPackage' object is not callable" in str(exc)


def java_class(exc: BaseException) -> Optional[str]:
    java = getattr(exc, "java_exception", None)
    try:
        return None if java is None else java.getClass().getName()
    except Exception:
        return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ------------------------------------------------------------------ sessions, objects, helpers
def java_session(session) -> Any:
    return session._jsparkSession


def frame(session, jdf) -> Any:
    """A Java DataFrame as PySpark's DataFrame (what a ``.spark`` step gets)."""
    from pyspark.sql import DataFrame
    return DataFrame(jdf, session)


def java_frame(df) -> Any:
    return df._jdf


def is_frame(df) -> bool:
    from pyspark.sql import DataFrame
    return isinstance(df, DataFrame)


def detacher(session) -> Callable[[Any], None]:
    """What releases a Java object in the JVM now, not at Python's next cyclic collection."""
    return session.sparkContext._gateway.detach


def set_release_poll(seconds: float) -> None:
    """How long py4j's finalizer thread sleeps when no Java object waits to be released."""
    import py4j.clientserver
    if getattr(py4j.clientserver, "DEFAULT_WORKER_SLEEP_TIME", None) is None:
        log.warning("py4j has no DEFAULT_WORKER_SLEEP_TIME: Java objects are released at its pace")
        return
    py4j.clientserver.DEFAULT_WORKER_SLEEP_TIME = seconds


def is_java_object(obj: Any) -> bool:
    from py4j.java_gateway import JavaObject
    return isinstance(obj, JavaObject)


def temp_dir(session) -> Optional[str]:
    return getattr(session.sparkContext, "_temp_dir", None)


def spark_errors() -> AbstractContextManager:
    """A failed Spark job raised as PySpark raises it (its cause, converted), for our helpers' calls."""
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    return unwrap_spark_exception()


def load_helper(session, package: str, name: str) -> Optional[Any]:
    """streamlab's Java helper class ``package.name`` in the session's JVM, if the driver has it."""
    from py4j.java_gateway import JavaClass
    helper = getattr(getattr(session._jvm, package), name)
    if not isinstance(helper, JavaClass):
        log.warning("%s.%s is not on the Spark driver's class path: Spark batches take the slower way without it",
                    package, name)
        return None
    return helper


def job_count(session, group: str) -> int:
    """Spark's own count of a job group's jobs: the Java array's length, not PySpark's list of it,
    which is made one py4j call per job id, up to Spark's retained 1,000 jobs."""
    return len(session.sparkContext._jsc.statusTracker().getJobIdsForGroup(group))


# ------------------------------------------------------------------ Arrow in and out (the Arrow bridge)
def arrow_reader(session) -> tuple[Callable[[str], Any], Callable[[Any, str, Any], Any]]:
    """``PythonSQLUtils``' reader of an Arrow stream file and its maker of a DataFrame of it."""
    utils = session._jvm.PythonSQLUtils
    return utils.readArrowStreamFromFile, utils.toDataFrame


def register_view(jdf, view: str) -> None:
    """A Java DataFrame as the temp view of its session that a SQL step reads."""
    jdf.createOrReplaceTempView(view)


def columns(jdf) -> list[str]:
    return list(jdf.columns())


def with_column(jdf, name: str, column) -> Any:
    return jdf.withColumn(name, column)


def public_frame(session, table: pa.Table) -> Any:
    """PySpark's public way in: ``createDataFrame``, as a Java DataFrame."""
    return session.createDataFrame(table)._jdf


def sql(session, text: str) -> Any:
    """``text`` parsed and analysed on the Java session, without PySpark's bookkeeping."""
    return session._jsparkSession.sql(text)


def drop_view(session, view: str, refs: Refs) -> None:
    refs.add(session._jsparkSession.catalog()).dropTempView(view)


def public_sql(session, text: str) -> Any:
    return session.sql(text)._jdf


def public_arrow(session, jdf) -> pa.Table:
    """PySpark's public way out: ``toArrow``."""
    return frame(session, jdf).toArrow()


def partition_tag(session) -> Any:
    """``spark_partition_id()``, the column a fused job's rows say their partition by."""
    return session._jvm.org.apache.spark.sql.functions.spark_partition_id()


def collect_arrow(session, jdf, refs: Refs) -> pa.Table:
    """Run a Java DataFrame's plan and take its rows as one Arrow table, by ``collectAsArrowToPython``."""
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer
    from pyspark.util import _load_from_socket
    # indexed, not unpacked: unpacking a Java array asks the JVM its length before every item
    served = refs.add(jdf.collectAsArrowToPython())
    port, secret, server = served[0], served[1], refs.add(served[2])
    try:
        with _load_from_socket((port, secret), ArrowCollectSerializer()) as stream:
            batches = list(stream)
    finally:
        with spark_errors():
            server.getResult()  # raises the job's failure
    if batches:
        return pa.Table.from_batches(batches)
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType
    schema = refs.add(jdf.schema())
    # zoned timestamps labelled with the session's time zone, as Spark's Arrow batches are
    # (a batch that kept no row must not change the output's schema)
    return to_arrow_schema(StructType.fromJson(json.loads(schema.json())),
                           timezone=session.conf.get("spark.sql.session.timeZone")).empty_table()


# ------------------------------------------------------------------ Catalyst's plans
def analyzed_plan(jdf, refs: Refs) -> Any:
    return refs.add(refs.add(jdf.queryExecution()).analyzed())


def analyzed_plan_json(jdf, refs: Refs) -> str:
    """Catalyst's JSON of the analysed plan (TreeNode.toJSON): nodes and expressions, pre-order."""
    return analyzed_plan(jdf, refs).toJSON()


def utc_session(session) -> bool:
    """Whether the session reads naive timestamps as UTC (streamlab's default time zone)."""
    return str(session.conf.get("spark.sql.session.timeZone", "")) in ("UTC", "Etc/UTC", "GMT", "Z", "+00:00")


def ansi_mode(session) -> bool:
    """Whether the session runs SQL in ANSI mode (Spark 4's default): overflows and division by
    zero fail instead of wrapping or giving null."""
    return str(session.conf.get("spark.sql.ansi.enabled", "true")).lower() == "true"


def executed_plan_tree(jdf, refs: Refs) -> str:
    """The physical plan's tree string, as ``EXPLAIN`` shows it."""
    return refs.add(refs.add(jdf.queryExecution()).executedPlan()).treeString()


def only_child(plan, name: str, refs: Refs) -> Optional[Any]:
    """The one child of ``plan`` when it is a ``name`` node with one child."""
    if plan.nodeName() != name or refs.add(plan.children()).size() != 1:
        return None
    return refs.add(refs.add(plan.children()).apply(0))


def input_path(plan, steps, view: str, refs: Refs) -> Optional[tuple[list[tuple[Any, list[Any], int]], Any]]:
    """From the root down, each ancestor of the plan's one input leaf with its children and the
    leaf's side, and the leaf; None when ``steps`` (the plan or a node of it) is not deterministic,
    or the plan reads a table or a view but the temporary ``view``, reads its input twice or
    inside an expression (a subquery)."""
    if not steps.deterministic():
        return None  # seeds fixed at analysis (Spark's ResolveRandomSeed): each batch needs its own
    path: list[tuple[Any, list[Any], int]] = []
    leaves: list[Any] = []
    in_subqueries: list[Any] = []
    if not _walk(plan, view, path, leaves, in_subqueries, refs) or len(leaves) != 1 or in_subqueries:
        return None
    return path, leaves[0]


def _walk(node, view: str, path: list, leaves: list, in_subqueries: list, refs: Refs) -> bool:
    """Fill ``path`` with the ancestors of the first input leaf of the tree's children, but for
    those that only name it (``leaves`` gets every one, ``in_subqueries`` those of subquery
    expressions); False when the plan reads anything but its input and constants."""
    name = node.nodeName()
    if name == "View" and not (node.isTempView() and node.desc().identifier().unquotedString() == view):
        return False  # another view's plan, fixed at analysis: it may be replaced before the next batch
    children = refs.add(node.children())
    if children.size() == 0:
        if name == INPUT_LEAF:
            leaves.append(node)
            return True
        return name in CONSTANT_LEAVES
    subqueries = refs.add(node.subqueries())
    for i in range(subqueries.size()):
        if not _walk(refs.add(subqueries.apply(i)), view, [], in_subqueries, in_subqueries, refs):
            return False
    kids = [refs.add(children.apply(i)) for i in range(children.size())]
    for i, child in enumerate(kids):
        found = len(leaves)
        if not _walk(child, view, path, leaves, in_subqueries, refs):
            return False
        if len(leaves) > found and len(leaves) == 1 and name not in NAME_ONLY:
            # the view's name and marker over the input leaf only served name resolution, done:
            # the optimiser drops them (EliminateSubqueryAliases, EliminateView), and a batch
            # need not build them
            path.insert(0, (node, kids, i))
    return True


def leaf_copy_args(session, leaf, refs: Refs) -> Optional[tuple[Any, int]]:
    """The input leaf's constructor arguments as a Java array (its attribute ids among them), and
    the place of its rdd, left empty; None when the leaf has no rdd."""
    names = [leaf.productElementName(i) for i in range(leaf.productArity())]
    if "rdd" not in names:
        return None
    gateway = session.sparkContext._gateway
    copy_args = gateway.new_array(gateway.jvm.java.lang.Object, len(names))
    for i, name in enumerate(names):
        copy_args[i] = None if name == "rdd" else refs.add(leaf.productElement(i))
    return copy_args, names.index("rdd")


def empty_rdd(session, refs: Refs) -> Any:
    return refs.add(refs.add(session._jsc.emptyRDD()).rdd())


def plan_rdd(jdf, refs: Refs) -> tuple[Any, Any]:
    """A batch's input leaf and the RDD it reads."""
    leaf = refs.add(jdf.logicalPlan())
    return leaf, refs.add(leaf.rdd())


def children(node, refs: Refs) -> list[Any]:
    kids = refs.add(node.children())
    return [kids.apply(i) for i in range(kids.size())]


def forget_datasets(session, root) -> None:
    """Each new Dataset adds its id to a mutable set among its plan root's tags (for detecting
    ambiguous self-joins), and withNewChildren copies a node's tags: left on a kept root, that one
    set gained an id for every batch, for as long as the job ran."""
    root.unsetTagValue(session._jvm.org.apache.spark.sql.classic.Dataset.DATASET_ID_TAG())


class PlanCopier:
    """Spark's methods that put a kept plan over another relation, looked up once: each lookup by
    name is a reflection round trip into the JVM."""

    def __init__(self, session):
        self._to_seq = session._jvm.org.apache.spark.api.python.PythonUtils.toSeq
        self._of_rows = session._jvm.org.apache.spark.sql.classic.Dataset.ofRows

    def over(self, rdd, leaf, copy_args, rdd_arg: int, path: list[tuple[Any, list[Any], int]],
             refs: Refs, keep: bool = False) -> list[Any]:
        """The plan along ``path`` over a copy of the input ``leaf`` that reads ``rdd`` with the
        leaf's attribute ids (``copy_args``): its new nodes, the root first and the leaf's copy
        last, in ``refs`` but for the ancestors when ``keep`` (a template's own)."""
        copy_args[rdd_arg] = rdd
        try:
            node = refs.add(leaf.makeCopy(copy_args))
        finally:
            # the array is the template's: holding a batch's rdd, it kept the batch's Arrow bytes
            # in the JVM until the next batch, past the job that JvmRefs releases them after
            copy_args[rdd_arg] = None
        nodes = [node]
        for parent, kids, side in reversed(path):
            if len(kids) == 1:
                # a unary node (a Project, a Filter): one py4j call, where withNewChildren's Seq
                # built from a Python list took four, each a thread switch that a loaded TaskManager
                # made cost up to a millisecond (its tags, which withNewChildren copies, are left:
                # the analysed plan's, such as the Dataset ids of the template's root, are not needed)
                node = parent.withNewChildInternal(node)
            else:
                kids = list(kids)
                kids[side] = node
                node = parent.withNewChildren(refs.add(self._to_seq(kids)))
            nodes.insert(0, node if keep else refs.add(node))
        return nodes

    def analysed_frame(self, session, root, refs: Refs) -> Any:
        """A plan root, marked analysed, as a Java DataFrame of ``session``: straight to optimisation."""
        root.setAnalyzed()
        return refs.add(self._of_rows(session._jsparkSession, root))
