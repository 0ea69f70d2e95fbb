"""The own_cluster fixture's log check (tests/cluster_fixture.py) on logs written here: what it
takes for an error, and what an expected one lets pass. (Its other checks need a cluster; they
were each shown to fail by a test that broke them on purpose.)"""
from __future__ import annotations

from tests.cluster_fixture import log_problems

RECORDS = """\
2026-11-26 11:13:16,900 INFO cluster.taskmanager.task: Source: generator (1/1) switched to RUNNING
2026-11-26 11:13:16,993 INFO cluster.taskmanager.task: Source: generator (1/1) failed
Traceback (most recent call last):
  File "x.py", line 1, in f
cluster.connectors.sources.PlannedFailure: planned failure at row 5 in attempt 1
2026-11-26 11:13:17,022 WARNING streamlab.taskmanager: a warning is no error
2026-11-26 11:13:17,100 ERROR cluster.jobmanager: something broke
"""


def test_error_records_and_tracebacks_are_problems_unless_expected(tmp_path):
    (tmp_path / "taskmanager-0.log").write_text(RECORDS)
    (tmp_path / "taskmanager-0.out").write_text("Spark says hello\n")
    problems = log_problems(tmp_path, ())
    assert [p.splitlines()[0] for p in problems] == [
        "taskmanager-0.log: 2026-11-26 11:13:16,993 INFO cluster.taskmanager.task: Source: generator (1/1) failed",
        "taskmanager-0.log: 2026-11-26 11:13:17,100 ERROR cluster.jobmanager: something broke"]
    assert log_problems(tmp_path, ("planned failure at row 5", "something broke")) == []


def test_an_expected_error_that_is_in_no_log_is_a_problem(tmp_path):
    (tmp_path / "jobmanager.log").write_text(RECORDS.splitlines(keepends=True)[0])
    assert log_problems(tmp_path, ("planned failure",)) == [
        "the expected error 'planned failure' is in no log of the cluster"]


def test_a_traceback_on_stdout_and_rolled_over_logs_are_read(tmp_path):
    (tmp_path / "taskmanager-1.out").write_text("hello\nTraceback (most recent call last):\n  File \"y\"\nKeyError: 1\n")
    (tmp_path / "taskmanager-1.log.1").write_text(RECORDS.splitlines(keepends=True)[-1])
    problems = log_problems(tmp_path, ())
    assert len(problems) == 2 and "KeyError: 1" in problems[1] and "something broke" in problems[0]
