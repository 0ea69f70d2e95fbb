"""A ``.sql`` step's projections and filters run by Arrow's compute kernels, without the JVM.

A batch through Spark crosses into the JVM and back: for string-heavy rows (Nexmark's bids, 100
bytes each) that crossing, not the work, set a per-batch query's speed (1.0M rows/s for a bare
``SELECT`` of the columns, where the source alone gives 18M). Yet most per-batch queries only
project and filter, which Arrow's kernels do in place. Here Spark's analysed plan of the step
(Catalyst's JSON of it: Spark still parses and analyses the query, resolves its columns and types
and inserts its casts) is translated, when it is a chain of projections and filters over the input
and each expression is one this module knows, into one Arrow filter and one Arrow projection.

What it knows keeps Spark's meaning (ANSI mode, Spark 4's default; with it off nothing is
translated): integer arithmetic checked for overflow, ``%`` with the dividend's sign, division of
doubles that fails on zero, SQL's three-valued logic, ``IN`` null when its value is, NaN equal to
NaN and above every number in comparisons; a comparison of types it cannot see is left to Spark. An
expression that fails in Arrow (an overflow, a division by zero) sends the batch to Spark, which
fails or answers as Spark does (chain.py). The translation is used only after Spark's own answer
to a batch equalled it (chain.py), and its output takes the Arrow types Spark's output had.

``compile_plan`` is pure: JSON in, ``ArrowProgram`` out; a program is immutable, for any thread.
Each expression is translated once, to a recipe (``Recipe``) that runs eagerly over a batch's
columns or gives Acero's expression. Eagerly was the faster at every size measured (1 row: 63 us
against Acero's 117; 100k rows: 1.2 ms against 2.0) but holds each intermediate column whole, so a
batch of EAGER_ROWS or more streams through an Acero plan in Acero's own small batches.
"""
from __future__ import annotations

import decimal
import functools
import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

log = logging.getLogger(__name__)

_EXPR = "org.apache.spark.sql.catalyst.expressions."
# nodes between the input and the query that change no row
_PASS = {"SubqueryAlias", "View"}
_BATCH = {"LogicalRDD", "LocalRelation"}  # the relation a batch reaches Spark as


EAGER_ROWS = 65_536  # below this many rows a batch is answered eagerly, not by an Acero plan


class Untranslatable(Exception):
    """The plan or an expression is not one this module translates: Spark runs the step."""


class Expressions:
    """Operands as Acero's expressions (pc.field, pc.scalar)."""

    @staticmethod
    def column(name: str) -> Any:
        return pc.field(name)

    @staticmethod
    def constant(value: pa.Scalar) -> Any:
        return pc.scalar(value)

    @staticmethod
    def cast(value: Any, target: pa.DataType) -> Any:
        return value.cast(target, safe=True)  # an overflow fails, as ANSI mode's cast does


class Columns:
    """Operands as a table's columns, for eager evaluation."""

    def __init__(self, table: pa.Table):
        self.table = table

    def column(self, name: str) -> Any:
        return self.table.column(name)

    @staticmethod
    def constant(value: pa.Scalar) -> Any:
        return value

    @staticmethod
    def cast(value: Any, target: pa.DataType) -> Any:
        return pc.cast(value, target, safe=True)


Operands = Any  # Expressions or Columns
Recipe = Callable[[Operands], Any]  # an expression: its Acero form, or its values over a batch


def _apply(function: Callable[..., Any], *args: Recipe, **options: Any) -> Recipe:
    return lambda o: function(*(a(o) for a in args), **options)


def _column(name: str) -> Recipe:
    return lambda o: o.column(name)


def _constant(value: pa.Scalar) -> Recipe:
    return lambda o: o.constant(value)


