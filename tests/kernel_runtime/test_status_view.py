"""The dashboard header of a failing, restarting and failed job: the root cause in one line, the
rest (notes, the user's traceback behind a <details>) in a widget that changes only with it."""
import time

from cluster.common import failures
from kernel_runtime.notebook.widgets.base import Update
from kernel_runtime.notebook.widgets.feed import Snapshot
from kernel_runtime.notebook.widgets.status import StatusView, restart_note

CAUSE = failures.task_failed("KeyError: 'nope', in operator 'enrich' (In [5], line 4)\n\nTraceback (most recent call "
                             "last):\n  In [5], line 4, in enrich\n    return df['nope']\nKeyError: 'nope'",
                             "enrich (1/1)", "tm-1")


def shown(view: StatusView, state: str, duration: int, failure=CAUSE, reason=None) -> tuple[str, str]:
    details = {"state": state, "duration": duration, "failure-cause": failure, "status-reason": reason}
    view.update(Update(Snapshot(0.0, details, {}), [], 0.0))
    return view.header.value, view.cause.value


def test_a_restarting_job_shows_the_cause_of_the_restart_and_keeps_its_traceback_widget():
    view = StatusView("job", "j1")
    header, cause = shown(view, "RESTARTING", 1200, reason="restarting in 1000 ms (restart 1)")
    assert "KeyError: &#x27;nope&#x27;, in operator &#x27;enrich&#x27; (In [5], line 4)" in header
    assert "Task &#x27;enrich (1/1)&#x27; failed on TaskManager tm-1." in cause
    assert '<details class="streamlab-traceback">' in cause and "open" not in cause
    # the clock goes on: the header changes, the cause (maybe opened by the user) is not rewritten
    shown(view, "RESTARTING", 1700)
    assert view.header.value != header and view.cause.value is cause


def test_after_the_restart_the_cause_is_history_and_a_failed_job_shows_the_last_one():
    view = StatusView("job", "j1")
    header, cause = shown(view, "RUNNING", 3000, reason=None)
    assert "KeyError" not in header and cause == ""
    failed = failures.add_note(CAUSE, "The job was not restarted: restart-strategy.type is none.")
    header, cause = shown(view, "FAILED", 3100, failure=failed)
    assert "(In [5], line 4)" in header and "not restarted" not in header
    assert "The job was not restarted: restart-strategy.type is none." in cause
    # a failure without a traceback (a lost TaskManager) has no <details>
    _, cause = shown(view, "FAILED", 3100, failure="TaskManager tm-1 lost: no heartbeat for 2000 ms")
    assert "<details" not in cause


def test_a_job_started_by_an_upgrade_says_from_which_savepoint():
    header, _ = shown(StatusView("job", "j2", upgraded_from="/tmp/sp/savepoint-ab12"), "RUNNING", 500, failure=None)
    assert "upgraded from savepoint <code>/tmp/sp/savepoint-ab12</code>" in header
    header, _ = shown(StatusView("job", "j1"), "RUNNING", 500, failure=None)
    assert "upgraded" not in header


def test_a_later_attempt_says_what_it_restarted_after_and_what_it_restored():
    lost = failures.task_failed("TaskManager tm-1 lost: no heartbeat for 2000 ms", "step (1/2)", "tm-1")
    details = {"state": "RUNNING", "duration": 9000, "failure-cause": None, "attempt": 2,
               "last-failure": {"cause": lost, "timestamp": 1_700_000_000_000, "task": "step (1/2)", "taskmanager": "tm-1"},
               "checkpoints": {"latest": {"restored": {"id": 7, "is_savepoint": False}}}}
    assert restart_note(details, "RUNNING") == (
        f"restarted {time.strftime('%H:%M:%S', time.localtime(1_700_000_000))} after TaskManager tm-1 lost: "
        "no heartbeat for 2000 ms; restored checkpoint 7")
    view = StatusView("job", "j1")
    view.update(Update(Snapshot(0.0, details, {}), [], 0.0))
    assert 'class="streamlab-restart"' in view.header.value and "restored checkpoint 7" in view.header.value
    # nothing to restore: it says so; a first attempt, or a job failing now, has no such note
    details["checkpoints"] = {"latest": {"restored": None}}
    assert restart_note(details, "RUNNING").endswith("no checkpoint to restore: it started from the beginning")
    assert restart_note(details | {"attempt": 1}, "RUNNING") == ""
    assert restart_note(details, "RESTARTING") == ""


def test_a_running_job_shows_its_latency_and_its_bottleneck_in_words():
    details = {"state": "RUNNING", "duration": 5000,
               "latency": {"p50": 12.3, "p90": 45.0, "p99": 1_250.0, "rows": 900,
                           "event-time-lag": {"p50": 2_500.0, "p90": 3_000.0, "p99": 61_000.0}},
               "bottleneck": {"vertex-id": "v2", "name": "enrich", "chronic": True,
                              "skew": {"key-group": 17}, "text": "'enrich' limits the job, busy 97% ..."}}
    view = StatusView("job", "j1")
    view.update(Update(Snapshot(0.0, details, {}), [], 0.0))
    header = view.header.value
    assert "latency p50 12 ms, p90 45 ms, p99 1.25 s" in header
    assert "event time 2.50 s behind (p99 1 min 01 s)" in header
    assert 'data-vertex="enrich" data-chronic="1" data-key-group="17"' in header
    assert "Bottleneck: &#x27;enrich&#x27; limits the job" in header
    # once the job ends, neither: they describe a running job
    view.update(Update(Snapshot(0.0, details | {"state": "FINISHED"}, {}), [], 0.0))
    assert "latency" not in view.header.value and "Bottleneck" not in view.header.value
