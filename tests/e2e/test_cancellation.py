"""Cancel ends a task stuck in user code (Flink's task.cancellation.interval/timeout): a function
that sleeps is out of reach of any interrupt, so its TaskManager restarts itself after the timeout;
one that spins is interrupted in place. Either way the job is CANCELED, every slot comes back and
the cluster runs the next job. What ended each job shows in the TaskManagers: the watchdog's fatal
error and a restart, or neither (checked once heartbeats show the watchdog's time has passed)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from cluster.protocol.states import JobState
from kernel_runtime import JobCancelledError, JobClient, StreamEnvironment
from tests.conftest import assert_at_rest, rest, start_cluster, wait_for

from .heartbeats import wait_for_heartbeats

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0
WATCHDOG = f"did not stop within {TIMEOUT_S * 1000:.0f} ms of its cancel (task.cancellation.timeout)"


@pytest.fixture
def own_cluster(tmp_path):
    local = start_cluster(tmp_path / "c", **{"taskmanager.spark.startup": "lazy",
                                             "task.cancellation.interval": "500 ms",
                                             "task.cancellation.timeout": f"{TIMEOUT_S:g} s"})
    yield local
    local.stop()


def _stuck_job(local, function, marker: Path):
    """Run a job whose user function gets stuck; return it once every subtask is inside it."""
    client = JobClient(local.info)
    env = StreamEnvironment(parallelism=2, cluster=local.cluster_dir)
    env.from_generator(rate=1_000, batch_size=10).map_batches(function, name="stuck").collect()
    handle = env.execute_async("stuck", client=client)
    wait_for(lambda: len(list(marker.parent.glob(marker.name + ".*"))) == 2, 30, "both subtasks stuck")
    return client, handle


def _taskmanager_ids(local) -> set[str]:
    return {t["id"] for t in rest(local, "/taskmanagers")[1]["taskmanagers"]}


def _cancel(local, handle) -> float:
    """Cancel the job and wait (generously) for it to end CANCELED; the time of the cancel."""
    cancelled = time.time()
    handle.cancel()
    with pytest.raises(JobCancelledError):
        handle.wait(60)
    assert handle.status == JobState.CANCELED
    return cancelled


def _logs(local) -> dict[int, str]:
    """Each TaskManager's log by its process id (a restarted TaskManager keeps its pid)."""
    return {proc.pid: (local.cluster_dir / "log" / f"taskmanager-{i}.log").read_text()
            for i, proc in enumerate(local.taskmanagers)}


def _stuck_pids(marker: Path) -> set[int]:
    return {int(p.name.split(".")[1]) for p in marker.parent.glob(marker.name + ".*")}


def _slots_back(local) -> None:
    """All 4 slots free again, once the restarted TaskManagers have registered (a fresh Python)."""
    started = time.monotonic()
    wait_for(lambda: (o := rest(local, "/overview")[1])["slots-total"] == 4 and o["taskmanagers"] == 2, 30,
             "both TaskManagers registered again")
    assert_at_rest(local)
    print(f"slots back {time.monotonic() - started:.1f} s after the job was CANCELED")


def _runs_next_job(local, client) -> None:
    env = StreamEnvironment(parallelism=4, cluster=local.cluster_dir)
    env.from_generator(count=2_000, batch_size=100).map_batches(lambda df: df).collect()
    assert sorted(env.execute_async("next", client=client).wait(60).to_pandas()["seq"]) == list(range(2_000))


def test_sleeping_function_is_cancelled_by_restarting_its_taskmanager(own_cluster, tmp_path):
    marker = tmp_path / "entered"

    def sleep_forever(df):
        import os
        import time
        open(f"{marker}.{os.getpid()}.{id(df)}", "w").close()
        time.sleep(600)  # no interrupt reaches a thread in time.sleep
        return df

    before = _taskmanager_ids(own_cluster)
    pids = {p.pid for p in own_cluster.taskmanagers}
    client, handle = _stuck_job(own_cluster, sleep_forever, marker)
    _cancel(own_cluster, handle)
    # only the watchdog could end it: each TaskManager of a stuck subtask says so, and restarted
    stuck = _stuck_pids(marker)
    assert stuck <= pids, stuck
    for pid, text in _logs(own_cluster).items():
        assert (WATCHDOG in text) == (pid in stuck), f"TaskManager {pid} (stuck: {pid in stuck}):\n{text[-2000:]}"
    # every slot back, on restarted TaskManagers: same processes (pids), fresh ids
    _slots_back(own_cluster)
    tms = rest(own_cluster, "/taskmanagers")[1]["taskmanagers"]
    assert {t["pid"] for t in tms} == pids
    restarted = before - _taskmanager_ids(own_cluster)
    assert len(restarted) == len(stuck), f"restarted {restarted}, stuck subtasks in {stuck}"
    _runs_next_job(own_cluster, client)
    client.close()


def test_spinning_function_is_interrupted_in_place(own_cluster, tmp_path):
    marker = tmp_path / "entered"

    def spin_forever(df):
        import os
        open(f"{marker}.{os.getpid()}.{id(df)}", "w").close()
        while True:  # a busy loop in user code: never returns, never looks at any flag
            pass

    before = _taskmanager_ids(own_cluster)
    client, handle = _stuck_job(own_cluster, spin_forever, marker)
    cancelled = _cancel(own_cluster, handle)
    assert_at_rest(own_cluster)
    # interrupted, no restart needed: heartbeats of both, received after the watchdog would have
    # fired, and neither TaskManager says it did
    wait_for_heartbeats(own_cluster, before, after=cancelled + TIMEOUT_S + 1)
    assert _taskmanager_ids(own_cluster) == before
    assert not [pid for pid, text in _logs(own_cluster).items() if "fatal error" in text]
    for proc in own_cluster.taskmanagers:  # and the spinning threads are gone, not only forgotten
        import psutil
        wait_for(lambda: psutil.Process(proc.pid).cpu_percent(0.5) < 50, 10, "TaskManager CPU back down")
    _runs_next_job(own_cluster, client)
    client.close()


def test_spinning_function_that_swallows_the_interrupt_restarts_its_taskmanager(own_cluster, tmp_path):
    marker = tmp_path / "entered"

    def spin_stubbornly(df):
        import os
        open(f"{marker}.{os.getpid()}.{id(df)}", "w").close()
        while True:
            try:
                while True:
                    pass
            except BaseException:  # a careless user's catch-all
                pass

    before = _taskmanager_ids(own_cluster)
    client, handle = _stuck_job(own_cluster, spin_stubbornly, marker)
    _cancel(own_cluster, handle)
    stuck = _stuck_pids(marker)
    for pid, text in _logs(own_cluster).items():
        assert (WATCHDOG in text) == (pid in stuck), f"TaskManager {pid} (stuck: {pid in stuck}):\n{text[-2000:]}"
    _slots_back(own_cluster)
    assert len(before - _taskmanager_ids(own_cluster)) == len(stuck)
    _runs_next_job(own_cluster, client)
    client.close()