@dataclass(frozen=True)
class ArrowProgram:
    predicate: Optional[Recipe]   # over the input's columns; None: every row
    columns: dict[str, Recipe]    # output name -> expression over the input's columns

    def run(self, table: pa.Table, eager: Optional[bool] = None) -> pa.Table:
        """``eager``: evaluated over the columns (None: a batch of fewer than EAGER_ROWS rows is),
        else by an Acero plan."""
        if table.num_rows < EAGER_ROWS if eager is None else eager:
            return self._eager(table)
        predicate, columns = self._acero
        nodes = [acero.Declaration("table_source", acero.TableSourceNodeOptions(table))]
        if predicate is not None:
            nodes.append(acero.Declaration("filter", acero.FilterNodeOptions(predicate)))
        nodes.append(acero.Declaration("project", acero.ProjectNodeOptions(columns, list(self.columns))))
        # one thread: rows keep their order, as Spark's narrow plan keeps it within the batch
        return acero.Declaration.from_sequence(nodes).to_table(use_threads=False)

    @functools.cached_property
    def _acero(self) -> tuple[Optional[pc.Expression], list[pc.Expression]]:
        """The recipes as Acero's expressions, made once (a program is reused for every batch)."""
        operands = Expressions()
        predicate = None if self.predicate is None else self.predicate(operands)
        return predicate, [c(operands) for c in self.columns.values()]

    def _eager(self, table: pa.Table) -> pa.Table:
        if self.predicate is not None:
            keep = self.predicate(Columns(table))
            if isinstance(keep, pa.Scalar):  # a constant condition: every row or none (null: none)
                keep = pa.repeat(keep, table.num_rows).cast(pa.bool_())
            # a null drops the row, as Acero's filter does; a batch that keeps every row skips the copy
            if keep.null_count or not pc.all(keep).as_py():
                table = table.filter(keep)
        operands = Columns(table)
        values = [c(operands) for c in self.columns.values()]
        values = [pa.repeat(v, table.num_rows) if isinstance(v, pa.Scalar) else v for v in values]
        return pa.Table.from_arrays(values, names=list(self.columns))


def compile_plan(plan_json: str, input_columns: list[str], drop: tuple[str, ...] = ()) -> ArrowProgram:
    """``plan_json``: Catalyst's JSON of the analysed plan (``plan.toJSON()``); ``input_columns``:
    the batch's columns; ``drop``: columns of the top projection left out (a fused job's partition
    tag). Untranslatable when it is anything but projections and filters over the input, or an
    expression is not known here."""
    nodes = _tree(json.loads(plan_json))
    chain = []
    node = nodes
    while node["children"]:  # down to the one leaf: the batch
        kind = node["class"].rsplit(".", 1)[-1]
        if kind not in _PASS | {"Project", "Filter"} or len(node["children"]) != 1:
            raise Untranslatable(f"a {kind} in the plan")
        chain.append(node)
        node = node["children"][0]
    # the leaf is the batch, read as the view input: not a constant row, a range, a table or a view
    # of the session's (whose rows are not the batch's)
    if node["class"].rsplit(".", 1)[-1] not in _BATCH or not any(
            n["class"].endswith(".SubqueryAlias") and n["identifier"].get("name") == "input" for n in chain):
        raise Untranslatable(f"a plan over a {node['class'].rsplit('.', 1)[-1]}, not the batch")
    inputs = set(input_columns)
    env: dict[int, Recipe] = {}
    for item in node.get("output") or []:  # the batch's columns, by the ids the plan names them by
        attribute = _tree(item)
        if attribute["name"] not in inputs:
            raise Untranslatable(f"the batch has no column {attribute['name']}")
        env[attribute["exprId"]["id"]] = _column(attribute["name"])
    predicates: list[Recipe] = []
    output: Optional[dict[str, Recipe]] = None
    for node in reversed(chain):  # from the input up
        kind = node["class"].rsplit(".", 1)[-1]
        if kind == "Filter":
            predicates.append(_translate(_tree(node["condition"]), env))
        elif kind == "Project":
            output = {}
            for item in node["projectList"]:
                expr = _tree(item)
                if node is chain[0] and expr["name"] in drop:
                    continue
                value = _translate(expr, env)
                env[expr["exprId"]["id"]] = value
                if expr["name"] in output:
                    raise Untranslatable(f"two columns named {expr['name']}")
                output[expr["name"]] = value
    if output is None:
        output = {name: _column(name) for name in input_columns}
    predicate = None
    for p in predicates:
        predicate = p if predicate is None else _apply(pc.and_kleene, predicate, p)
    return ArrowProgram(predicate, output)


