"""%load_ext starts the embedded cluster in the background: it returns before the cluster is up,
and the cluster comes up (its TaskManagers registered, their Spark starting) without any cell."""
from pathlib import Path

import pytest

from kernel_runtime import JobClient
from kernel_runtime.client.cluster_info import ClusterInfo

from ..conftest import wait_for
from .test_two_kernels import Kernel

SESSION = "next(c for c in get_ipython().configurables if type(c).__name__ == 'StreamMagics')._session"


@pytest.fixture
def kernel():
    started = Kernel(spark_startup="eager")  # the default of a notebook
    yield started
    started.close()


def test_load_ext_starts_the_embedded_cluster_in_the_background(kernel):
    kernel.client.wait_for_ready(timeout=60)
    kernel.execute("%load_ext kernel_runtime")
    # the extension is loaded and the start under way, but %load_ext did not wait for it
    assert kernel.evaluate(f"({SESSION}.embedded is None, {SESSION}._starting is not None)") == (True, True)

    directory = wait_for(lambda: kernel.evaluate(f"{SESSION}.embedded and str({SESSION}.embedded.cluster_dir)"),
                         60, "the embedded cluster up")
    kernel.cluster_dir = Path(directory)
    client = JobClient(ClusterInfo.load(kernel.cluster_dir))
    try:
        assert len(client.cluster_overview().taskmanagers) == 2
        assert client.list_jobs() == []
    finally:
        client.close()
    # each TaskManager starts its SparkSession at once (eager, the default), one JVM after the other
    logs = [kernel.cluster_dir / "log" / f"taskmanager-{i}.log" for i in range(2)]
    wait_for(lambda: any("starting the SparkSession" in p.read_text() for p in logs), 30, "a TaskManager starting Spark")

    # the first %stream_cluster start is the cluster started at load, not a second one: the same
    # directory, the same processes, the same TaskManagers
    processes = (kernel.cluster_dir / "cluster.json").read_text()
    client = JobClient(ClusterInfo.load(kernel.cluster_dir))
    try:
        taskmanagers = {t["id"] for t in client.cluster_overview().taskmanagers}
        kernel.execute("%stream_cluster start --taskmanagers 2 --slots 2")
        assert kernel.evaluate(f"str({SESSION}.embedded.cluster_dir)") == directory
        assert (kernel.cluster_dir / "cluster.json").read_text() == processes
        assert {t["id"] for t in client.cluster_overview().taskmanagers} == taskmanagers
    finally:
        client.close()


def test_a_start_of_another_size_ends_the_start_begun_at_load_and_starts_that_size(kernel):
    kernel.client.wait_for_ready(timeout=60)
    kernel.execute("%load_ext kernel_runtime")
    begun = wait_for(lambda: kernel.evaluate(f"{SESSION}._pending and str({SESSION}._pending.cluster_dir)"), 60,
                     "the start at load under way")
    kernel.execute("%stream_cluster start --taskmanagers 1 --slots 2")
    directory = kernel.evaluate(f"str({SESSION}.embedded.cluster_dir)")
    kernel.cluster_dir = Path(directory)
    assert directory != begun and not Path(begun).exists()  # the first start ended and cleaned up
    client = JobClient(ClusterInfo.load(kernel.cluster_dir))
    try:
        assert len(client.cluster_overview().taskmanagers) == 1
    finally:
        client.close()
