"""The REST API keeps Flink's paths and JSON field names (compared with Flink 2.3's own answers)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cluster.graph.event_time import NO_WATERMARK
from kernel_runtime import StreamEnvironment
from kernel_runtime.api import Duration, WatermarkStrategy
from kernel_runtime.client.events import ClusterEvents
from kernel_runtime.notebook.widgets.metrics import event_time
from tests.conftest import rest, running_keyed_count, wait_for

FLINK = Path(__file__).resolve().parent.parent / "fixtures" / "flink-rest"


def flink(name: str) -> dict:
    return json.loads((FLINK / name).read_text())["response"]


def missing_fields(reference, ours, path="") -> list[str]:
    """Every field Flink's answer has, recursively (first element of lists), that ours lacks."""
    missing = []
    if isinstance(reference, dict):
        if not isinstance(ours, dict):
            return [path or "/"]
        for key, value in reference.items():
            if key not in ours:
                missing.append(f"{path}/{key}")
            else:
                missing += missing_fields(value, ours[key], f"{path}/{key}")
    elif isinstance(reference, list) and reference and isinstance(reference[0], dict):
        if not ours:
            return [f"{path}[] (empty)"]
        missing += missing_fields(reference[0], ours[0], f"{path}[0]")
    return missing


# Flink internals that have no meaning here; everything else must be present.
NOT_APPLICABLE = {"/taskmanagers[0]/totalResource", "/taskmanagers[0]/freeResource",
                  "/taskmanagers[0]/memoryConfiguration", "/application-id"}


@pytest.fixture(scope="class")
def running_job(cluster):
    with running_keyed_count(cluster, "rest fields", rate=2_000, batch_size=100, rows=101) as handle:
        yield handle


class TestWhileAJobRuns:
    """One job runs through these tests; it is cancelled (and the cluster checked) after them."""

    @pytest.mark.parametrize("path,reference", [
        ("/overview", "overview.json"),
        ("/taskmanagers", "taskmanagers.json"),
        ("/jobs/overview", "jobs_overview.json"),
        ("/config", "config.json"),
    ])
    def test_cluster_endpoints_have_flinks_fields(self, cluster, running_job, path, reference):
        status, body = rest(cluster, path)
        assert status == 200
        assert set(missing_fields(flink(reference), body)) <= NOT_APPLICABLE


    @pytest.mark.parametrize("suffix,reference", [
        ("", "jobs_ID.json"), ("/status", "jobs_ID_status.json"), ("/plan", "jobs_ID_plan.json"),
        ("/exceptions", "jobs_ID_exceptions.json"),
    ])
    def test_job_endpoints_have_flinks_fields(self, cluster, running_job, suffix, reference):
        status, body = rest(cluster, f"/jobs/{running_job.job_id}{suffix}")
        assert status == 200
        assert set(missing_fields(flink(reference), body)) <= NOT_APPLICABLE


    def test_vertex_endpoints_have_flinks_fields(self, cluster, running_job):
        _, job = rest(cluster, f"/jobs/{running_job.job_id}")
        for vertex in job["vertices"]:
            base = f"/jobs/{running_job.job_id}/vertices/{vertex['id']}"
            status, body = rest(cluster, base)
            assert status == 200 and not missing_fields(flink("jobs_ID_vertices_ID.json"), body)
            status, body = rest(cluster, base + "/backpressure")
            assert status == 200 and not missing_fields(flink("jobs_ID_vertices_ID_backpressure.json"), body)
            assert body["backpressureLevel"] in ("ok", "low", "high")
            assert len(body["subtasks"]) == vertex["parallelism"]
            # no event time: every subtask is listed, without a watermark (Flink's Long.MIN_VALUE)
            status, body = rest(cluster, base + "/watermarks")
            assert status == 200 and body == [{"id": f"{i}.currentInputWatermark", "value": str(NO_WATERMARK)}
                                              for i in range(vertex["parallelism"])]

    def test_values_are_right_not_only_names(self, cluster, running_job):
        _, o = rest(cluster, "/overview")
        assert (o["taskmanagers"], o["slots-total"], o["slots-available"], o["jobs-running"]) == (2, 4, 2, 1)
        _, tms = rest(cluster, "/taskmanagers")
        # as Flink's default (cluster.evenly-spread-out-slots: false), the job fills one TaskManager
        assert sorted(tm["slotsNumber"] - tm["freeSlots"] for tm in tms["taskmanagers"]) == [0, 2]
        _, jobs = rest(cluster, "/jobs/overview")
        (job,) = [j for j in jobs["jobs"] if j["jid"] == running_job.job_id]
        assert job["state"] == "RUNNING" and job["tasks"]["running"] == 4 and job["tasks"]["total"] == 4
        _, detail = rest(cluster, f"/jobs/{running_job.job_id}")
        source, counter = sorted(detail["vertices"], key=lambda v: v["name"] != "Source: generator")
        assert source["parallelism"] == 2 and source["status"] == "RUNNING"
        assert detail["plan"]["nodes"] and {"HASH"} == {i["ship_strategy"] for n in detail["plan"]["nodes"]
                                                         for i in n.get("inputs", [])}
        # metrics arrive with heartbeats: records written by the source are read by the counter
        wait_for(lambda: rest(cluster, f"/jobs/{running_job.job_id}")[1]["vertices"][0]["metrics"]["write-records"] > 0,
                 10, "vertex metrics")


