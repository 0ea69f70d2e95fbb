"""The REST views of event time (watermarks, a vertex's metrics) and the dashboard's summary, from
task metrics as the JobMaster holds them: the real Dispatcher and JobMaster of tests/jobmanager/
test_events.py's harness, the TaskManager's heartbeats played into them."""
from __future__ import annotations

import pytest

from cluster.jobmanager.events import job_summary
from cluster.jobmanager.rest.views import NotFound, vertex_metrics_json, watermarks_json
from cluster.graph.event_time import NO_WATERMARK
from cluster.protocol import messages as m
from kernel_runtime import StreamEnvironment
from tests.jobmanager.test_events import Harness


@pytest.fixture
def job(tmp_path):
    """A running job of one vertex at parallelism 2: (harness, job id, vertex id, heartbeat), where
    ``heartbeat({subtask: metrics})`` reports those subtasks' metrics."""
    harness = Harness(tmp_path)
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).collect()
    graph = env.get_job_graph("event time")
    harness.dispatcher.submit_job(m.SubmitJob(graph.to_dict(), None), None)
    harness.deploy(graph.job_id)
    harness.report(graph.job_id, "RUNNING")
    executions = harness.dispatcher.jobs[graph.job_id].graph.executions

    def heartbeat(by_subtask: dict[int, dict]) -> None:
        harness.dispatcher._task_metrics([{"execution_id": eid, "job_id": graph.job_id} | by_subtask[e.subtask]
                                          for eid, e in executions.items() if e.subtask in by_subtask])

    (vertex,) = graph.vertices
    yield harness, graph.job_id, vertex.id, heartbeat
    harness.tm_socket.close(0)
    harness.storage.shutdown()


def test_watermarks_are_each_subtasks_input_watermark_as_flink_answers_them(job):
    harness, job_id, vertex_id, heartbeat = job
    d = harness.dispatcher
    assert watermarks_json(d, job_id, vertex_id) == []  # no heartbeat yet: Flink leaves a subtask out
    heartbeat({1: {"currentInputWatermark": NO_WATERMARK, "currentOutputWatermark": NO_WATERMARK}})
    assert watermarks_json(d, job_id, vertex_id) == [{"id": "1.currentInputWatermark",
                                                      "value": "-9223372036854775808"}]
    heartbeat({0: {"currentInputWatermark": 1_700_000_000_999, "currentOutputWatermark": 1_700_000_000_999},
               1: {"currentInputWatermark": 1_700_000_000_500, "currentOutputWatermark": 1_700_000_000_400}})
    assert watermarks_json(d, job_id, vertex_id) == [
        {"id": "0.currentInputWatermark", "value": "1700000000999"},
        {"id": "1.currentInputWatermark", "value": "1700000000500"}]


def test_watermarks_of_an_unknown_vertex_or_job_are_not_found(job):
    harness, job_id, vertex_id, _ = job
    with pytest.raises(NotFound, match="No vertex with ID"):
        watermarks_json(harness.dispatcher, job_id, "f" * 32)
    with pytest.raises(NotFound, match="not found"):
        watermarks_json(harness.dispatcher, "e" * 32, vertex_id)


def test_a_vertexs_metrics_are_listed_and_read_under_flinks_names(job):
    harness, job_id, vertex_id, heartbeat = job
    heartbeat({0: {"records-in": 7, "busyTimeMsPerSecond": 250.0, "currentOutputWatermark": 42,
                   "numLateRecordsDropped": 3, "spark-plan-ms": 9},
               1: {"records-in": 5, "currentOutputWatermark": NO_WATERMARK}})
    listed = [metric["id"] for metric in vertex_metrics_json(harness.dispatcher, job_id, vertex_id, None)]
    assert sorted(listed) == ["0.busyTimeMsPerSecond", "0.currentOutputWatermark", "0.numLateRecordsDropped",
                              "0.numRecordsIn", "1.currentOutputWatermark", "1.numRecordsIn"]
    asked = ["1.currentOutputWatermark", "0.numLateRecordsDropped", "0.numRecordsIn", "0.busyTimeMsPerSecond",
             "0.nothing", "1.numLateRecordsDropped", "0.numRecordsIn"]
    assert vertex_metrics_json(harness.dispatcher, job_id, vertex_id, asked) == [
        {"id": "1.currentOutputWatermark", "value": "-9223372036854775808"},
        {"id": "0.numLateRecordsDropped", "value": "3"}, {"id": "0.numRecordsIn", "value": "7"},
        {"id": "0.busyTimeMsPerSecond", "value": "250.0"}]


def test_the_dashboards_summary_carries_the_event_time_metrics(job):
    harness, job_id, _, heartbeat = job
    event_time = {"currentInputWatermark": 10, "currentOutputWatermark": 9, "numLateRecordsDropped": 2,
                  "newestEventTimestamp": 1_000}
    heartbeat({0: event_time | {"records-in": 4, "spark-plan-ms": 9}})
    by_subtask = {s["subtask"]: s["metrics"] for s in job_summary(harness.dispatcher, job_id)["subtasks"]}
    assert by_subtask == {0: event_time | {"records-in": 4}, 1: {}}
