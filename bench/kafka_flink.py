"""The PyFlink side of bench/kafka.py; run by it with the PyFlink venv's python, never the project's.

    <pyflink-venv>/bin/python bench/kafka_flink.py --jar flink-sql-connector-kafka-*.jar

A MiniCluster (1 TaskManager x 1 slot, parallelism 1) that outlives the jobs, as bench/peers_flink.py
starts it. Commands arrive as JSON lines on stdin, answers leave as lines "BENCH <json>" on stdout
(anything else on stdout is PyFlink's, ignored by kafka.py):

    {"cmd": "start", "servers": S, "in": T, "out": U}  -> {"started": job_id}  (submitted)
    {"cmd": "state"}                                    -> {"state": "RUNNING" | "FAILED: ..." ...}
    {"cmd": "stop"}                                     -> {"stopped": job_id}  (cancelled)
    {"cmd": "quit"}

The job is Flink SQL: a Kafka table (format json) -> WHERE amount > 2, amount * price -> a Kafka
table, sink.delivery-guarantee at-least-once; no checkpoints (as every peer of the bench).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import traceback
import urllib.request

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from pyflink.java_gateway import get_gateway  # noqa: E402
from pyflink.table import EnvironmentSettings, TableEnvironment  # noqa: E402
from pyflink.version import __version__ as pyflink_version  # noqa: E402

import peers_flink  # noqa: E402  (bench/peers_flink.py: its MiniCluster)

SOURCE = """CREATE TEMPORARY TABLE src_{i} (seq BIGINT, `user` STRING, amount BIGINT, price DOUBLE, ts BIGINT)
WITH ('connector' = 'kafka', 'topic' = '{topic}', 'properties.bootstrap.servers' = '{servers}',
      'properties.group.id' = 'flink-bench-{i}', 'scan.startup.mode' = 'earliest-offset', 'format' = 'json')"""
SINK = """CREATE TEMPORARY TABLE sink_{i} (seq BIGINT, `user` STRING, total DOUBLE)
WITH ('connector' = 'kafka', 'topic' = '{topic}', 'properties.bootstrap.servers' = '{servers}',
      'format' = 'json', 'sink.delivery-guarantee' = 'at-least-once')"""
QUERY = "INSERT INTO sink_{i} SELECT seq, `user`, amount * price AS total FROM src_{i} WHERE amount > 2"


def say(**answer) -> None:
    sys.stdout.write("BENCH " + json.dumps(answer) + "\n")
    sys.stdout.flush()


def table_env(rest, jar: str) -> TableEnvironment:
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("parallelism.default", "1")
    config.set("execution.target", "remote")
    config.set("rest.address", rest.getHost())
    config.set("rest.port", str(rest.getPort()))
    config.set("pipeline.jars", f"file://{jar}")
    return env


def job_state(rest, job_id: str) -> str:
    with urllib.request.urlopen(f"{rest.toString()}/jobs/{job_id}") as reply:
        state = json.load(reply)["state"]
    if state == "FAILED":
        with urllib.request.urlopen(f"{rest.toString()}/jobs/{job_id}/exceptions") as reply:
            root = json.load(reply).get("root-exception") or ""
        return f"FAILED: {root[:3000]}"
    return state


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jar", required=True)
    args = parser.parse_args()
    peers_flink.PARALLELISM = 1  # start_minicluster's slots
    cluster, rest = peers_flink.start_minicluster()
    jvm = get_gateway().jvm
    try:
        env = table_env(rest, args.jar)
        say(ready={"pyflink": pyflink_version, "flink": jvm.org.apache.flink.runtime.util.EnvironmentInformation
                   .getVersion(), "java": jvm.System.getProperty("java.version"), "python": platform.python_version(),
                   "jar": args.jar.rsplit("/", 1)[-1]})
        job, count = None, 0
        for line in sys.stdin:
            command = json.loads(line)
            try:
                if command["cmd"] == "start":
                    count += 1
                    env.execute_sql(SOURCE.format(i=count, topic=command["in"], servers=command["servers"]))
                    env.execute_sql(SINK.format(i=count, topic=command["out"], servers=command["servers"]))
                    job = env.execute_sql(QUERY.format(i=count)).get_job_client()
                    say(started=str(job.get_job_id()))
                elif command["cmd"] == "state":
                    say(state=job_state(rest, str(job.get_job_id())))
                elif command["cmd"] == "stop":
                    if job_state(rest, str(job.get_job_id())) == "RUNNING":
                        job.cancel().result()
                    say(stopped=str(job.get_job_id()))
                else:
                    break
            except Exception:  # the driver shows it and goes on with the other peers
                say(error=traceback.format_exc()[-3000:])
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