T0 = 1_700_000_000_000  # event time of the first row, epoch ms


def test_every_subtasks_watermark_advances_through_rest_and_reaches_the_dashboard(cluster, client):
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(200)).with_timestamp_column("ts")
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    (env.from_generator(lambda seq: pd.DataFrame({"k": seq % 10, "ts": T0 + seq * 10}), rate=2_000, batch_size=50,
                        watermark_strategy=strategy, name="events")
        .key_by("k").count(name="per key").collect())
    handle = env.execute_async("watermarks", client=client)
    watch = ClusterEvents.follow(cluster.info, handle.job_id)
    try:
        wait_for(lambda: handle.status == "RUNNING", 20, "running")
        source, counter = sorted(rest(cluster, f"/jobs/{handle.job_id}")[1]["vertices"],
                                 key=lambda v: v["name"] != "Source: events")

        def watermarks(vertex: dict, path: str = "watermarks") -> dict[str, int]:
            return {m["id"]: int(m["value"]) for m in rest(cluster, f"/jobs/{handle.job_id}/vertices/{vertex['id']}/"
                                                                  f"{path}")[1]}

        # the keyed count's input watermark is the minimum over both sources' watermarks, which
        # trail their event time by the bound; a source has no input, so no input watermark (as Flink's)
        inputs = [f"{i}.currentInputWatermark" for i in range(2)]
        first = wait_for(lambda: (w := watermarks(counter)) and sorted(w) == inputs and
                         min(w.values()) >= T0 and w, 20, "every counter subtask's input watermark")
        wait_for(lambda: all(w > first[i] for i, w in watermarks(counter).items()), 20, "the watermarks advancing")
        assert watermarks(source) == dict.fromkeys(inputs, NO_WATERMARK)
        outputs = [f"{i}.currentOutputWatermark" for i in range(2)]
        emitted = watermarks(source, "metrics?get=" + ",".join(outputs))
        assert sorted(emitted) == outputs and min(emitted.values()) >= T0

        # the dashboard's view, from the job's events: each vertex's watermark, its lag, no late records
        def dashboard():
            job = event_time(watch.view.summary)
            return job if job is not None and all(v.lag_ms is not None for v in job.vertices) else None
        job = wait_for(dashboard, 20, "event time in the job's events")
        names = [v["name"] for v in rest(cluster, f"/jobs/{handle.job_id}")[1]["vertices"]]
        assert [v.name for v in job.vertices] == names
        assert job.newest >= T0 and all(v.watermark >= T0 and v.late_dropped == 0 for v in job.vertices)
    finally:
        watch.close()
        handle.cancel()
        wait_for(lambda: handle.status == "CANCELED", 20, "cancelled")


def test_cancel_through_rest(cluster, client):
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_generator(rate=100).collect()
    handle = env.execute_async("rest cancel", client=client)
    wait_for(lambda: handle.status == "RUNNING", 20, "running")
    status, body = rest(cluster, f"/jobs/{handle.job_id}?mode=cancel", method="PATCH")
    assert status == 202 and body == {}
    wait_for(lambda: rest(cluster, f"/jobs/{handle.job_id}/status")[1]["status"] == "CANCELED", 20, "cancelled")


def test_unknown_paths_and_jobs_are_404_with_flinks_error_shape(cluster):
    import urllib.error
    for path in ("/nope", "/jobs/" + "0" * 32):
        with pytest.raises(urllib.error.HTTPError) as info:
            rest(cluster, path)
        assert info.value.code == 404 and "errors" in json.loads(info.value.read())
