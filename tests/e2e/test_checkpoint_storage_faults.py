"""Checkpoint storage that fills up or turns read-only: checkpoints fail with the reason (in REST
and in the notebook dashboard's checkpoints panel), the job goes on, a restart meanwhile restores
the last complete checkpoint (never a half-written one), and checkpoints complete again once the
storage is back; the committed output is exactly once. A job on each state backend runs side by
side, through the fault 3 times.

The checkpoint folder is a tmpfs of 4 MB of the test's own (the test runs as root, as CI does),
filled by a file of zeros until the kernel says ENOSPC, then emptied; or remounted read-only,
then read-write.
"""
from __future__ import annotations

import errno
import random
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.api import FileSink
from kernel_runtime.notebook.widgets.base import Update
from kernel_runtime.notebook.widgets.checkpoints import CheckpointsView
from kernel_runtime.notebook.widgets.feed import Snapshot
from tests.conftest import rest, start_cluster, wait_for
from tests.faults import Stopwatch, check_exactly_once, in_rounds, seed
from tests.e2e.test_exactly_once import FAULTS, committed, events, kill_a_busy_taskmanager, running_total

pytestmark = pytest.mark.slow

N, RATE, BATCH = 40_000, 1_500, 200
BACKENDS = ("hashmap", "rocksdb")  # a job of each, side by side, through 3 faults (tests/faults.py's in_rounds)


@pytest.fixture(scope="module")
def disk_cluster(tmp_path_factory):
    local = start_cluster(tmp_path_factory.mktemp("full-disk"), **FAULTS)
    yield local
    local.stop()


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "checkpoints"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> Path:
    """Write zeros into ``mount`` until it is full; the filler's path."""
    filler = mount / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


class Full:
    reason = "No space left on device"

    def __init__(self, mount: Path):
        self.mount = mount

    def begin(self) -> None:
        self.filler = fill(self.mount)

    def end(self) -> None:
        self.filler.unlink()


class ReadOnly(Full):
    reason = "Read-only file system"

    def begin(self) -> None:
        # the kernel refuses (EBUSY) while a file there is open for writing: a checkpoint being
        # written; the fault begins once none is
        wait_for(lambda: subprocess.run(["mount", "-o", "remount,ro", str(self.mount)],
                                        capture_output=True).returncode == 0, 30, "the storage remounted read-only")

    def end(self) -> None:
        subprocess.run(["mount", "-o", "remount,rw", str(self.mount)], check=True)


def history(local, job_id: str) -> list[dict]:
    return rest(local, f"/jobs/{job_id}/checkpoints")[1]["history"]


def dashboard_shows_the_reason(client, job_id: str, reason: str) -> None:
    """The notebook dashboard's checkpoints panel, fed what it is fed live, lists a failed
    checkpoint with the storage's reason."""
    view = CheckpointsView()
    view.update(Update(Snapshot(time.monotonic(), client.job_details(job_id), {}, []), [], 0.0))
    assert 'data-status="FAILED"' in view.root.value and reason in view.root.value, view.root.value


def sink_rows(client, job_id: str) -> int:
    details = client.job_details(job_id)
    last = details["vertices"][-1]["id"]
    return sum(s["metrics"].get("records-in", 0) or 0 for s in details["subtasks"] if s["vertex_id"] == last)


def submit(local, backend: str, storage: Path, out: str, client: JobClient):
    env = StreamEnvironment(parallelism=2, cluster=local.cluster_dir, config={
        "execution.checkpointing.interval": "300 ms", "execution.checkpointing.dir": str(storage),
        "state.backend.type": backend, "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": 100, "restart-strategy.fixed-delay.delay": "200 ms"})
    (env.from_generator(events, count=N, rate=RATE, batch_size=BATCH, split_size=16 * BATCH)
        .key_by("k").process(running_total, name="running total")
        .sink_to(FileSink.parquet(out, rows_per_file=2_000)))
    return env.execute_async(f"storage faults ({backend})", client=client)


@pytest.mark.parametrize("fault", [Full, ReadOnly], ids=["full", "read-only"])
def test_checkpoint_storage_that_fails_fails_checkpoints_and_loses_nothing(disk_cluster, small_disk, fault, tmp_path):
    seed(fault.__name__)
    storage = fault(small_disk)
    outs = {backend: str(tmp_path / f"out-{backend}") for backend in BACKENDS}
    client = JobClient(disk_cluster.info)
    try:
        handles = [submit(disk_cluster, backend, small_disk, out, client) for backend, out in outs.items()]

        def fail_storage(watch: Stopwatch) -> None:
            storage.begin()

            def failed_for_it(handle):
                return next((c for c in history(disk_cluster, handle.job_id) if c["status"] == "FAILED"
                             and storage.reason in c["failure_message"] and c["id"] > newest[handle.job_id]), None)
            newest = {h.job_id: max(c["id"] for c in history(disk_cluster, h.job_id)) for h in handles}
            failed = {h.job_id: wait_for(lambda: failed_for_it(h), 60, f"a checkpoint failed: {storage.reason}")
                      for h in handles}
            assert all(h.job_status().state == "RUNNING" for h in handles)  # a failed checkpoint fails no job
            dashboard_shows_the_reason(client, handles[0].job_id, storage.reason)
            before = [sink_rows(client, h.job_id) for h in handles]
            wait_for(lambda: all(sink_rows(client, h.job_id) > n for h, n in zip(handles, before)), 60,
                     "rows going on while the storage fails")

            # a restart now: the newest complete checkpoint is restored, not the failed ones after it
            attempts = [h.job_status().attempt for h in handles]
            kill_a_busy_taskmanager(disk_cluster, random.choice(handles).job_id, client)
            wait_for(lambda: any(h.job_status().attempt > a for h, a in zip(handles, attempts)) and all(
                h.job_status().state == "RUNNING" and all(t["status"] == "RUNNING" for t in client.job_details(
                    h.job_id)["subtasks"]) for h in handles), 90, "the jobs running again while the storage fails")
            watch.recovered()
            for handle, attempt in zip(handles, attempts):
                if handle.job_status().attempt > attempt:
                    restored = rest(disk_cluster, f"/jobs/{handle.job_id}/checkpoints")[1]["latest"]["restored"]
                    failed_ids = {c["id"] for c in history(disk_cluster, handle.job_id) if c["status"] == "FAILED"}
                    assert restored is not None and restored["id"] not in failed_ids, (restored, failed_ids)

            storage.end()
            wait_for(lambda: all(any(c["status"] == "COMPLETED" and c["id"] > failed[h.job_id]["id"]
                                     for c in history(disk_cluster, h.job_id)) for h in handles), 60,
                     "checkpoints completing again")

        watches = in_rounds(disk_cluster, client, handles, fail_storage)
        for handle in handles:
            assert handle.wait(180).state == "FINISHED"
    finally:
        client.close()
    df = events(np.arange(N, dtype=np.int64))
    want = pd.DataFrame({"k": df.k, "seq": df.seq, "total": df.groupby("k")["v"].cumsum()})
    for backend, out in outs.items():
        check_exactly_once(f"checkpoint storage {fault.__name__} ({backend})", committed(out), want, watches)
