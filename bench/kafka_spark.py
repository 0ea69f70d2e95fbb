"""The Spark Structured Streaming side of bench/kafka.py, in its process (local[2], as bench/peers.py).

Kafka source (spark-sql-kafka-0-10) -> from_json -> WHERE amount > 2, amount * price -> to_json ->
Kafka sink, in micro-batch mode (the default trigger: the next batch as soon as the last ends)
or in Real-Time Mode (``.trigger(realTime=...)``: long-running batches whose tasks process records
as they arrive).

The connector comes from Maven Central (bench/kafka/pom.xml, profile spark) at pyspark's own
version when Central has it, else at the newest one there, and only the jars that pyspark does
not already bring go on ``spark.jars`` (its own spark-tags, hadoop-client, scala-library... stay).
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

import kafka_io

# Central holds spark-sql-kafka-0-10_2.13 up to 4.2.0 on this machine's mirror (no 4.3.0 yet)
FALLBACK_VERSIONS = ("4.2.0",)
QUERY = "SELECT seq, `user`, amount * price AS total FROM input WHERE amount > 2"


def connector_jars() -> tuple[str, list[str], Optional[str]]:
    """(connector version, its jars that pyspark lacks, why pyspark's own version could not be used)."""
    import pyspark
    own = pyspark.__version__
    present = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    why = None
    for version in (own, *FALLBACK_VERSIONS):
        try:
            home = kafka_io.jars("spark", version)
        except RuntimeError as exc:
            why = why or str(exc)
            continue
        return version, sorted(str(p) for p in home.glob("*.jar") if _artifact(p.name) not in present), \
            None if version == own else why
    raise RuntimeError(f"no spark-sql-kafka-0-10 connector could be fetched: {why}")


def _artifact(jar: str) -> str:
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar)


class SparkPeer:
    """One SparkSession for the bench's Spark runs; start() runs one query, stop() ends it."""

    def __init__(self, mode: str, real_time: str = "5 minutes"):
        self.mode, self.real_time = mode, real_time
        self.version, jars, self.fallback_reason = connector_jars()
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession
        self.spark = (SparkSession.builder.master("local[2]").appName("bench-kafka")
                      .config("spark.jars", ",".join(jars)).config("spark.sql.shuffle.partitions", 2)
                      .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                      .getOrCreate())
        self.spark.sparkContext.setLogLevel("ERROR")
        self.checkpoints = Path(tempfile.mkdtemp(prefix="bench-kafka-spark-"))
        self.query = None
        self.runs = 0

    def describe(self) -> str:
        trigger = f"trigger(realTime={self.real_time!r})" if self.mode == "rtm" else "default trigger (micro-batch)"
        return (f"Spark Structured Streaming {self.spark.version}, local[2], spark-sql-kafka-0-10_2.13 "
                f"{self.version}, {trigger}, Kafka sink (kafka-clients' defaults)")

    def start(self, servers: str, topic: str, out: str) -> None:
        self.runs += 1
        rows = (self.spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers)
                .option("subscribe", topic).option("startingOffsets", "earliest").load()
                .selectExpr(f"from_json(CAST(value AS STRING), '{kafka_io.SCHEMA}') AS r").select("r.*"))
        rows.createOrReplaceTempView("input")
        writer = (self.spark.sql(QUERY).selectExpr("to_json(struct(seq, `user`, total)) AS value").writeStream
                  .format("kafka").option("kafka.bootstrap.servers", servers).option("topic", out)
                  .option("checkpointLocation", str(self.checkpoints / str(self.runs)))
                  .outputMode("update" if self.mode == "rtm" else "append"))
        if self.mode == "rtm":
            writer = writer.trigger(realTime=self.real_time)
        self.query = writer.queryName(f"bench-kafka-{self.mode}-{self.runs}").start()

    def failed(self) -> Optional[str]:
        error = self.query.exception() if self.query is not None else None
        return f"Spark query failed: {error}" if error is not None else None

    def stop(self) -> None:
        """Stop the query; a cancelled batch logs pages of ERROR stack traces that are not errors."""
        self.spark.sparkContext.setLogLevel("OFF")
        try:
            self.query.stop()
        finally:
            self.spark.sparkContext.setLogLevel("ERROR")

    def close(self) -> None:
        self.spark.stop()
        shutil.rmtree(self.checkpoints, ignore_errors=True)