def _tree(nodes: list[dict]) -> dict:
    """Catalyst's pre-order list of nodes (each with its ``num-children``) as a tree: each node
    gets its ``children`` in order (an IN's value, then its list)."""
    position = 0

    def build() -> dict:
        nonlocal position
        node = dict(nodes[position])
        position += 1
        node["children"] = [build() for _ in range(node["num-children"])]
        return node
    return build()


def _type(name) -> pa.DataType:
    if not isinstance(name, str):  # an array's, a map's or a struct's type is JSON of its own
        raise Untranslatable("a nested type")
    simple = {"byte": pa.int8(), "short": pa.int16(), "integer": pa.int32(), "long": pa.int64(),
              "float": pa.float32(), "double": pa.float64(), "string": pa.string(), "boolean": pa.bool_(),
              "void": pa.null()}
    if name in simple:
        return simple[name]
    match = re.fullmatch(r"decimal\((\d+),(\d+)\)", name)
    if match:
        return pa.decimal128(int(match.group(1)), int(match.group(2)))
    raise Untranslatable(f"the type {name}")


def _literal(node: dict) -> Recipe:
    return _constant(pa.scalar(None if node["value"] is None else _python(node), _type(node["dataType"])))


def _remainder(a: Recipe, b: Recipe) -> Recipe:
    # Java's %: the dividend's sign; Arrow's integer division truncates toward zero, and fails on zero
    return _apply(pc.subtract_checked, a, _apply(pc.multiply_checked, _apply(pc.divide_checked, a, b), b))


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": pc.add_checked, "Subtract": pc.subtract_checked, "Multiply": pc.multiply_checked,
    "And": pc.and_kleene, "Or": pc.or_kleene,
}
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "EqualTo": pc.equal, "LessThan": pc.less, "LessThanOrEqual": pc.less_equal,
    "GreaterThan": pc.greater, "GreaterThanOrEqual": pc.greater_equal,
}
_FLOATS = ("float", "double")
_EXACT = ("byte", "short", "integer", "long", "string", "boolean")


def _compare(kind: str, a: Recipe, b: Recipe, floating: bool) -> Recipe:
    """Spark's comparison: of floating numbers, NaN equals NaN and is above every other number
    (where IEEE's, and Arrow's, says false); nulls give null either way."""
    plain = _apply(_COMPARE[kind], a, b)
    if not floating:
        return plain
    a_nan, b_nan = _apply(pc.is_nan, a), _apply(pc.is_nan, b)
    either, both = (lambda x, y: _apply(pc.or_kleene, x, y)), (lambda x, y: _apply(pc.and_kleene, x, y))
    equal = either(_apply(pc.equal, a, b), both(a_nan, b_nan))
    less = either(_apply(pc.less, a, b), both(_apply(pc.invert, a_nan), b_nan))
    greater = either(_apply(pc.greater, a, b), both(a_nan, _apply(pc.invert, b_nan)))
    return {"EqualTo": equal, "LessThan": less, "GreaterThan": greater,
            "LessThanOrEqual": either(less, equal), "GreaterThanOrEqual": either(greater, equal)}[kind]


