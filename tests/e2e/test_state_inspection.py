"""Live keyed state (JobHandle.state, GET /jobs/<id>/state) of a running job, on both backends,
against pandas over exactly the input its checkpoint covers (the sources' positions in it). A job
without checkpoints: test_state_inspection_fresh.py (this module's jobs run until its end)."""
from __future__ import annotations

import json
import time
import urllib.error

import numpy as np
import pandas as pd
import pytest

from cluster.connectors.sources import SPLIT_BATCH, default_split_size
from cluster.protocol.endpoint import RpcError
from kernel_runtime import StreamEnvironment
from tests.conftest import rest, wait_for

KEYS = 7
RATE = 3_000  # rows/s over both source subtasks: the job runs on while the tests look


def rows(seq):
    return pd.DataFrame({"k": seq % KEYS, "seq": seq})


def remember(key, batch, state):
    total, marks, parity = state.value_state("total"), state.list_state("marks"), state.map_state("parity")
    total.update((total.value() or 0) + int(batch["seq"].sum()))
    marks.add_all(batch.loc[batch["seq"] % 50 == 0, "seq"].tolist())
    for odd, n in (batch["seq"] % 2).value_counts().items():
        parity.put(int(odd), parity.get(int(odd), 0) + int(n))
    return None


def covered(sources: dict) -> np.ndarray:
    """The sequence numbers the generator's subtasks had emitted at the checkpoint: split s is
    fully read where a fact says so, and the current split up to its offset."""
    split = default_split_size(None, SPLIT_BATCH)
    seqs = []
    for subtask in sources["generator"]:
        position = subtask["position"]
        for fact in position["facts"]:
            for k in range(fact["done"]):
                s = fact["i"] + k * fact["p"]
                seqs.append(np.arange(s * split, (s + 1) * split))
        for s, offset in position["partial"].items():
            seqs.append(np.arange(int(s) * split, int(s) * split + offset))
    return np.concatenate(seqs) if seqs else np.array([], dtype=np.int64)


def expected_counts(frame: pd.DataFrame) -> pd.DataFrame:
    input_rows = rows(covered(frame.attrs["sources"]))
    return input_rows.groupby("k").size().rename("count").reset_index()


def assert_counts(frame: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(frame.reset_index(drop=True), expected_counts(frame), check_dtype=False)


def expected_process(sources: dict) -> dict:
    seq = covered(sources)
    out = {}
    for k in range(KEYS):
        mine = seq[seq % KEYS == k]
        if len(mine):
            out[k] = {"total": int(mine.sum()), "marks": sorted(mine[mine % 50 == 0].tolist()),
                      "parity": {int(p): int(n) for p, n in pd.Series(mine % 2).value_counts().items()}}
    return out


@pytest.fixture(scope="module", params=["hashmap", "rocksdb"])
def running_job(request, cluster):
    from kernel_runtime import JobClient
    client = JobClient(cluster.info)
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir, config={
        "state.backend.type": request.param, "execution.checkpointing.interval": "300 ms"})
    keyed = env.from_generator(rows, rate=RATE).key_by("k")
    keyed.count().collect()
    keyed.process(remember, name="remember").collect(name="remembered")
    handle = env.execute_async(f"state {request.param}", client=client)
    wait_for(lambda: rest(cluster, f"/jobs/{handle.job_id}/checkpoints")[1]["counts"]["completed"] >= 1,
             60, "a first completed checkpoint")
    yield handle
    handle.cancel()
    wait_for(lambda: handle.status == "CANCELED", 30, "the job cancelled")
    client.close()


def test_state_equals_pandas_at_its_checkpoint_while_the_job_runs(running_job):
    first = running_job.state("count")
    assert list(first.columns) == ["k", "count"]
    assert first.attrs["operator"] == "count" and first.attrs["checkpoint_id"] >= 1
    assert_counts(first)
    assert running_job.status == "RUNNING"
    # later: a newer checkpoint, more input, bigger counts, still exactly the input it covers
    def newer():
        frame = running_job.state("count")
        newer = frame.attrs["checkpoint_id"] > first.attrs["checkpoint_id"]
        return [frame] if newer and frame["count"].sum() > first["count"].sum() else None
    (later,) = wait_for(newer, 30, "a newer checkpoint")
    assert_counts(later)
    assert running_job.status == "RUNNING"


