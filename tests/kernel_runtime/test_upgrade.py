"""Edit a running %%stream cell and run it again: the job of its --name is upgraded (stopped with a
savepoint, the edited pipeline started from it), on a real cluster, the magic in a real IPython shell."""
import numpy as np
import pandas as pd
import pytest

from cluster.protocol.states import JobState
from kernel_runtime.client.job_handle import JobHandle

from ..conftest import wait_for
from .conftest import run

USERS = 5
ROWS = 3000


@pytest.fixture(autouse=True, scope="module")
def no_current_cluster_after(shell):
    """The shell is the session's: its later users (%stream_cluster status) must not find the
    cluster these cells named with --cluster as theirs."""
    yield
    shell.magics_manager.registry["StreamMagics"].session.current = None


def source(rows) -> str:
    count = f", count={rows}" if rows else ""
    return ("import pandas as pd\n"
            f"events = env.from_generator(lambda seq: pd.DataFrame({{'user': seq % {USERS}, 'seq': seq}}){count}, "
            "rate=300, batch_size=20)\n")


COUNT = "events.key_by('user').count().collect()\n"
COUNT_THEN_FILTER = "events.key_by('user').count().filter(lambda df: df['user'] < 3).collect()\n"
NO_COUNT = "events.filter(lambda df: df['user'] < 3).collect()\n"
ROWS_AS_THEY_COME = "events.collect()\n"


def cell(shell, cluster, options: str, body: str):
    """(the job handle or None, what the cell printed)"""
    result, out = run(shell, f"%%stream --cluster {cluster.cluster_dir} -p 2 --checkpoint-interval '1 s' "
                             f"{options}\n{body}")
    return (result.result if result.success else None), out


def state(handle: JobHandle) -> str:
    return handle.status


def test_a_count_edited_with_a_filter_after_it_continues_its_counts(shell, cluster):
    first, out = cell(shell, cluster, "--name tally", source(ROWS) + COUNT)
    assert first is not None, out
    wait_for(lambda: first.row_count() > 20 * USERS, 30, "counts of the first job")
    second, out = cell(shell, cluster, "--name tally", source(ROWS) + COUNT_THEN_FILTER)
    assert second is not None, out
    assert state(first) == JobState.FINISHED  # stopped with a savepoint, not cancelled
    before = first.results.set_index("user")["count"]
    assert 0 < before.sum() < ROWS  # the upgrade came while the job ran
    assert f"Upgraded job 'tally': job {first.job_id} stopped with savepoint " in out
    assert "  kept their state: 'generator', 'count'" in out and "  started empty: none" in out
    assert second.upgraded_from is not None and second.upgraded_from in out
    assert second.job_graph.config["execution.savepoint.path"] == second.upgraded_from
    live = [j["jid"] for j in second.client.list_jobs()
            if j["name"] == "tally" and j["state"] not in JobState.GLOBALLY_TERMINAL]
    assert live == [second.job_id]

    second.wait(timeout=60)
    # a filter after the count: the cell keeps every row (append), each an update of a key's count
    updates = second.results.groupby("user")["count"]
    expected = pd.DataFrame({"user": np.arange(ROWS) % USERS}).groupby("user").size()
    # nothing lost, nothing counted twice: the counts went on from the savepoint to the end
    assert updates.last().to_dict() == expected[expected.index < 3].to_dict()
    assert (updates.first() > before.reindex(updates.first().index)).all()
    assert all(counts.is_monotonic_increasing for _, counts in updates)


