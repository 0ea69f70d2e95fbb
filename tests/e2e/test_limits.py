"""Limits with clear errors, on a real cluster: a job graph over pipeline.jobgraph.max-size is
refused at submit naming its biggest closure (and by the Dispatcher for any client), a graph just
under it runs; ended jobs keep no user code in the JobManager and at most jobstore.max-capacity
of them are kept."""
from __future__ import annotations

from datetime import datetime
import urllib.error
from pathlib import Path

import pytest

from cluster.conf import MAX_JOB_GRAPH_BYTES
from cluster.protocol.states import JobState
from cluster.graph.job_graph import JobGraphTooLarge
from cluster.protocol import messages as m
from cluster.protocol.endpoint import RpcError
from kernel_runtime import StreamEnvironment
from kernel_runtime.client.job_client import JobClient
from tests.conftest import rest, start_cluster, wait_for

CAPACITY = 3
EXPIRATION_S = 20  # long enough for a test's own jobs, short enough to watch one expire
MB = 1 << 20


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory):
    local = start_cluster(tmp_path_factory.mktemp("limits"), taskmanagers=1, slots=2, **{
        "pipeline.jobgraph.max-size": MAX_JOB_GRAPH_BYTES, "jobstore.max-capacity": CAPACITY,
        "jobstore.expiration-time": EXPIRATION_S,
        "taskmanager.spark.startup": "lazy"})
    yield local
    local.stop()


@pytest.fixture
def limits_client(own_cluster):
    c = JobClient(own_cluster.info, timeout=60)
    yield c
    c.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def pipeline(cluster_dir: Path, closure_bytes: int) -> StreamEnvironment:
    env = StreamEnvironment(parallelism=1, cluster=cluster_dir)
    blob = b"x" * closure_bytes
    (env.from_generator(count=3, batch_size=3)
        .map_batches(lambda df, _b=blob: df.assign(n=len(_b)), name="holds a blob")
        .collect())
    return env


def run(env: StreamEnvironment, client: JobClient, name: str):
    handle = env.execute_async(name, client=client)
    result = handle.wait(120)
    assert result.state == JobState.FINISHED, result
    return handle.job_id, result


def test_a_100_mb_closure_is_refused_at_submit_naming_it(own_cluster, limits_client):
    env = pipeline(own_cluster.cluster_dir, 100_000_000)
    jm_before = rss_mb(own_cluster.jobmanager.pid)
    with pytest.raises(JobGraphTooLarge) as info:  # refused by the client, before anything is sent
        env.execute_async("too big", client=limits_client)
    text = str(info.value)
    assert "job 'too big' is too large to submit" in text
    assert "operator 'holds a blob' (test_limits.py:" in text and "95.4 mb" in text
    assert "pipeline.jobgraph.max-size = 63.0 mb" in text
    # nothing reached the JobManager, which serves the next job as before
    assert rss_mb(own_cluster.jobmanager.pid) - jm_before < 20
    _, result = run(pipeline(own_cluster.cluster_dir, 10), limits_client, "after the refusal")
    assert list(result.to_pandas()["n"]) == [10, 10, 10]


def test_the_dispatcher_refuses_an_oversize_graph_from_a_client_that_does_not_check(own_cluster, limits_client):
    graph = pipeline(own_cluster.cluster_dir, MAX_JOB_GRAPH_BYTES + MB // 2).get_job_graph("unchecked")
    with pytest.raises(RpcError, match=r"job rejected: job 'unchecked' is too large .* over "
                                       r"pipeline.jobgraph.max-size .* operator 'holds a blob'"):
        limits_client.rpc.request(m.SubmitJob(graph.to_dict(), None), expect=m.JobSubmitted, timeout=60)


def test_a_job_may_not_raise_the_cluster_limit_for_itself(own_cluster, limits_client):
    env = pipeline(own_cluster.cluster_dir, 10)
    env.config["pipeline.jobgraph.max-size"] = "1 kb"
    with pytest.raises(RpcError, match="'pipeline.jobgraph.max-size' is cluster-wide"):
        env.execute_async("own limit", client=limits_client)


def pipeline_of_size(cluster_dir: Path, size: int) -> tuple[StreamEnvironment, int]:
    """A pipeline whose job graph is ``size`` bytes on the wire, and the size of its closure."""
    guess = size - 8 * 1024
    overhead = pipeline(cluster_dir, guess).get_job_graph("just under").wire_size() - guess
    env = pipeline(cluster_dir, size - overhead)
    assert env.get_job_graph("just under").wire_size() == size
    return env, size - overhead


def test_a_graph_just_under_the_limit_runs(own_cluster, limits_client):
    env, closure = pipeline_of_size(own_cluster.cluster_dir, MAX_JOB_GRAPH_BYTES - 16)
    _, result = run(env, limits_client, "just under")
    assert list(result.to_pandas()["n"]) == [closure] * 3


def test_ended_jobs_keep_no_user_code_and_the_history_is_bounded(own_cluster, limits_client):
    run(pipeline(own_cluster.cluster_dir, 10), limits_client, "warm-up")
    before = rss_mb(own_cluster.jobmanager.pid)
    ids = [run(pipeline(own_cluster.cluster_dir, 40 * MB), limits_client, f"40 MB closure {i}")[0]
           for i in range(CAPACITY + 1)]
    grown = rss_mb(own_cluster.jobmanager.pid) - before
    # each ended job kept with its graph would hold 40 MB; CAPACITY of them are kept
    assert grown < 40, f"the JobManager grew by {grown:.0f} MB over {len(ids)} jobs with 40 MB closures"
    status, overview = rest(own_cluster, "/jobs/overview")
    assert status == 200
    assert [j["jid"] for j in sorted(overview["jobs"], key=lambda j: j["start-time"])] == ids[-CAPACITY:]
    with pytest.raises(urllib.error.HTTPError) as gone:
        rest(own_cluster, f"/jobs/{ids[0]}")
    assert gone.value.code == 404
    status, details = rest(own_cluster, f"/jobs/{ids[-1]}")
    assert status == 200 and details["state"] == "FINISHED" and details["name"] == f"40 MB closure {CAPACITY}"
    assert [v["name"] for v in details["vertices"]] and all(v["parallelism"] == 1 for v in details["vertices"])
    assert "holds a blob [map-batches]" in str(details["plan"])


@pytest.mark.slow  # waits out a 20 s expiration
def test_an_ended_job_expires_after_jobstore_expiration_time(own_cluster, limits_client):
    job_id, _ = run(pipeline(own_cluster.cluster_dir, 10), limits_client, "expires")
    ended_ms = rest(own_cluster, f"/jobs/{job_id}")[1]["end-time"]

    def listed() -> bool:
        return job_id in {j["jid"] for j in rest(own_cluster, "/jobs/overview")[1]["jobs"]}
    assert listed()
    wait_for(lambda: not listed(), timeout=EXPIRATION_S + 30, what="the ended job to expire")
    # not before its time, by the JobManager's own clock: its log line of the removal against
    # the job's end time (a loaded machine can only make the removal later)
    removal = next(line for line in (own_cluster.cluster_dir / "log" / "jobmanager.log").read_text().splitlines()
                   if f"job {job_id} removed from the job store" in line)
    removed_ms = datetime.strptime(removal[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000
    assert removed_ms - ended_ms >= EXPIRATION_S * 1000 - 10, (removal, ended_ms)
