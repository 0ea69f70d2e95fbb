"""DataStream and KeyedStream: the pipeline as the user writes it, one StreamNode per call.

Every call records where in the user's code it was made, and checks what it can on the spot
(parallelism, picklability of the function, key columns), so a mistake is reported at the line
that made it, before anything is submitted.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Callable, Optional

import cloudpickle

from cluster.graph.chaining import StreamEdge, StreamNode
from cluster.graph.job_graph import GraphValidationError, OperatorSpec, new_id

if TYPE_CHECKING:
    from .environment import StreamEnvironment

_API_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def call_site() -> str:
    """file:line of the first caller outside kernel_runtime."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_API_DIR):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def check_parallelism(value, where: str) -> Optional[int]:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GraphValidationError(f"{where}: parallelism must be a positive integer, got {value!r}")
    return value


def pickle_udf(fn, where: str) -> Optional[bytes]:
    if fn is None:
        return None
    if not callable(fn):
        raise GraphValidationError(f"{where}: expected a function, got {type(fn).__name__}")
    try:
        return cloudpickle.dumps(fn)
    except Exception as exc:
        raise GraphValidationError(f"{where}: the function cannot be pickled to ship it to the "
                                   f"TaskManagers: {type(exc).__name__}: {exc}") from None


class DataStream:
    def __init__(self, env: "StreamEnvironment", node: StreamNode):
        self.env = env
        self.node = node
        self._partitioning: Optional[StreamEdge] = None  # set by rebalance()/broadcast()

    # ------------------------------------------------------------------ building
    def _add(self, kind: str, name: str, fn: Optional[Callable] = None, params: Optional[dict] = None,
             parallelism: Optional[int] = None, edge: Optional[StreamEdge] = None) -> StreamNode:
        site = call_site()
        where = f"operator '{name}' ({site})"
        spec = OperatorSpec(uid=new_id(), kind=kind, name=name, call_site=site, params=params or {},
                            udf=pickle_udf(fn, where))
        edge = edge or self._partitioning or StreamEdge(self.node.uid, "DEFAULT")
        node = StreamNode(spec, check_parallelism(parallelism, where) or self.env.parallelism, [edge])
        self.env._nodes.append(node)
        return node

    def map_batches(self, fn: Callable, name: str = "map_batches", parallelism: Optional[int] = None) -> "DataStream":
        """fn(pandas.DataFrame) -> pandas.DataFrame, applied to every batch."""
        return DataStream(self.env, self._add("map-batches", name, fn, parallelism=parallelism))

    def filter(self, fn: Callable, name: str = "filter", parallelism: Optional[int] = None) -> "DataStream":
        """fn(pandas.DataFrame) -> boolean mask; keeps the rows where it is True."""
        return DataStream(self.env, self._add("filter", name, fn, parallelism=parallelism))

    def key_by(self, *columns: str) -> "KeyedStream":
        site = call_site()
        if not columns or not all(isinstance(c, str) and c for c in columns):
            raise GraphValidationError(f"key_by ({site}): give one or more column names, got {columns!r}")
        return KeyedStream(self, list(columns))

    def rebalance(self) -> "DataStream":
        """Spread batches round-robin over the next operator's subtasks."""
        return self._with_partitioning("REBALANCE")

    def broadcast(self) -> "DataStream":
        """Send every batch to every subtask of the next operator."""
        return self._with_partitioning("BROADCAST")

    def _with_partitioning(self, strategy: str) -> "DataStream":
        stream = DataStream(self.env, self.node)
        stream._partitioning = StreamEdge(self.node.uid, strategy)
        return stream

    def set_parallelism(self, parallelism: int) -> "DataStream":
        self.node.parallelism = check_parallelism(parallelism, self.node.spec.where())
        return self

    def collect(self, name: str = "collect") -> "DataStream":
        """Stream this stream's batches back to the client; the job's result under ``name``."""
        if any(n.spec.kind == "collect-sink" and n.spec.name == name for n in self.env._nodes):
            raise GraphValidationError(f"collect ({call_site()}): a collect sink named {name!r} exists; "
                                       "give each a different name")
        return DataStream(self.env, self._add("collect-sink", name))

    def print(self, name: str = "print") -> "DataStream":
        """Print rows on the TaskManagers' standard output (their log files)."""
        return DataStream(self.env, self._add("print-sink", name))


class KeyedStream:
    def __init__(self, stream: DataStream, key: list[str]):
        self.stream = stream
        self.key = key

    def _edge(self) -> StreamEdge:
        return StreamEdge(self.stream.node.uid, "HASH", list(self.key))

    def count(self, name: str = "count", parallelism: Optional[int] = None) -> DataStream:
        """A running count per key: each batch emits the new count of every key it holds."""
        node = self.stream._add("keyed-count", name, params={"key": self.key}, parallelism=parallelism,
                                edge=self._edge())
        return DataStream(self.stream.env, node)
