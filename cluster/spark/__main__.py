"""``python -m cluster.spark archive``: make this machine's class data sharing archive of the
TaskManager's Spark JVM (class_data.py), if it has none yet. ``make setup`` runs it."""
from __future__ import annotations

import argparse
import os
import sys

import pyarrow as pa

from cluster.conf import TaskConfig
from cluster.spark.class_data import archive_path, dumping_into
from cluster.spark.runner import SparkRunner, session_conf

JVM_EXIT_TIMEOUT_S = 300  # the JVM writes the archive as it exits: some 150 MB


def make_archive() -> int:
    config = TaskConfig.from_dict({"taskmanager.spark.master": "local[1]"})
    conf = session_conf(config)
    target = archive_path(conf)
    if target is None:
        print("no java found: no class data archive for Spark", file=sys.stderr)
        return 1
    if target.is_file():
        print(f"Spark's class data archive: {target}")
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.stem}-{os.getpid()}.jsa")
    # the TaskManager's own start (the fast paths' probes) loads the classes it archives, and a
    # first aggregation the classes of a Spark job's plan (which the probes' plans need not)
    runner = SparkRunner(config, conf=dumping_into(conf, staging)).start()
    runner.ready.wait()
    if runner.error:
        print(runner.error, file=sys.stderr)
        return 1
    assert runner.session is not None, "a ready runner without an error has its session"
    runner.session.createDataFrame(pa.table({"k": [1, 2, 1], "v": [1, 2, 3]})).groupBy("k").sum("v").toArrow()
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    assert gateway is not None, "a started session has a gateway"
    jvm = gateway.proc
    runner.stop()
    gateway.shutdown()
    jvm.stdin.close()  # the JVM's gateway server exits at its stdin's end
    jvm.wait(JVM_EXIT_TIMEOUT_S)
    try:
        if not staging.is_file():
            print(f"the JVM wrote no class data archive (exit code {jvm.returncode})", file=sys.stderr)
            return 1
        try:
            os.link(staging, target)
        except FileExistsError:  # another run made it first
            pass
    finally:
        staging.unlink(missing_ok=True)
    print(f"Spark's class data archive: {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.spark")
    parser.add_argument("command", choices=["archive"], help="make the class data archive of the TaskManager's JVM")
    parser.parse_args(argv)
    return make_archive()


if __name__ == "__main__":
    sys.exit(main())
