"""Drive one operator directly, as a task would, and a real redis-server for the Redis tests."""
from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import msgpack
import pyarrow as pa
import redis

from cluster.conf import TaskConfig
from cluster.graph.job_graph import OperatorSpec
from cluster.taskmanager.operator_registry import OPERATORS
from cluster.operators.base import OperatorContext
from cluster.connectors.records import MALFORMED
from kernel_runtime.deploy.ha import free_port

if TYPE_CHECKING:
    from cluster.spark.chain import SparkChain

WHERE = "operator 'under test' (test.py:1)"


def opened_operator(tmp_path: Path, kind: str, params: dict, backend: str = "hashmap"):
    """An opened operator of ``kind`` as subtask 0 of 1, its keyed state in ``backend`` under ``tmp_path``."""
    spec = OperatorSpec(uid=kind, kind=kind, name=kind, call_site="test.py:1", params=params)
    ctx = OperatorContext(job_id="job", job_name="t", attempt=0, subtask=0, parallelism=1, max_parallelism=128,
                          config=TaskConfig.from_dict({"state.backend.type": backend, "io.tmp.dirs": str(tmp_path)}),
                          result_address=None, cancelled=threading.Event(), sender=None, execution_id=backend)
    op = OPERATORS[kind](spec, ctx)
    op.open()
    return op


def restored_operator(tmp_path: Path, op, kind: str, params: dict, backend: str):
    """``op``'s checkpoint (its snapshot written under ``tmp_path``), restored into a new opened
    operator of ``kind`` on ``backend``."""
    snapshot = op.snapshot_state(1)
    directory = tmp_path / "chk"
    directory.mkdir(parents=True)
    handle = dict(snapshot.handle, **snapshot.keyed.write(directory / "s"), keyed_file="s",
                  directory=str(directory), subtask=0, parallelism=1)
    again = opened_operator(tmp_path / "restored", kind, params, backend)
    again.restore_state([handle])
    return again


class Driven:
    """An opened operator of a connector, with what it sent to its side outputs."""

    def __init__(self, connector, subtask: int = 0, parallelism: int = 1, side: bool = False):
        self.side_tables: list[pa.Table] = []
        spec = OperatorSpec(uid="op", kind=connector.kind, name="under test", call_site="test.py:1",
                            params=connector.params)
        self.ctx = OperatorContext(
            job_id="job", job_name="test", attempt=0, subtask=subtask, parallelism=parallelism,
            max_parallelism=128, config=TaskConfig.from_dict({}), result_address=None, cancelled=threading.Event(), sender=None,
            side_outputs=frozenset({("op", MALFORMED)}) if side else frozenset(),
            emit_side=lambda uid, tag, table: self.side_tables.append(table))
        self.op = OPERATORS[connector.kind](spec, self.ctx)
        self.op.open()

    def malformed(self) -> pa.Table:
        return pa.concat_tables(self.side_tables) if self.side_tables else pa.table({})

    def poll(self, batches: int) -> list[pa.Table]:
        """The next ``batches`` non-empty tables (fewer if the source ends)."""
        out = []
        while len(out) < batches:
            table = self.op.poll()
            if table is None:
                break
            if table.num_rows:
                out.append(table)
        return out

    def drain(self, limit: int = 100_000) -> list[pa.Table]:
        """Every table up to the end of a bounded source."""
        out = []
        for _ in range(limit):
            table = self.op.poll()
            if table is None:
                return out
            if table.num_rows:
                out.append(table)
        raise AssertionError(f"the source did not end within {limit} polls")

    def position(self) -> dict:
        """The position as checkpoint storage would give it back: through msgpack (plain data only)."""
        return msgpack.unpackb(msgpack.packb(self.op.snapshot_position()), strict_map_key=False)


def rows(tables: list[pa.Table]) -> list[dict]:
    return [row for t in tables for row in t.to_pylist()]


class RedisServer:
    """A real redis-server on a free port of 127.0.0.1, persistence off."""

    def __init__(self, directory: Path):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; the Redis connector tests need a real server "
                               "(Debian/Ubuntu: apt-get install redis-server; conda: conda install redis)")
        self.log = directory / "redis.log"
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: Optional[subprocess.Popen] = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(directory), "--logfile", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}: {self.log_tail()}")
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(f"redis-server did not answer within {timeout} s: {self.log_tail()}")
                    time.sleep(0.05)
        finally:
            client.close()

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else "(no log)"

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


def chain_context(job: str, subtask: int, parallelism: int, config: Optional[dict], name: str) -> OperatorContext:
    """A subtask's context as a TaskManager gives it to a chain (no result channel, no sender)."""
    return OperatorContext(job_id=job, job_name=job, attempt=0, subtask=subtask, parallelism=parallelism,
                           max_parallelism=128, config=TaskConfig.from_dict(config or {}), result_address=None,
                           cancelled=threading.Event(), sender=None, execution_id=f"{job}-{subtask}",
                           task_name=f"{name} ({subtask + 1}/{parallelism})")


# the chains here test Spark's own paths (kept plans, local batches, fusion): their projections and
# filters would otherwise be answered by Arrow after the first batch, or at once where another test
# of the process had Arrow answer the same SQL (cluster.spark.arrow_eval; tests/spark/test_arrow_eval.py)
SPARK_PATHS = {"execution.spark.arrow-projections": False}


def spark_chains(query: str, job: str, parallelism: int = 2, params: Optional[dict] = None,
                 config: Optional[dict] = None) -> list["SparkChain"]:
    """The subtasks of a one-step .sql chain, opened on the process's TaskManager SparkSession;
    ``params``: the step's own besides its SQL (the client's input_schema, consumer_columns);
    ``config``: the job's configuration, Spark's paths only unless it says otherwise."""
    from cluster.spark.chain import SparkChain
    out = []
    for subtask in range(parallelism):
        ctx = chain_context(job, subtask, parallelism, SPARK_PATHS | (config or {}), "sql")
        spec = OperatorSpec(uid="sql-1", kind="spark", name="sql", call_site="test.py:1",
                            params={"sql": query, **(params or {})}, udf=None)
        chain = SparkChain([spec], ctx)
        chain.open()
        out.append(chain)
    return out