def test_a_removed_count_refuses_the_upgrade_and_the_job_runs_on_until_its_state_may_be_left_out(shell, cluster):
    first, out = cell(shell, cluster, "--name shrink", source(None) + COUNT)
    assert first is not None, out
    wait_for(lambda: first.row_count() > 5 * USERS, 30, "counts")
    refused, out = cell(shell, cluster, "--name shrink", source(None) + NO_COUNT)
    assert refused is None
    (count_uid,) = [o.uid for v in first.job_graph.vertices for o in v.operators if o.kind == "keyed-count"]
    assert "cannot upgrade job 'shrink'" in out and "The job runs on" in out, out
    assert f"operator 'count' (uid {count_uid}), which this job does not have" in out
    assert "--allow-non-restored-state" in out and "Traceback" not in out
    # refused before it was stopped: the old job runs on, its counts still growing
    assert state(first) == JobState.RUNNING
    seen = first.row_count()
    wait_for(lambda: first.row_count() > seen, 30, "counts of the job that runs on")

    upgraded, out = cell(shell, cluster, "--name shrink --allow-non-restored-state", source(None) + NO_COUNT)
    try:
        assert upgraded is not None, out
        assert state(first) == JobState.FINISHED  # stopped with a savepoint, which the new job starts from
        assert upgraded.upgraded_from is not None and upgraded.upgraded_from in out
        assert "kept their state: 'generator'" in out
        assert f"state left out (--allow-non-restored-state): operator 'count' (uid {count_uid})" in out
        wait_for(lambda: upgraded.row_count() > 0, 30, "rows of the upgraded job")
        # the source went on from where it stopped (a fresh one starts at 0, whose user 0 passes the filter)
        assert upgraded.results["seq"].min() > 0

        fresh, out = cell(shell, cluster, "--name shrink --restart", source(None) + ROWS_AS_THEY_COME)
        assert fresh is not None, out
        assert f"Cancelled job 'shrink' ({upgraded.job_id}): this one starts from nothing" in out
        assert state(upgraded) == JobState.CANCELED and fresh.upgraded_from is None
        assert "execution.savepoint.path" not in fresh.job_graph.config and "Upgraded" not in out
        wait_for(lambda: fresh.row_count() > 0, 30, "rows of the restarted job")
        assert fresh.results["seq"].min() == 0
    finally:
        for job in first.client.list_jobs():
            if job["name"] == "shrink" and job["state"] not in JobState.GLOBALLY_TERMINAL:
                first.client.cancel(job["jid"])


def test_a_dry_run_previews_per_operator_what_the_upgrade_then_does_and_stops_nothing(shell, cluster):
    nothing, out = cell(shell, cluster, "--name preview --dry-run", source(None) + NO_COUNT)
    assert nothing is None and "no job named 'preview' runs on the cluster" in out, out

    first, out = cell(shell, cluster, "--name preview", source(None) + COUNT)
    assert first is not None, out
    wait_for(lambda: first.row_count() > 5 * USERS, 30, "counts")
    (count_uid,) = [o.uid for v in first.job_graph.vertices for o in v.operators if o.kind == "keyed-count"]
    try:
        refused, out = cell(shell, cluster, "--name preview --dry-run", source(None) + NO_COUNT)
        assert f"Job 'preview' ({first.job_id}) runs on. The upgrade would be refused" in out, out
        assert dict(zip(refused.operator, refused.state)) == {
            "generator": "restored", "filter": "no state", "collect": "no state", "count": "refused"}
        assert refused.set_index("operator").uid["count"] == count_uid
        allowed, out = cell(shell, cluster, "--name preview --dry-run --allow-non-restored-state",
                            source(None) + NO_COUNT)
        assert "would stop the job with a savepoint and start this pipeline from it" in out, out
        assert dict(zip(allowed.operator, allowed.state))["count"] == "dropped"
        # nothing stopped: the job runs on, counting
        assert state(first) == JobState.RUNNING
        seen = first.row_count()
        wait_for(lambda: first.row_count() > seen, 30, "counts of the job that runs on")

        upgraded, out = cell(shell, cluster, "--name preview --allow-non-restored-state", source(None) + NO_COUNT)
        assert upgraded is not None and state(first) == JobState.FINISHED, out
        # what the upgrade did is what the preview said
        restored = ", ".join(repr(o) for o in allowed.operator[allowed.state == "restored"])
        assert f"kept their state: {restored}" in out and "started empty: none" in out, out
        assert f"state left out (--allow-non-restored-state): operator 'count' (uid {count_uid})" in out
        wait_for(lambda: upgraded.row_count() > 0, 30, "rows of the upgraded job")
        assert upgraded.results["seq"].min() > 0  # the source's state restored, as previewed
    finally:
        for job in first.client.list_jobs():
            if job["name"] == "preview" and job["state"] not in JobState.GLOBALLY_TERMINAL:
                first.client.cancel(job["jid"])
