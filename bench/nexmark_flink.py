"""The PyFlink side of bench/nexmark.py; run by it with the PyFlink venv's python, never the project's.

    <pyflink-venv>/bin/python bench/nexmark_flink.py --data DIR --out DIR --jars J1,J2,.. --queries q0,q1 --events N

Reads the Nexmark events bench/nexmark.py wrote as Parquet (DIR/bid, DIR/auction, DIR/person) with
Flink's filesystem connector and nexmark-flink's watermark, and runs each query's own SQL text
(nexmark/nexmark, nexmark-flink/src/main/resources/queries/) in streaming mode, parallelism 2:
a warm-up run and the timed run into a blackhole sink (as Nexmark measures), then a run writing
the answer to Parquet in OUT/<query> for bench/nexmark.py to compare with streamlab's. Prints one
JSON line: the setup and, per query, events/s over the timed job's RUNNING time.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from peers_flink import flink_setup, start_minicluster, table_env, timed_insert

TABLES = {
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra STRING",
    "auction": "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
               "dateTime TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra STRING",
    "person": "id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING, "
              "dateTime TIMESTAMP(3), extra STRING",
}
# nexmark-flink's queries: their sink's columns and their SELECT
# a query whose result updates (q4's averages): only a blackhole sink takes it, so no answer is written
UPDATING = {"q4"}
QUERIES = {
    "q0": ("auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra STRING",
           "SELECT auction, bidder, price, dateTime, extra FROM bid"),
    "q1": ("auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), dateTime TIMESTAMP(3), extra STRING",
           "SELECT auction, bidder, 0.908 * price as price, dateTime, extra FROM bid"),
    "q2": ("auction BIGINT, price BIGINT", "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"),
    "q3": ("name STRING, city STRING, state STRING, id BIGINT",
           "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P on A.seller = P.id "
           "WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"),
    "q4": ("id BIGINT, final BIGINT",
           "SELECT Q.category, AVG(Q.final) FROM (SELECT MAX(B.price) AS final, A.category FROM auction A, bid B "
           "WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires GROUP BY A.id, A.category) Q "
           "GROUP BY Q.category"),
    "q5": ("auction BIGINT, num BIGINT",
           "SELECT AuctionBids.auction, AuctionBids.num FROM (SELECT auction, count(*) AS num, window_start AS starttime, "
           "window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, "
           "INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS AuctionBids JOIN ("
           "SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM (SELECT count(*) AS num, "
           "window_start AS starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), "
           "INTERVAL '2' SECOND, INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS CountBids "
           "GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids ON AuctionBids.starttime = MaxBids.starttime "
           "AND AuctionBids.endtime = MaxBids.endtime AND AuctionBids.num >= MaxBids.maxn"),
    # its sink names the start as the query selects it (nexmark-flink's sink: stime)
    "q8": ("id BIGINT, name STRING, starttime TIMESTAMP(3)",
           "SELECT P.id, P.name, P.starttime FROM (SELECT id, name, window_start AS starttime, window_end AS endtime "
           "FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) "
           "GROUP BY id, name, window_start, window_end) P JOIN (SELECT seller, window_start AS starttime, "
           "window_end AS endtime FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) "
           "GROUP BY seller, window_start, window_end) A ON P.id = A.seller AND P.starttime = A.starttime "
           "AND P.endtime = A.endtime"),
    # its sink names the columns as selected (nexmark-flink's inserts price and bidder the other way round)
    "q7": ("auction BIGINT, price BIGINT, bidder BIGINT, dateTime TIMESTAMP(3), extra STRING",
           "SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra from bid B JOIN ("
           "SELECT MAX(price) AS maxprice, window_end as dateTime FROM TABLE("
           "TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) GROUP BY window_start, window_end) B1 "
           "ON B.price = B1.maxprice WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL '10' SECOND AND B1.dateTime"),
}


def quoted(sql: str) -> str:
    """DATETIME is a keyword in Flink 2's parser: nexmark's column name needs backticks there."""
    return sql.replace("dateTime", "`dateTime`")


def create_tables(env, data: Path) -> None:
    for table, columns in TABLES.items():
        env.execute_sql(quoted(f"CREATE TEMPORARY TABLE {table} ({columns}, "
                               "WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND) ")
                        + f"WITH ('connector' = 'filesystem', 'path' = 'file://{data / table}', 'format' = 'parquet')")


def run(env, rest, query: str, events: int, out: Path | None, run_id: str) -> dict:
    columns, select = QUERIES[query]
    sink = f"sink_{query}_{run_id}"
    where = (f"'connector' = 'filesystem', 'path' = 'file://{out / query}', 'format' = 'parquet'"
             if out else "'connector' = 'blackhole'")
    env.execute_sql(quoted(f"CREATE TEMPORARY TABLE {sink} ({columns})") + f" WITH ({where})")
    timed = timed_insert(env, rest, query, quoted(f"INSERT INTO {sink} {select}"), events)
    return {"events": events, "events_per_s": timed["rows_per_s"], "running_s": timed["running_s"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jars", required=True, help="Flink's Parquet format and Hadoop's client, comma-separated")
    parser.add_argument("--queries", required=True)
    parser.add_argument("--events", type=int, required=True)
    args = parser.parse_args()
    cluster, rest = start_minicluster()
    results, warmup = {}, {}
    try:
        env = table_env(rest)
        env.get_config().set("pipeline.jars", ";".join(f"file://{jar}" for jar in args.jars.split(",")))
        create_tables(env, args.data)
        for query in args.queries.split(","):
            warmup[query] = run(env, rest, query, args.events, None, "warmup")
            results[query] = run(env, rest, query, args.events, None, "timed")
            if query not in UPDATING:
                run(env, rest, query, args.events, args.out, "answer")
            print(f"done {query}", flush=True)  # bench/nexmark.py takes the query's peak RSS
        setup = flink_setup(args.events)
    finally:
        cluster.close()
    sys.stdout.write(json.dumps({"setup": setup, "warmup": warmup, "results": results}) + "\n")


if __name__ == "__main__":
    main()
