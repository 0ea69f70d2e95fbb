"""StreamGraph -> JobGraph: operator chaining, as Flink's StreamingJobGraphGenerator does it.

A StreamNode is one operator as the user wrote it. Two nodes are chained into one task when the
edge between them is a forward edge of the main output with equal parallelism, the upstream has
exactly one consumer and the downstream exactly one input: then records pass by reference, with
no serialisation and no thread hand-over.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from cluster.graph.event_time import WINDOW_ENDS_PARAM, window_ends
from cluster.graph.job_graph import JobEdge, JobGraph, JobVertex, OperatorSpec, ShipStrategy, new_id
from cluster.graph.operator_kinds import KINDS


@dataclass
class StreamEdge:
    source: str  # upstream StreamNode uid
    ship_strategy: str  # FORWARD, HASH, REBALANCE, BROADCAST
    key: list[str] = field(default_factory=list)
    side_output: Optional[str] = None  # a tag of the upstream's side outputs, or its main output


@dataclass
class StreamNode:
    spec: OperatorSpec
    parallelism: int
    inputs: list[StreamEdge] = field(default_factory=list)

    @property
    def uid(self) -> str:
        return self.spec.uid


def _chainable(up: StreamNode, down: StreamNode, edge: StreamEdge, consumers: dict[str, int]) -> bool:
    return (edge.ship_strategy == ShipStrategy.FORWARD and edge.side_output is None and up.parallelism == down.parallelism
            and len(down.inputs) == 1 and consumers[up.uid] == 1)


def build_job_graph(nodes: list[StreamNode], name: str, max_parallelism: int,
                    config: Optional[dict] = None, job_id: Optional[str] = None) -> JobGraph:
    by_uid = {n.uid: n for n in nodes}
    ends = window_ends(n.spec for n in nodes)
    for n in nodes:
        if n.spec.kind == "timestamps-watermarks" and ends:
            n.spec.params[WINDOW_ENDS_PARAM] = ends
    consumers = {n.uid: 0 for n in nodes}
    for n in nodes:
        for e in n.inputs:
            consumers[e.source] += 1

    # head of each node's chain: walk up while the edge is chainable
    head: dict[str, str] = {}
    for n in nodes:  # nodes are in creation order, so upstream heads are known first
        if len(n.inputs) == 1 and _chainable(by_uid[n.inputs[0].source], n, n.inputs[0], consumers):
            head[n.uid] = head[n.inputs[0].source]
        else:
            head[n.uid] = n.uid

    chains: dict[str, list[StreamNode]] = {}
    for n in nodes:
        chains.setdefault(head[n.uid], []).append(n)

    vertex_ids = {h: new_id() for h in chains}
    vertices = []
    for h, members in chains.items():
        label = " -> ".join(m.spec.name for m in members)
        if KINDS[members[0].spec.kind].is_source:
            label = "Source: " + label
        vertices.append(JobVertex(id=vertex_ids[h], name=label, parallelism=members[0].parallelism,
                                  max_parallelism=max_parallelism, operators=[m.spec for m in members]))
    edges = []
    for n in nodes:
        if head[n.uid] != n.uid:
            continue
        for e in n.inputs:
            edges.append(JobEdge(source=vertex_ids[head[e.source]], target=vertex_ids[n.uid],
                                 ship_strategy=e.ship_strategy, key=list(e.key),
                                 side_output=None if e.side_output is None else [e.source, e.side_output]))
    return JobGraph(job_id=job_id or new_id(), name=name, vertices=vertices, edges=edges,
                    config=dict(config or {})).validate()
