"""The PyFlink side of bench/windows.py; run by it with the PyFlink venv's python, never the project's.

    <pyflink-venv>/bin/python bench/windows_flink.py --rows N

Runs the four window shapes of bench/windows.py as Flink SQL (Table API, streaming mode,
parallelism 2, window TVFs, datagen sequence -> blackhole) in a MiniCluster reached through its
REST endpoint (bench/peers_flink.py: why, and the timing), and prints one JSON line on stdout:
the setup and, per shape, rows/s over the job's RUNNING time.

Rows are made from id = 0..N-1 as bench/windows.py's generator makes them: event time
ts = id / 100 ms (100,000 events per second of event time), in order within each source subtask
(datagen's sequence deals ids to subtasks in turn), watermark ts - 200 ms. Flink's watermark
is generated per source subtask as streamlab's; the 200 ms bound never drops a row here.
"""
from __future__ import annotations

import argparse

from peers_flink import report_runs, timed_insert  # noqa: E402 (same folder)

# the generator's columns (bench/windows.py events() and bids()), computed from datagen's sequence
EVENTS = """CREATE TEMPORARY TABLE IF NOT EXISTS events_{n} (
    id BIGINT, k AS id % 10000, v AS id % 1000, ts AS TO_TIMESTAMP_LTZ(id / 100, 3),
    WATERMARK FOR ts AS ts - INTERVAL '0.2' SECOND)
WITH ('connector' = 'datagen', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0',
      'fields.id.end' = '{last}', 'rows-per-second' = '1000000000000')"""
BIDS = """CREATE TEMPORARY TABLE IF NOT EXISTS bids_{n} (
    id BIGINT, auction AS CASE WHEN id % 4 = 0 THEN id % 100 ELSE id % 10000 END,
    price AS 1 + id * 7919 % 100000, ts AS TO_TIMESTAMP_LTZ(id / 100, 3),
    WATERMARK FOR ts AS ts - INTERVAL '0.2' SECOND)
WITH ('connector' = 'datagen', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0',
      'fields.id.end' = '{last}', 'rows-per-second' = '1000000000000')"""

KEYED = "(k BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3), n BIGINT, s BIGINT)"
PER_WINDOW = "(window_start TIMESTAMP(3), window_end TIMESTAMP(3), m BIGINT)"
# shape: (source table, sink columns, query)
SHAPES = {
    "tumbling 1 s": ("events", KEYED, """
        SELECT k, window_start, window_end, COUNT(*) AS n, SUM(v) AS s
        FROM TABLE(TUMBLE(TABLE events_{n}, DESCRIPTOR(ts), INTERVAL '1' SECOND))
        GROUP BY k, window_start, window_end"""),
    "sliding 10 s / 1 s": ("events", KEYED, """
        SELECT k, window_start, window_end, COUNT(*) AS n, SUM(v) AS s
        FROM TABLE(HOP(TABLE events_{n}, DESCRIPTOR(ts), INTERVAL '1' SECOND, INTERVAL '10' SECOND))
        GROUP BY k, window_start, window_end"""),
    # Nexmark q7's inner query: the highest price per tumbling 10 s window (without q7's join back to the bid)
    "highest bid": ("bids", PER_WINDOW, """
        SELECT window_start, window_end, MAX(price) AS m
        FROM TABLE(TUMBLE(TABLE bids_{n}, DESCRIPTOR(ts), INTERVAL '10' SECOND))
        GROUP BY window_start, window_end"""),
    # Nexmark q5's shape: bids per auction per 10 s window sliding by 2 s, then the most per window
    # (the planner makes the outer GROUP BY a window aggregate too: it is on the inner's window)
    "hot items": ("bids", PER_WINDOW, """
        SELECT window_start, window_end, MAX(n) AS m FROM (
            SELECT auction, window_start, window_end, COUNT(*) AS n
            FROM TABLE(HOP(TABLE bids_{n}, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
            GROUP BY auction, window_start, window_end)
        GROUP BY window_start, window_end"""),
}
SOURCES = {"events": EVENTS, "bids": BIDS}


def run(env, rest, shape: str, n: int) -> dict:
    source, columns, query = SHAPES[shape]
    env.execute_sql(SOURCES[source].format(n=n, last=n - 1))
    sink = f"sink_{abs(hash(shape))}_{n}"
    env.execute_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {sink} {columns} WITH ('connector' = 'blackhole')")
    return timed_insert(env, rest, shape, f"INSERT INTO {sink} {query.format(n=n)}", n)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--shape", action="append", choices=list(SHAPES), help="only these shapes (default all)")
    parser.add_argument("--warmup-rows", type=int, default=200_000)
    args = parser.parse_args()
    report_runs(run, args.shape or list(SHAPES), args.rows, args.warmup_rows)

if __name__ == "__main__":
    main()
