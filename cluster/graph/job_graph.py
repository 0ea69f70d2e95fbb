"""The JobGraph: what a client submits and the JobManager schedules.

Vertices are chains of operators (see chaining.py); edges say how records move between the
subtasks of two vertices. User functions stay as cloudpickle bytes inside OperatorSpec.udf: the
JobManager routes them to TaskManagers but never unpickles them.

The graph travels as a plain dict (msgpack on the wire). ``JobGraph.from_dict`` re-validates
everything it is given, because the JobManager must not trust a submitted graph's shape.
"""
from __future__ import annotations

import difflib
import enum
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

import msgpack

from cluster.conf import format_size

from cluster.graph.operator_kinds import KINDS

MAX_SIZE_KEY = "pipeline.jobgraph.max-size"
# Keys a job graph may set for its job (JobGraph.config); the rest are the cluster's.
JOB_SCOPED_PREFIXES = ("restart-strategy.", "slot.request.timeout", "execution.", "parallelism.default",
                       "pipeline.", "state.")
CLUSTER_WIDE_KEYS = (MAX_SIZE_KEY,)  # under a job-scoped prefix, but a limit the cluster sets


class ShipStrategy(enum.StrEnum):
    """How records move along an edge (Flink's ShipStrategyType); equal to the plain strings on the wire."""
    FORWARD = "FORWARD"
    HASH = "HASH"
    REBALANCE = "REBALANCE"
    BROADCAST = "BROADCAST"


SHIP_STRATEGIES = tuple(ShipStrategy)


class GraphValidationError(ValueError):
    """The pipeline cannot run as written; the message names the operator and its call site."""


def missing_column(where: str, column: str, what: str, columns: list[str], of: str = "") -> str:
    """The one message for an operator naming a column its input lacks, wherever it is found
    (the client at submission, a TaskManager when the task opens). ``what`` says where the column
    was named, with {} for it ("key_by column {}"); ``of`` whose output the input is."""
    named = what.replace("{}", f"`{column}`")
    text = f"{where}: {named} does not exist; the input{of} has {', '.join(columns) or 'no columns'}"
    near = difflib.get_close_matches(column, columns, n=1)
    return f"{text}. Did you mean `{near[0]}`?" if near else text


class JobGraphTooLarge(GraphValidationError):
    """The job graph is over pipeline.jobgraph.max-size; the message names its biggest operator."""


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class OperatorSpec:
    uid: str
    kind: str
    name: str
    call_site: str  # "file.py:12" of the API call that made the operator
    params: dict = field(default_factory=dict)
    udf: Optional[bytes] = None

    def where(self) -> str:
        return f"operator '{self.name}' ({self.call_site})"


@dataclass(frozen=True)
class JobVertex:
    id: str
    name: str
    parallelism: int
    max_parallelism: int
    operators: list[OperatorSpec]

    @property
    def is_source(self) -> bool:
        return KINDS[self.operators[0].kind].is_source


@dataclass(frozen=True)
class JobEdge:
    source: str
    target: str
    ship_strategy: str
    key: list[str] = field(default_factory=list)
    # [operator uid, tag] when the edge carries an operator's side output (e.g. malformed records)
    side_output: Optional[list[str]] = None


