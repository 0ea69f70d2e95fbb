"""Limits with clear errors, in-process: sizes in the configuration, the job graph's size check
naming its biggest closure, an ended job's graph without user code, rolling process logs."""
from __future__ import annotations

import logging
import sys
import threading

import pytest

from cluster.conf import MAX_JOB_GRAPH_BYTES, ConfigError, Configuration, parse_size_bytes
from cluster.graph.job_graph import JobGraph, JobGraphTooLarge
from cluster.common.process_logging import configure_process_logging
from kernel_runtime import StreamEnvironment


@pytest.mark.parametrize("text, size", [("64 mb", 64 << 20), ("512k", 512 << 10), ("1 GB", 1 << 30),
                                        ("100", 100), (100, 100), ("1.5 kb", 1536), ("10 bytes", 10)])
def test_sizes_read_as_flink_memory_sizes(text, size):
    assert parse_size_bytes(text) == size


@pytest.mark.parametrize("value", ["64 parsecs", "mb", "-1 mb", True, [1]])
def test_a_bad_size_names_its_key(value):
    with pytest.raises(ConfigError, match="'log.file.max-size'.*a size"):
        Configuration({"log.file.max-size": value})


def test_graph_limit_cannot_exceed_what_the_wire_carries():
    Configuration({"pipeline.jobgraph.max-size": MAX_JOB_GRAPH_BYTES})
    with pytest.raises(ConfigError, match="pipeline.jobgraph.max-size.*63.0 mb"):
        Configuration({"pipeline.jobgraph.max-size": "64 mb"})


def test_jobstore_expiration_is_seconds_as_in_flink():
    assert Configuration()["jobstore.expiration-time"] == 3600
    assert Configuration({"jobstore.expiration-time": "2 min"})["jobstore.expiration-time"] == 120
    assert Configuration({"jobstore.expiration-time": "90"})["jobstore.expiration-time"] == 90
    with pytest.raises(ConfigError, match="jobstore.expiration-time"):
        Configuration({"jobstore.expiration-time": 0})


def graph_with_closure(size: int) -> JobGraph:
    env = StreamEnvironment(parallelism=1)
    blob = b"x" * size
    small = env.from_generator(count=10).map_batches(lambda df: df, name="small")
    small.map_batches(lambda df, _b=blob: df.assign(n=len(_b)), name="big one").collect()
    return env.get_job_graph("closures")


def test_a_graph_over_the_limit_names_its_biggest_closure_and_the_key():
    graph = graph_with_closure(3 << 20)
    assert graph.check_size(4 << 20) > 3 << 20  # under: its size
    with pytest.raises(JobGraphTooLarge) as info:
        graph.check_size(2 << 20)
    text = str(info.value)
    assert "job 'closures'" in text and "over pipeline.jobgraph.max-size = 2.0 mb" in text
    assert "operator 'big one' (test_limits.py:" in text and "a map-batches" in text
    assert "pickled function and parameters are 3.0 mb" in text
    assert "raise pipeline.jobgraph.max-size" in text


def test_an_ended_job_keeps_its_shape_not_its_user_code():
    graph = JobGraph.from_dict(graph_with_closure(1 << 20).to_dict())
    vertex = graph.vertices[-1]
    before = [(v.id, v.name, v.parallelism, [(o.name, o.kind, o.call_site) for o in v.operators])
              for v in graph.vertices]
    graph.drop_user_code()
    assert graph.wire_size() < 10_000
    assert all(o.udf is None and o.params == {} for v in graph.vertices for o in v.operators)
    assert [(v.id, v.name, v.parallelism, [(o.name, o.kind, o.call_site) for o in v.operators])
            for v in graph.vertices] == before
    assert vertex.operators is graph.vertices[-1].operators  # holders of the vertex see it too


def test_process_log_rolls_over_and_keeps_a_bounded_number_of_files(tmp_path):
    log_file = tmp_path / "taskmanager-0.log"
    conf = Configuration({"log.file.max-size": "2 kb", "log.file.max-backups": 3})
    root = logging.getLogger()
    saved = root.handlers[:], root.level, sys.excepthook, threading.excepthook
    handler = configure_process_logging(log_file, conf)
    try:
        for i in range(2_000):  # about 200 kB
            logging.getLogger("streamlab.test").warning("message %d dropped from an unknown peer", i)
    finally:
        handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        sys.excepthook, threading.excepthook = saved[2], saved[3]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["taskmanager-0.log", "taskmanager-0.log.1", "taskmanager-0.log.2", "taskmanager-0.log.3"]
    assert all((tmp_path / f).stat().st_size <= 2048 for f in files)
    assert "message 1999 dropped" in log_file.read_text()  # the newest lines are in <name>.log
