"""Two notebooks at once: two real kernels, each running a %%stream cell on its own embedded
cluster (free ports, never 6123/8081), both getting results; each cluster stops with its kernel."""
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from jupyter_client.manager import KernelManager

from kernel_runtime.deploy.local import PROJECT_ROOT, stop_cluster
from kernel_runtime.deploy.processes import alive

from ..conftest import wait_for

CELL = """%%stream -o job
import pandas as pd
env.from_generator(lambda seq: pd.DataFrame({"user": seq % 3}), rate=1000, batch_size=20).key_by("user").count().collect()
"""
SPY = """import threading
threads = set()
def spy(snapshot, deliver=job.dashboard().feed.deliver):
    threads.add(threading.current_thread().name)
    deliver(snapshot)
job.dashboard().feed.deliver = spy
"""


class Kernel:
    def __init__(self, spark_startup: str = "lazy"):
        # over Unix sockets: a TCP kernel's ports are picked free, then bound by the kernel, and
        # another process of the run bound one of them in between (CI run 19: Address already in use)
        self.sockets = Path(tempfile.mkdtemp(prefix="sl-kernel-"))
        self.manager = KernelManager(kernel_name="python3", transport="ipc",
                                     connection_file=str(self.sockets / "kernel.json"))
        # lazy: these cells need no Spark, so no JVM per TaskManager loads the machine (a notebook's
        # embedded cluster starts Spark eagerly, at %load_ext)
        self.manager.start_kernel(cwd=str(PROJECT_ROOT), env=dict(os.environ), extra_arguments=[
            f"--StreamMagics.cluster_config=taskmanager.spark.startup={spark_startup}"])
        self.client = self.manager.client()
        self.client.start_channels()
        self.cluster_dir = None

    def execute(self, code: str, timeout: float = 60) -> dict:
        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=lambda msg: None,
                                                user_expressions={})
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply

    def evaluate(self, expression: str):
        reply = self.client.execute_interactive("", user_expressions={"x": expression}, timeout=30,
                                                output_hook=lambda msg: None)
        result = reply["content"]["user_expressions"]["x"]
        assert result["status"] == "ok", result
        return eval(result["data"]["text/plain"])

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)

    def close(self) -> None:
        """After a test: shut the kernel down, and stop its cluster if the kernel died without."""
        if self.manager.is_alive():
            self.shutdown()
        if self.cluster_dir is not None:
            stop_cluster(Path(self.cluster_dir))
        shutil.rmtree(self.sockets, ignore_errors=True)


@pytest.fixture
def kernels():
    started = [Kernel(), Kernel()]
    yield started
    for kernel in started:
        kernel.close()


def test_two_kernels_each_run_a_job_on_their_own_embedded_cluster(kernels):
    for kernel in kernels:
        kernel.client.wait_for_ready(timeout=60)
        kernel.execute("%load_ext kernel_runtime")
    for kernel in kernels:
        kernel.execute(CELL)
    clusters = []
    for kernel in kernels:
        wait_for(lambda: kernel.evaluate("job.row_count()") > 0, 60, "result rows in the kernel")
        assert kernel.evaluate("sorted(job.results.user)") == [0, 1, 2]
        clusters.append(kernel.evaluate("(job.client.cluster.rpc_address, job.client.cluster.rest_address, "
                                        "str(job.client.cluster.cluster_dir))"))
        kernel.cluster_dir = Path(clusters[-1][2])
    (rpc_a, rest_a, dir_a), (rpc_b, rest_b, dir_b) = clusters
    assert rpc_a != rpc_b and rest_a != rest_b and dir_a != dir_b
    for address in (rpc_a, rpc_b, rest_a, rest_b):
        assert not address.endswith((":6123", ":8081"))

    # the dashboard is fed on the kernel's main thread, while no cell runs
    kernel = kernels[0]
    kernel.execute(SPY)
    updates = kernel.evaluate("job.dashboard().updates")
    # (a dashboard applies at most one update per feed.PACE_S second)
    wait_for(lambda: kernel.evaluate("job.dashboard().updates") >= updates + 2, 10, "two more dashboard updates")
    assert kernel.evaluate("threads") == {"MainThread"}

    pids = [json.loads((Path(d) / "cluster.json").read_text()) for d in (dir_a, dir_b)]
    kernels[0].shutdown()  # a clean shutdown stops the cluster on the way out
    kernels[1].client.stop_channels()
    kernels[1].manager.shutdown_kernel(now=True)  # SIGKILL: no atexit, the watchdog stops it
    for cluster_pids, directory in zip(pids, (dir_a, dir_b)):
        every = [cluster_pids["jobmanager"], *cluster_pids["taskmanagers"]]
        try:
            wait_for(lambda: not any(alive(p) for p in every) and not Path(directory).exists(), 15,
                     f"the cluster of {directory} gone with its kernel")
        except AssertionError as timed_out:
            left = sorted(str(p.relative_to(directory)) for p in Path(directory).rglob("*"))
            raise AssertionError(f"{timed_out}; alive: {[p for p in every if alive(p)]}; "
                                 f"left in the directory: {left}") from None
