"""What a task waiting for its TaskManager's SparkSession says (SparkRunner.status): how long it
waited, after another TaskManager's JVM start or, once its own began, what the last start of a
local session took on this machine (kept in the helpers' cache; none for a cluster master); and
the turns the TaskManagers of one machine take to start their JVMs."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from cluster.conf import TaskConfig
from cluster.spark.runner import SparkRunner, read_start_seconds, write_start_seconds

LOCAL = TaskConfig.from_dict({"taskmanager.spark.master": "local[1]"})
CLUSTER = TaskConfig.from_dict({"taskmanager.spark.master": "spark://127.0.0.1:7077"})


def test_a_start_says_what_the_last_local_start_took_here(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = SparkRunner(LOCAL)  # not started: its status is read as a waiting task reads it
    assert first.phase == "queued" and first.status().endswith(", after another TaskManager's)")
    first.phase = "starting"
    assert first.status().startswith("starting Spark (") and first.status().endswith(" s)")  # no figure yet

    write_start_seconds(LOCAL, 7.64)
    assert read_start_seconds(LOCAL) == 7.6
    later = SparkRunner(LOCAL)
    later.phase = "starting"
    assert later.status().endswith(" s; about 8 s here)")
    later.phase = "queued"
    assert later.status().endswith(", after another TaskManager's)")


def test_a_cluster_masters_start_keeps_no_figure(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    write_start_seconds(LOCAL, 5.0)
    write_start_seconds(CLUSTER, 60.0)
    assert read_start_seconds(CLUSTER) is None and read_start_seconds(LOCAL) == 5.0
    (tmp_path / "streamlab" / "jvm" / "spark-start-seconds").write_text("garbage")
    assert read_start_seconds(LOCAL) is None


def every_turn(runner: SparkRunner) -> list:
    turns = []
    while (turn := runner._try_turn()) is not None:
        turns.append(turn)
    return turns


def without_a_jvm(runner: SparkRunner) -> SparkRunner:
    runner._thread = threading.Thread(target=lambda: None)  # start() decides its turn only
    return runner


def test_whether_a_runner_starts_or_queues_is_decided_by_start_itself(monkeypatch, tmp_path: Path):
    # before the TaskManager registers, which tells the ResourceManager the phase
    monkeypatch.setattr(SparkRunner, "lock_dir", tmp_path)
    first = without_a_jvm(SparkRunner(LOCAL)).start()
    others = every_turn(SparkRunner(LOCAL))  # 2 cores: none left; more cores: the rest taken here
    second = without_a_jvm(SparkRunner(LOCAL)).start()
    assert (first.phase, second.phase) == ("starting", "queued")
    assert first._turn is not None and second._turn is None
    for turn in [first._turn, *others]:
        turn.close()


def test_a_turn_is_kept_for_a_waiting_tasks_first_batches_and_given_up_at_once_otherwise(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(SparkRunner, "lock_dir", tmp_path)
    runner = SparkRunner(LOCAL)
    turns = every_turn(runner)
    runner._end_turn(turns[0])
    (freed,) = every_turn(runner)  # no task waited: the next JVM may start now
    runner.task_waited = True
    runner._end_turn(freed)
    assert every_turn(runner) == []  # kept for FIRST_BATCHES_S
    deadline = time.monotonic() + 60
    while not (again := every_turn(runner)):
        assert time.monotonic() < deadline, "the turn was never given up"
        time.sleep(0.05)
    for turn in [*turns[1:], *again]:
        turn.close()


def test_stopping_a_runner_whose_jvm_is_gone_does_not_raise():
    """A TaskManager's stop must end its process even when its JVM was killed under it (found:
    a SIGTERM'd TaskManager whose JVM was gone raised in SparkSession.stop and never exited)."""
    from py4j.protocol import Py4JNetworkError

    class Unreachable:  # PySpark's SparkSession over a JVM that no longer listens
        calls = 0

        def stop(self):
            Unreachable.calls += 1
            raise Py4JNetworkError("An error occurred while trying to connect to the Java server")

    runner = SparkRunner(LOCAL)
    runner.session = Unreachable()  # type: ignore[assignment]
    runner.stop()  # the JVM's end not seen yet: tried, and the failure logged
    assert Unreachable.calls == 1
    runner.lost = "the JVM was killed (signal 9)"
    runner.stop()  # seen: not tried
    assert Unreachable.calls == 1