@dataclass(frozen=True)
class JobGraph:
    job_id: str
    name: str
    vertices: list[JobVertex]
    edges: list[JobEdge]
    config: dict = field(default_factory=dict)
    # notebook cells the job's code comes from, by the base name IPython compiled them to:
    # {"name": "In [5]", "source": ...}, so failures name "In [5], line 3" (cluster.common.failures)
    cells: dict[str, dict[str, str]] = field(default_factory=dict)

    # ------------------------------------------------------------------ lookups
    def vertex(self, vertex_id: str) -> JobVertex:
        for v in self.vertices:
            if v.id == vertex_id:
                return v
        raise KeyError(vertex_id)

    def inputs_of(self, vertex_id: str) -> list[tuple[int, JobEdge]]:
        return [(i, e) for i, e in enumerate(self.edges) if e.target == vertex_id]

    def outputs_of(self, vertex_id: str) -> list[tuple[int, JobEdge]]:
        return [(i, e) for i, e in enumerate(self.edges) if e.source == vertex_id]

    def topological_order(self) -> list[JobVertex]:
        indegree = {v.id: 0 for v in self.vertices}
        for e in self.edges:
            indegree[e.target] += 1
        ready = [v.id for v in self.vertices if indegree[v.id] == 0]
        order: list[str] = []
        while ready:
            vid = ready.pop(0)
            order.append(vid)
            for _, e in self.outputs_of(vid):
                indegree[e.target] -= 1
                if indegree[e.target] == 0:
                    ready.append(e.target)
        if len(order) != len(self.vertices):
            raise GraphValidationError("the job graph has a cycle")
        return [self.vertex(v) for v in order]

    # ------------------------------------------------------------------ validation
    def validate(self) -> "JobGraph":
        if not self.vertices:
            raise GraphValidationError("the job has no operators: add a source and a sink")
        ids = [v.id for v in self.vertices]
        if len(set(ids)) != len(ids):
            raise GraphValidationError("duplicate vertex ids")
        for v in self.vertices:
            first = v.operators[0] if v.operators else None
            if first is None:
                raise GraphValidationError(f"vertex {v.name!r} has no operators")
            for op in v.operators:
                if op.kind not in KINDS:
                    raise GraphValidationError(f"{op.where()}: unknown operator kind {op.kind!r}")
            if not 1 <= v.parallelism <= v.max_parallelism:
                raise GraphValidationError(
                    f"{first.where()}: parallelism {v.parallelism} must be between 1 and the "
                    f"max parallelism {v.max_parallelism}")
            for op in v.operators[1:]:
                if KINDS[op.kind].is_source:
                    raise GraphValidationError(f"{op.where()}: a source cannot follow another operator")
            for op in v.operators[:-1]:
                if KINDS[op.kind].is_sink:
                    raise GraphValidationError(f"{op.where()}: nothing can follow a sink")
        for e in self.edges:
            if e.source not in ids or e.target not in ids:
                raise GraphValidationError(f"edge {e.source} -> {e.target} names an unknown vertex")
            if e.ship_strategy not in SHIP_STRATEGIES:
                raise GraphValidationError(f"unknown ship strategy {e.ship_strategy!r}")
            src, dst = self.vertex(e.source), self.vertex(e.target)
            if e.ship_strategy == ShipStrategy.HASH and not e.key:
                raise GraphValidationError(f"{dst.operators[0].where()}: a keyed exchange needs key columns")
            if e.ship_strategy == ShipStrategy.FORWARD and src.parallelism != dst.parallelism:
                raise GraphValidationError(
                    f"{dst.operators[0].where()}: forward partitioning does not allow a change of "
                    f"parallelism ({src.parallelism} -> {dst.parallelism}); use rebalance()")
            if e.side_output is not None:
                if len(e.side_output) != 2 or e.side_output[0] not in {o.uid for o in src.operators}:
                    raise GraphValidationError(f"edge {e.source} -> {e.target}: side output {e.side_output} "
                                               "names no operator of its source vertex")
            elif KINDS[src.operators[-1].kind].is_sink:
                raise GraphValidationError(f"{src.operators[-1].where()}: a sink has no output")
        for v in self.vertices:
            has_inputs = bool(self.inputs_of(v.id))
            if v.is_source and has_inputs:
                raise GraphValidationError(f"{v.operators[0].where()}: a source takes no input")
            if not v.is_source and not has_inputs:
                raise GraphValidationError(f"{v.operators[0].where()}: has no input")
        self.topological_order()
        return self

    # ------------------------------------------------------------------ size
    def wire_size(self) -> int:
        """Bytes of the graph as it travels (msgpack of ``to_dict``), user functions included."""
        return len(msgpack.packb(self.to_dict(), use_bin_type=True))

    def check_size(self, max_bytes: int) -> int:
        """The wire size; JobGraphTooLarge naming the biggest operator if it is over ``max_bytes``."""
        size = self.wire_size()
        if size <= max_bytes:
            return size
        op_size, op = max(((len(msgpack.packb(asdict(o), use_bin_type=True)), o)
                           for v in self.vertices for o in v.operators), key=lambda t: t[0])
        what = "its pickled function and parameters are" if op.udf else "its parameters are"
        raise JobGraphTooLarge(
            f"job '{self.name}' is too large to submit: its job graph is {format_size(size)} ({size} bytes), over "
            f"{MAX_SIZE_KEY} = {format_size(max_bytes)} ({max_bytes} bytes). The biggest part is {op.where()}, "
            f"a {op.kind}: {what} {format_size(op_size)}. Keep large data out of functions' closures (read it "
            f"from a source or a file inside the function), or raise {MAX_SIZE_KEY} in the cluster's "
            "config.yaml")

    def drop_user_code(self) -> None:
        """Forget the pickled functions and parameters of every operator and the code of the
        notebook cells, keeping names, kinds, call sites and the shape: what an ended job's views
        need. Done in place, because the vertices are shared with the execution graph's
        executions and the scheduler."""
        for v in self.vertices:
            v.operators[:] = [replace(o, udf=None, params={}) for o in v.operators]
        self.cells.clear()

    # ------------------------------------------------------------------ wire form
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "JobGraph":
        try:
            graph = cls(
                job_id=_str(data["job_id"]),
                name=_str(data["name"]),
                vertices=[
                    JobVertex(
                        id=_str(v["id"]), name=_str(v["name"]),
                        parallelism=_int(v["parallelism"]), max_parallelism=_int(v["max_parallelism"]),
                        operators=[
                            OperatorSpec(uid=_str(o["uid"]), kind=_str(o["kind"]), name=_str(o["name"]),
                                         call_site=_str(o["call_site"]), params=_dict(o["params"]),
                                         udf=_bytes_or_none(o["udf"]))
                            for o in v["operators"]
                        ],
                    )
                    for v in data["vertices"]
                ],
                edges=[
                    JobEdge(source=_str(e["source"]), target=_str(e["target"]),
                            ship_strategy=_str(e["ship_strategy"]), key=[_str(k) for k in e["key"]],
                            side_output=None if e.get("side_output") is None
                            else [_str(x) for x in e["side_output"]])
                    for e in data["edges"]
                ],
                config=_dict(data.get("config", {})),
                cells={_str(name): {"name": _str(cell["name"]), "source": _str(cell["source"])}
                       for name, cell in _dict(data.get("cells", {})).items()},
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise GraphValidationError(f"malformed job graph: {type(exc).__name__}: {exc}") from None
        return graph.validate()


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"expected an integer, got {type(v).__name__}")
    return v


def _dict(v: Any) -> dict:
    if not isinstance(v, dict):
        raise TypeError(f"expected a map, got {type(v).__name__}")
    return v


def _bytes_or_none(v: Any) -> Optional[bytes]:
    if v is not None and not isinstance(v, bytes):
        raise TypeError(f"expected bytes, got {type(v).__name__}")
    return v
