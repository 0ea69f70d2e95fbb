"""The bottleneck named (cluster.jobmanager.jobmaster.bottleneck): pure, graph and metrics in."""
from __future__ import annotations

from cluster.graph.job_graph import JobEdge, JobGraph, JobVertex, OperatorSpec
from cluster.jobmanager.jobmaster.bottleneck import BottleneckHistory, report

T = 1_700_000_000_000


def op(kind: str, name: str) -> OperatorSpec:
    return OperatorSpec(uid=f"uid-{name}", kind=kind, name=name, call_site="job.py:1")


# Source (2) -> keyed step (2, hashed: edge 0) -> sink (1, rebalanced: edge 1)
GRAPH = JobGraph("j1", "job", [
    JobVertex("src", "Source: events", 2, 128, [op("generator-source", "events")]),
    JobVertex("agg", "enrich", 2, 128, [op("keyed-process", "enrich")]),
    JobVertex("out", "to files", 1, 128, [op("file-sink", "to files")]),
], [JobEdge("src", "agg", "HASH", ["k"]), JobEdge("agg", "out", "REBALANCE")])


def load(busy: float, backpressured: float = 0.0, **more) -> dict:
    return {"busyTimeMsPerSecond": busy * 1000, "backPressuredTimeMsPerSecond": backpressured * 1000, **more}


def history(vertex: str, seconds: int, every: int = 2) -> BottleneckHistory:
    seen = BottleneckHistory()
    for t in range(0, seconds + 1, every):
        seen.observe(T + t * 1000, vertex)
    return seen


def test_the_busy_vertex_is_named_not_the_back_pressured_source_and_more_parallelism_helps():
    metrics = {("src", 0): load(0.05, 0.9), ("src", 1): load(0.05, 0.9), ("agg", 0): load(0.97),
               ("agg", 1): load(0.95), ("out", 0): load(0.1)}
    said = report(GRAPH, metrics, history("agg", 20), T + 20_000)
    assert (said["vertex-id"], said["busy"], said["chronic"], said["skew"], said["sink"]) == (
        "agg", 0.97, False, None, False)
    assert said["text"].startswith("'enrich' limits the job, busy 97% of the time and not back-pressured (transient")
    assert "More parallelism for it helps" in said["text"]


def test_it_is_chronic_once_most_reports_of_at_least_a_minute_name_it():
    metrics = {("agg", 0): load(0.9), ("agg", 1): load(0.9)}
    assert report(GRAPH, metrics, history("agg", 70), T + 70_000)["chronic"]
    mixed = history("agg", 70)
    for t in range(0, 71, 2):
        mixed.observe(T + t * 1000 + 1, "out")  # as many reports named another vertex
    said = report(GRAPH, metrics, mixed, T + 70_001)
    assert not said["chronic"] and said["share"] == 0.5 and "transient so far" in said["text"]
    # reports older than the last three minutes do not count
    assert report(GRAPH, metrics, history("agg", 70), T + 300_000)["share"] == 0.0


def test_a_skewed_key_is_named_with_its_key_group_and_share():
    # subtask 0 owns key groups 0-63 (max parallelism 128, parallelism 2); both sources sent key group 17 most
    hot = {"keyGroupRowsOut": {"0": [500, [[17, 450], [90, 30], [3, 20]]]}}
    metrics = {("src", 0): load(0.1, 0.8, **hot), ("src", 1): load(0.1, 0.8, **hot), ("agg", 0): load(0.92),
               ("agg", 1): load(0.04), ("out", 0): load(0.02)}
    said = report(GRAPH, metrics, history("agg", 10), T + 10_000)
    assert said["skew"] == {"subtask": 0, "busy": 0.92, "siblings-busy": 0.04, "key-group": 17,
                            "key-group-share": 0.9}
    assert "A skewed key: subtask 0 is busy 92% while its siblings are at most 4%; key group 17 carries 90%" \
        in said["text"]


def test_siblings_busy_too_is_no_skew_and_a_busy_sink_says_so():
    metrics = {("agg", 0): load(0.9), ("agg", 1): load(0.6)}
    assert report(GRAPH, metrics, history("agg", 10), T + 10_000)["skew"] is None
    sink = report(GRAPH, {("out", 0): load(0.99), ("agg", 0): load(0.2, 0.7)}, history("out", 10), T + 10_000)
    assert sink["sink"] and "It ends in a sink" in sink["text"]


def test_nothing_busy_enough_names_nothing():
    said = report(GRAPH, {("agg", 0): load(0.3), ("src", 0): load(0.9, 0.5)}, BottleneckHistory(), T)
    assert said["vertex-id"] is None and said["text"].startswith("Nothing holds the job back")
