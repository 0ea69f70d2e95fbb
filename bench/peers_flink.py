"""The PyFlink side of bench/peers.py; run by it with the PyFlink venv's python, never the project's.

    <pyflink-venv>/bin/python bench/peers_flink.py --rows N

Runs each workload of bench/peers.py as Flink SQL (Table API, streaming mode, parallelism 2) and
prints one JSON line on stdout: the setup and, per workload, rows/s over the job's RUNNING time.

The jobs run in a MiniCluster this script starts itself (1 TaskManager x 2 slots) and reaches
through its REST endpoint: PyFlink's default local executor starts a MiniCluster per job and
closes it as the job ends, taking the job's RUNNING/FINISHED timestamps with it; a cluster that
outlives the job lets us read them from GET /jobs/<id>, as bench/peers.py does for streamlab.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import urllib.request

from pyflink.java_gateway import get_gateway
from pyflink.table import EnvironmentSettings, TableEnvironment
from pyflink.version import __version__ as pyflink_version

PARALLELISM = 2

# id 0..N-1 from datagen's sequence; k and v computed as streamlab's generator computes them.
# rows-per-second: datagen's default is 10,000 rows/s; set far above what 2 cores can do.
SOURCE = """CREATE TEMPORARY TABLE IF NOT EXISTS src_{n} (id BIGINT, k AS id % 10000, v AS id % 1000)
WITH ('connector' = 'datagen', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0',
      'fields.id.end' = '{last}', 'rows-per-second' = '1000000000000')"""
WORKLOADS = {
    "stateless": ("(id BIGINT, k BIGINT, v2 BIGINT)",
                  "SELECT id, k, v * 2 AS v2 FROM src_{n} WHERE v < 500"),
    "keyed": ("(k BIGINT, n BIGINT, s BIGINT)",
              "SELECT k, COUNT(*) AS n, SUM(v) AS s FROM src_{n} GROUP BY k"),
}


def start_minicluster():
    jvm = get_gateway().jvm
    conf = jvm.org.apache.flink.configuration.Configuration()
    conf.setString("rest.address", "127.0.0.1")
    conf.setString("rest.bind-address", "127.0.0.1")
    conf.setString("rest.port", "0")  # another engineer's Flink may hold 8081
    mc_conf = (jvm.org.apache.flink.runtime.minicluster.MiniClusterConfiguration.Builder()
               .setConfiguration(conf).setNumTaskManagers(1).setNumSlotsPerTaskManager(PARALLELISM).build())
    cluster = jvm.org.apache.flink.runtime.minicluster.MiniCluster(mc_conf)
    cluster.start()
    return cluster, cluster.getRestAddress().get()


def table_env(rest) -> TableEnvironment:
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("parallelism.default", str(PARALLELISM))
    config.set("execution.target", "remote")
    config.set("rest.address", rest.getHost())
    config.set("rest.port", str(rest.getPort()))
    return env


def run(env: TableEnvironment, rest, workload: str, n: int) -> dict:
    columns, query = WORKLOADS[workload]
    env.execute_sql(SOURCE.format(n=n, last=n - 1))
    env.execute_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS sink_{workload}_{n} {columns} WITH ('connector' = 'blackhole')")
    return timed_insert(env, rest, workload, f"INSERT INTO sink_{workload}_{n} {query.format(n=n)}", n)


def timed_insert(env: TableEnvironment, rest, name: str, insert: str, n: int) -> dict:
    """Run an INSERT statement over n input rows to its end: rows/s over the job's RUNNING time."""
    started = time.perf_counter()
    job = env.execute_sql(insert).get_job_client()
    result = job.get_job_execution_result().result()
    wall = time.perf_counter() - started
    with urllib.request.urlopen(f"{rest.toString()}/jobs/{job.get_job_id()}") as reply:
        details = json.load(reply)
    if details["state"] != "FINISHED":
        raise RuntimeError(f"Flink job {name} ended {details['state']}")
    ts = details["timestamps"]
    running_s = (ts["FINISHED"] - ts["RUNNING"]) / 1000
    return {"rows": n, "rows_per_s": n / running_s, "running_s": running_s,
            "net_runtime_s": result.get_net_runtime() / 1000, "submit_to_result_s": wall}


def flink_setup(warmup_rows: int) -> dict:
    """The versions and the cluster's shape, for the report's setup line."""
    jvm = get_gateway().jvm
    return {"pyflink": pyflink_version,
            "flink": jvm.org.apache.flink.runtime.util.EnvironmentInformation.getVersion(),
            "java": jvm.System.getProperty("java.version"), "python": platform.python_version(),
            "parallelism": PARALLELISM, "cluster": f"MiniCluster 1 TaskManager x {PARALLELISM} slots",
            "warmup_rows": warmup_rows}


def report_runs(run, names, rows: int, warmup_rows: int, repeat: int = 1) -> None:
    """On a fresh MiniCluster: a warm-up job of every workload (class loading, code generation and
    the JIT, as every peer of bench/peers.py gets), then ``run(env, rest, name, rows)`` for every
    name, ``repeat`` times (the run of median rows/s reported, with every run's rows/s); the JSON
    report printed last, as bench/peers.py's flink_report reads it."""
    cluster, rest = start_minicluster()
    try:
        env = table_env(rest)
        warmup = {name: run(env, rest, name, warmup_rows) for name in names}
        results = {name: median_run([run(env, rest, name, rows) for _ in range(repeat)]) for name in names}
        setup = flink_setup(warmup_rows)
    finally:
        cluster.close()
    sys.stdout.write(json.dumps({"setup": setup, "warmup": warmup, "results": results}) + "\n")


def median_run(runs: list[dict]) -> dict:
    """The run of median rows/s (the upper one of an even count), with every run's rows/s."""
    ordered = sorted(runs, key=lambda r: r["rows_per_s"])
    return ordered[len(ordered) // 2] | {"runs": [r["rows_per_s"] for r in runs]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--warmup-rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    report_runs(run, list(WORKLOADS), args.rows, args.warmup_rows, args.repeat)


if __name__ == "__main__":
    main()