def _translate(node: dict, env: dict[int, Recipe]) -> Recipe:
    kind = node["class"].removeprefix(_EXPR)
    kids = node["children"]
    if kind == "AttributeReference":
        known = env.get(node["exprId"]["id"])
        if known is None:
            raise Untranslatable(f"the column {node['name']}, not the batch's")
        return known
    if kind == "Alias":
        return _translate(kids[0], env)
    if kind == "Literal":
        return _literal(node)
    if kind in _BINARY:
        return _apply(_BINARY[kind], _translate(kids[0], env), _translate(kids[1], env))
    if kind in _COMPARE:
        # Spark's analysis gave both sides one type: the side whose JSON says it says it for both
        types = {t for t in map(_data_type, kids) if t is not None}
        if not types or not types <= set(_FLOATS + _EXACT) and not all(t.startswith("decimal") for t in types):
            raise Untranslatable(f"a comparison of {' and '.join(sorted(map(str, types)))}")
        return _compare(kind, _translate(kids[0], env), _translate(kids[1], env),
                        bool(types & set(_FLOATS)))
    if kind == "Remainder":
        if not all(_is_integer(k) for k in kids):
            raise Untranslatable("a % of other than integers")
        return _remainder(_translate(kids[0], env), _translate(kids[1], env))
    if kind == "Divide":  # Spark's / is of doubles or decimals; ANSI mode fails on zero
        if not all(_data_type(k) == "double" for k in kids):
            raise Untranslatable("a / of other than doubles")
        return _apply(pc.divide_checked, _translate(kids[0], env), _translate(kids[1], env))
    unary = {"UnaryMinus": pc.negate_checked, "Not": pc.invert, "IsNull": pc.is_null, "IsNotNull": pc.is_valid}
    if kind in unary:
        return _apply(unary[kind], _translate(kids[0], env))
    if kind == "In":
        value = _translate(kids[0], env)
        if _data_type(kids[0]) not in _EXACT or not all(k["class"] == _EXPR + "Literal" and k["value"] is not None
                                                        for k in kids[1:]):
            raise Untranslatable("an IN of other than a whole number's or text's and non-null constants")
        options = pa.array([_python(k) for k in kids[1:]], _type(kids[0]["dataType"]))
        # null IN (...) is null, as in SQL; Arrow's is_in says false
        return _apply(pc.if_else, _apply(pc.is_null, value), _constant(pa.scalar(None, pa.bool_())),
                      _apply(pc.is_in, value, value_set=options))
    if kind == "Cast":
        return _cast(node, _translate(kids[0], env))
    raise Untranslatable(f"the expression {kind}")


def _python(node: dict):
    """A non-null literal's value (Catalyst's JSON holds it as text) as Python's."""
    kind, value = _type(node["dataType"]), node["value"]
    if pa.types.is_integer(kind):
        return int(value)
    if pa.types.is_floating(kind):
        return float(value)
    if pa.types.is_decimal(kind):
        return decimal.Decimal(value)
    if pa.types.is_boolean(kind):
        return value == "true"
    return value


def _data_type(node: dict) -> Optional[str]:
    """A node's type where its JSON says it (columns, literals, casts)."""
    kind = node.get("dataType")
    if kind is not None and not isinstance(kind, str):
        raise Untranslatable("a nested type")
    return kind


def _is_integer(node: dict) -> bool:
    return _data_type(node) in ("byte", "short", "integer", "long")