def test_reads_while_newer_checkpoints_subsume_the_one_read(running_job):
    # one checkpoint retained (the default), one every 300 ms: the one being read is soon
    # subsumed, and its folder is deleted only after the read (pinned by the JobMaster)
    seen, reads, deadline = set(), 0, time.monotonic() + 30
    while len(seen) < 4 and time.monotonic() < deadline:
        frame = running_job.state("count")
        assert_counts(frame)
        seen.add(frame.attrs["checkpoint_id"])
        reads += 1
    assert len(seen) >= 4, f"{reads} reads saw checkpoints {sorted(seen)} only"


def test_the_uid_names_the_operator_too(running_job):
    by_name = running_job.state("count")
    by_uid = running_job.state(by_name.attrs["uid"], fresh=True)
    assert by_uid.attrs["operator"] == "count"
    assert_counts(by_uid)


def test_fresh_takes_a_checkpoint_newer_than_the_last_completed(running_job, cluster):
    last = running_job.state("count").attrs["checkpoint_id"]
    fresh = running_job.state("count", fresh=True)
    assert fresh.attrs["checkpoint_id"] > last
    assert_counts(fresh)
    assert running_job.status == "RUNNING"


def test_one_key(running_job):
    row = running_job.state("count", key=3)
    assert row["k"].tolist() == [3]
    expected = expected_counts(row)
    assert row["count"].tolist() == expected.loc[expected["k"] == 3, "count"].tolist()
    assert running_job.state("count", key=KEYS + 100).empty  # no such key: no row
    assert running_job.state("count", key=np.int64(2))["k"].tolist() == [2]


def test_value_list_and_map_state_of_a_process_function(running_job):
    frame = running_job.state("remember", fresh=True)
    assert list(frame.columns) == ["k", "marks", "parity", "total"]
    expected = expected_process(frame.attrs["sources"])
    assert frame["k"].tolist() == sorted(expected)
    for k, marks, parity, total in frame.itertuples(index=False):
        assert isinstance(marks, list) and isinstance(parity, dict)
        # two source subtasks feed each key: the order of the list follows arrival, its content not
        assert (total, sorted(marks), parity) == (expected[k]["total"], expected[k]["marks"], expected[k]["parity"])


def test_rest_route(running_job, cluster):
    job = running_job.job_id
    status, body = rest(cluster, f"/jobs/{job}/state?operator=count")
    assert status == 200 and body["operator"] == "count" and body["columns"] == ["k", "count"]
    frame = pd.DataFrame(body["rows"], columns=body["columns"])
    frame.attrs["sources"] = body["sources"]
    assert_counts(frame)
    _, fresh = rest(cluster, f"/jobs/{job}/state?operator=count&fresh=true")
    assert fresh["checkpoint_id"] > body["checkpoint_id"]
    _, one = rest(cluster, f"/jobs/{job}/state?operator=remember&key=4")
    assert one["columns"] == ["k", "marks", "parity", "total"] and [r[0] for r in one["rows"]] == [4]
    k, marks, parity, total = one["rows"][0]
    expected = expected_process(one["sources"])[4]
    assert (total, sorted(marks)) == (expected["total"], expected["marks"])
    assert parity == {str(p): n for p, n in expected["parity"].items()}  # JSON object keys are strings


@pytest.mark.parametrize("query, status, words", [
    ("", 400, "give the operator"),
    ("?operator=count&fresh=maybe", 400, "fresh must be true or false"),
    ("?operator=nope", 409, "no operator named 'nope'"),
    ("?operator=generator", 409, "keeps no keyed state"),
])
def test_rest_errors(running_job, cluster, query, status, words):
    with pytest.raises(urllib.error.HTTPError) as err:
        rest(cluster, f"/jobs/{running_job.job_id}/state{query}")
    assert err.value.code == status
    message = json.loads(err.value.read())["errors"][0]
    assert words in message
    if status == 409:
        assert "'count'" in message and "'remember'" in message  # the operators that have state


def test_unknown_operator_lists_the_stateful_ones(running_job):
    with pytest.raises(RpcError, match=r"no operator named 'counts'.*'count' \(uid .*'remember'"):
        running_job.state("counts")
    with pytest.raises(RpcError, match="'generator' .* keeps no keyed state"):
        running_job.state("generator")
