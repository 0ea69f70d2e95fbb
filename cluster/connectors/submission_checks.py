"""What a job's connectors check before the job is deployed, as Flink's JobMaster learns at its
start (its Kafka source enumerator lists the topics) that a job cannot run: a failure here fails
the job at once, before it takes a slot, and no restart follows (cluster.common.failures).

Only what no restart can fix belongs here, answered by the outside system itself: a topic the
brokers say they do not have. A system that does not answer lets the job start; its tasks then
fail or wait as they would without the check.

Thread use: ``check_before_deployment`` blocks (network): the JobMaster runs it on CHECKS_EXECUTOR.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from cluster.graph.job_graph import JobGraph, OperatorSpec

CHECKS_EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="submission-checks")


def _kafka_topics(spec: OperatorSpec) -> None:
    from cluster.connectors.kafka.client import check_topics_at_submission
    params = spec.params
    topics = list(params.get("topics") or []) if spec.kind == "kafka-source" else [params["topic"]]
    check_topics_at_submission(params["servers"], topics, params.get("properties") or {}, spec.where())


CHECKS: dict[str, Callable[[OperatorSpec], None]] = {
    "kafka-source": _kafka_topics,  # a pattern's topics need not exist yet: only named ones are checked
    "kafka-sink": _kafka_topics,
}


def needs_checks(graph: JobGraph) -> bool:
    return any(op.kind in CHECKS for vertex in graph.vertices for op in vertex.operators)


def check_before_deployment(graph: JobGraph) -> None:
    """Raise the first connector's error that no restart can fix."""
    for vertex in graph.vertices:
        for op in vertex.operators:
            check = CHECKS.get(op.kind)
            if check is not None:
                check(op)