def _cast(node: dict, value: Recipe) -> Recipe:
    target = _type(node["dataType"])
    source = _data_type(node["children"][0])
    if source is None or not (pa.types.is_integer(target) or pa.types.is_floating(target)
                              or pa.types.is_decimal(target)):
        raise Untranslatable("a cast")
    if source not in ("byte", "short", "integer", "long", "float", "double") and not source.startswith("decimal"):
        raise Untranslatable(f"a cast from {source}")
    if source in ("float", "double") and not pa.types.is_floating(target):
        raise Untranslatable("a cast of a double to a whole or exact number")  # Spark rounds its own way
    if source.startswith("decimal") and pa.types.is_floating(target):
        child = node["children"][0]
        if child["class"] == _EXPR + "Literal":  # a constant (d > 0.5): Python's float() rounds as Spark's does
            number = None if child["value"] is None else float(decimal.Decimal(child["value"]))
            return _constant(pa.scalar(number, target))
        raise Untranslatable("a cast of a decimal to a double")  # Spark's rounds exactly, Arrow's within an ulp
    if node["children"][0]["class"] == _EXPR + "Literal":  # cast once, not for every batch
        return _constant(pc.cast(value(Columns(pa.table({}))), target, safe=True))
    return lambda o: o.cast(value(o), target)


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Equal tables, a NaN equal to a NaN in the same place (Arrow's equality says unequal)."""
    if not a.schema.equals(b.schema) or a.num_rows != b.num_rows:
        return False
    for x, y in zip(a.columns, b.columns):
        if pa.types.is_floating(x.type):
            x_nan, y_nan = pc.fill_null(pc.is_nan(x), False), pc.fill_null(pc.is_nan(y), False)
            if not x_nan.equals(y_nan):
                return False
            x, y = pc.if_else(x_nan, 0.0, x), pc.if_else(y_nan, 0.0, y)
        if not x.equals(y):
            return False
    return True


@dataclass(frozen=True)
class Translation:
    """A program that answered a batch of ``input`` as Spark did, and Spark's output types."""
    program: ArrowProgram
    input: pa.Schema
    output: pa.Schema


# the translations that answered as Spark did, by chain (its SQL) and input schema: a later
# chain of the same SQL (another subtask, a cell run again) takes one without a trial of its own,
# as it takes the plan Spark analysed for it (plans.PlanCache)
_known: dict[tuple, Translation] = {}
_known_lock = threading.Lock()


class ArrowPath:
    """Whether a Spark chain's batches run by Arrow (``compile_plan``): tried on the first batch
    with rows that Spark answered, and taken only if its answer equals Spark's, cast to Spark's
    output types; ``key(schema)`` names the chain's SQL over an input schema. Thread use: any of
    the chain's threads (a trial under a lock)."""

    def __init__(self, enabled: bool, where: str, key: Callable[[pa.Schema], tuple]):
        self.where, self.key = where, key
        self.translation: Optional[Translation] = None
        self.tried = not enabled
        self._lock = threading.Lock()
        self.batches = 0      # batches Arrow answered (metrics only)
        self.handed_back = 0  # batches Arrow failed on, answered by Spark

    def trial(self, plan_json: Callable[[], str], table: pa.Table, out: pa.Table, drop: tuple[str, ...] = ()) -> None:
        """After Spark answered ``table`` with ``out``: the plan translated (without the
        columns ``drop``), and kept if its answer is the same."""
        # an empty answer proves little: a later batch that Spark plans tries (a batch of a kept plan
        # goes to Spark without a plan to read: a chain whose first answer was empty may never try)
        if self.tried or out.num_rows == 0:
            return
        with self._lock:
            if self.tried:
                return
            self.tried = True
            try:
                program = compile_plan(plan_json(), table.column_names, drop)
                got = program.run(table)
                got = got.cast(out.schema) if got.schema != out.schema else got
            except Untranslatable as exc:
                log.info("%s: Spark runs each batch: %s is not translated to Arrow", self.where, exc)
                return
            except Exception as exc:  # whatever fails here, Spark answered the batch: it goes on answering
                log.info("%s: Spark runs each batch: Arrow failed on its translation: %s", self.where, exc,
                         exc_info=True)
                return
            if not same_rows(got, out):
                log.warning("%s: Spark runs each batch: Arrow's answer to a batch differed from Spark's", self.where)
                return
            self.translation = Translation(program, table.schema, out.schema)
            with _known_lock:
                _known[self.key(table.schema)] = self.translation
            log.info("%s: its projections and filters run by Arrow, without Spark", self.where)

    def ready(self, schema: pa.Schema) -> Optional[Translation]:
        """The translation for batches of ``schema``: this chain's own, or one another chain of
        the same SQL tried (then this chain's too, without a trial); None: Spark answers them."""
        done = self.translation
        if done is None and not self.tried:
            with _known_lock:
                done = _known.get(self.key(schema))
            if done is not None:
                self.translation = done
        return done if done is not None and done.input.equals(schema) else None

    def run(self, table: pa.Table) -> Optional[pa.Table]:
        """The batch's answer by Arrow, in Spark's output types; None: Spark answers it (no
        translation for its schema, or Arrow failed on this batch: an overflow, a division by zero)."""
        done = self.ready(table.schema)
        if done is None:
            return None
        try:
            out = done.program.run(table)
            out = out.cast(done.output) if out.schema != done.output else out
        except (pa.ArrowException, ValueError):
            self.handed_back += 1
            return None
        self.batches += 1
        return out
