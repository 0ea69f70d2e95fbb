"""Shared fixtures: one real cluster per test session, checked after every test that used it.

``cluster`` is 2 TaskManagers x 2 slots on free ports of 127.0.0.1 with fast heartbeats (but a
patient timeout). After each test it must be back to its resting state (every slot free, no job
running), as dask's ``gen_cluster`` validates its state: a test that leaks slots fails, not the
next one. When a test fails, the tail of every process log is printed.
"""
from __future__ import annotations

import json
import os
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from kernel_runtime import JobClient, LocalCluster

pytest_plugins = ["tests.hangs"]  # a test past its timeout fails alone, with its stacks
pytest_plugins += ["tests.cluster_fixture"]  # own_cluster and @pytest.mark.cluster(...): a checked cluster per test

# Every Spark driver the suite starts (TaskManagers', kernels', the test process's own) compiles with
# C1 only, as the tests' Kafka broker does: the suite's JVMs live for seconds to minutes on small
# batches, where C2's compile threads cost more CPU than they give back. Measured on this 2-core
# machine: a session's start and 20 small queries took 45-53 s of JVM CPU, 25-26 s with C1 only;
# Spark's JVMs were over half the suite's CPU. Spark's launcher adds SPARK_SUBMIT_OPTS to the driver's
# JVM; every process the tests start inherits it. Users' clusters keep the JDK's default.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

FAST = {"heartbeat.interval": "200 ms", "heartbeat.timeout": "2 s"}


def start_cluster(directory: Path, taskmanagers: int = 2, slots: int = 2, **config) -> LocalCluster:
    return LocalCluster(directory, taskmanagers=taskmanagers, slots=slots, config=FAST | config,
                        embedded=True).start()


# The shared cluster's tests lose no process, so its heartbeat.timeout need not be fast: at 2 s a
# TaskManager of a loaded fresh-clone run (two test workers, their clusters and Spark JVMs on two
# cores) was once judged lost in a Nexmark test. The tests that kill or freeze a process have
# clusters of their own (own_cluster), with FAST's timeout.
SHARED = {"heartbeat.timeout": "10 s"}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    local = start_cluster(tmp_path_factory.mktemp("cluster"), **SHARED)
    yield local
    local.stop()


def suite_spark_session():
    """The test process's one SparkSession, as a TaskManager's session: the in-process Spark chains
    use it (SparkRunner finds it started), and so does the client's SQL planner, which would
    otherwise start one of its own without the TaskManagers' helpers."""
    import sys
    from pyspark.sql import SparkSession
    from cluster.conf import TaskConfig
    from cluster.spark.runner import session_conf
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder
    conf = session_conf(TaskConfig.from_dict({"taskmanager.spark.master": "local[1]"}))
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.appName("streamlab-tests").getOrCreate()


def pytest_configure(config):
    from kernel_runtime.api.sql import analysis
    analysis.session_factory = suite_spark_session


@pytest.fixture(scope="session")
def spark():
    """A SparkSession in the test process, for baselines: the same query as a plain batch job."""
    session = suite_spark_session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """A real ZooKeeper (Debian's ``zookeeper`` package, ``make system-deps``) for the HA tests,
    started by the session and stopped after it."""
    from kernel_runtime.deploy.ha import ZK_SERVER, LocalZooKeeper
    if not ZK_SERVER.exists():
        pytest.fail(f"{ZK_SERVER} is missing: install Debian's zookeeper package (make system-deps)")
    server = LocalZooKeeper(tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.stop()


@pytest.fixture
def client(cluster):
    c = JobClient(cluster.info)
    yield c
    c.close()


def rest(cluster: LocalCluster, path: str, method: str = "GET", body: dict | None = None):
    """A REST call as the CLI and notebook make it: with the cluster's token, JSON in and out."""
    headers = dict(cluster.info.rest_headers)
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    req = urllib.request.Request(cluster.info.rest_address + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
        return resp.status, json.loads(body) if body else None


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def assert_at_rest(local: LocalCluster, timeout: float = 10.0) -> None:
    def rested():
        _, o = rest(local, "/overview")
        return o["slots-available"] == o["slots-total"] and o["jobs-running"] == 0 and o
    wait_for(rested, timeout, "every slot free and no job running")


@pytest.fixture(autouse=True)
def _validate_cluster(request):
    yield
    # a test that shares a long-running job with its module (running_job) is checked after it ends
    if "cluster" in request.fixturenames and "running_job" not in request.fixturenames \
            and not _failed(request):
        assert_at_rest(request.getfixturevalue("cluster"))


def _failed(request) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is not None and rep.failed


def pytest_collection_modifyitems(config, items):
    """The longest modules first: under ``--dist loadfile`` a worker takes the next module as it
    finishes one, so a long module taken last keeps the run going alone on one worker (the Kafka
    fault test, some 9 minutes, used to start 25 minutes in). A module's length is guessed from its
    ``slow`` marks and the sum of its tests' timeouts; the others keep their order (the Makefile turns
    off xdist's own reordering by test count)."""
    def timeout(item) -> float:
        mark = item.get_closest_marker("timeout")
        return float(mark.args[0]) if mark and mark.args else float(config.getini("timeout") or 0)

    modules: dict[str, tuple[bool, float]] = {}
    def module(item) -> str:
        return item.nodeid.split("::")[0]

    for item in items:
        slow, allowed = modules.get(module(item), (False, 0.0))
        modules[module(item)] = (slow or item.get_closest_marker("slow") is not None, allowed + timeout(item))
    rank = {m: n for n, m in enumerate(sorted(modules, key=lambda m: (not modules[m][0], -modules[m][1])))}
    items.sort(key=lambda item: rank[module(item)])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    if rep.failed and rep.when == "call":
        for name in ("cluster", "own_cluster"):
            local = item.funcargs.get(name)
            if isinstance(local, LocalCluster):
                folder = local.cluster_dir / "log"
                for log in sorted([*folder.glob("*.log"), *folder.glob("*.out")]):
                    tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                    rep.sections.append((f"{log.name} (last lines)", tail))
    return rep


@contextmanager
def running_keyed_count(cluster, name: str, rate: int, batch_size: int, rows: int = 1):
    """An unbounded keyed count (every seq its own key) collected to a handle, RUNNING with at
    least ``rows`` rows in; cancelled after, leaving the cluster at rest."""
    from kernel_runtime import StreamEnvironment
    client = JobClient(cluster.info)
    env = StreamEnvironment(parallelism=2, cluster=cluster.cluster_dir)
    env.from_generator(rate=rate, batch_size=batch_size).key_by("seq").count().collect()
    handle = env.execute_async(name, client=client)
    wait_for(lambda: handle.status == "RUNNING" and handle.row_count() >= rows, 30, "job running")
    yield handle
    handle.cancel()
    wait_for(lambda: handle.status == "CANCELED", 30, "job cancelled")
    client.close()
    assert_at_rest(cluster)
