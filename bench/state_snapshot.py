"""Checkpoint cost of the keyed state backends, for about 100 MB of keyed state.

One subtask owning every key group (max parallelism 128) holds 1M int keys with 100-byte values,
in each backend ("hashmap", "rocksdb"). Measured:

* put_many / get_many throughput, in batches of 10k rows (a task's batch);
* snapshot(): the synchronous part, on the task thread at the barrier;
* write(): the asynchronous part, alone, then again while the task thread keeps putting (the
  task's put rate meanwhile is shown: Python threads share one interpreter lock);
* the snapshot file size, and restore() of that file into a fresh backend of the same kind.

    .venv/bin/python bench/state_snapshot.py [--keys 1000000] [--value-bytes 100]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.state.loader import create_backend  # noqa: E402
from cluster.state.key_groups import key_groups_of  # noqa: E402

MAX_PARALLELISM = 128
BATCH = 10_000


def timed(action):
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def batches(keys: list, groups: list, values: list):
    for start in range(0, len(keys), BATCH):
        end = start + BATCH
        yield groups[start:end], keys[start:end], values[start:end]


def write_under_load(backend, path: Path, keys: list, groups: list, values: list):
    """Seconds of write() on a thread while this thread puts; rows put per second meanwhile."""
    snapshot = backend.snapshot()
    writer = threading.Thread(target=snapshot.write, args=(path,))
    started = time.perf_counter()
    writer.start()
    put = 0
    while writer.is_alive():
        for batch_groups, batch_keys, batch_values in batches(keys, groups, values):
            backend.put_many("value", batch_groups, batch_keys, batch_values)
            put += len(batch_keys)
            if not writer.is_alive():
                break
    writer.join()
    seconds = time.perf_counter() - started
    return seconds, put / seconds


def measure(kind: str, keys: list, groups: list, values: list, work: Path) -> dict:
    backend = create_backend(kind, range(MAX_PARALLELISM), MAX_PARALLELISM, work / kind)
    try:
        put_s, _ = timed(lambda: [backend.put_many("value", g, k, v) for g, k, v in
                                  batches(keys, groups, values)])
        get_s, _ = timed(lambda: [backend.get_many("value", g, k) for g, k, _ in
                                  batches(keys, groups, values)])
        sync_s, snapshot = timed(backend.snapshot)
        path = work / f"{kind}.snapshot"
        write_s, stats = timed(lambda: snapshot.write(path))
        assert stats["entries"] == len(keys), stats
        loaded_s, loaded_put_rate = write_under_load(backend, work / f"{kind}-loaded.snapshot",
                                                     keys, groups, values)
    finally:
        backend.close()
    restored = create_backend(kind, range(MAX_PARALLELISM), MAX_PARALLELISM,
                              work / f"{kind}-restored")
    try:
        restore_s, _ = timed(lambda: restored.restore([path]))
        probe = len(keys) // 2
        assert restored.get("value", groups[probe], keys[probe]) == values[probe]
    finally:
        restored.close()
    n = len(keys)
    return {"backend": kind, "put_many rows/s": n / put_s, "get_many rows/s": n / get_s,
            "snapshot() ms": sync_s * 1000, "write() s": write_s,
            "write() under load s": loaded_s, "puts/s during it": loaded_put_rate,
            "file MB": stats["bytes"] / 1e6, "restore() s": restore_s}


def print_table(rows: list[dict]) -> None:
    columns = list(rows[0])
    cells = [[c] + [format_cell(row[c]) for row in rows] for c in columns]
    width = max(len(c[0]) for c in cells)
    value_width = max(len(v) for c in cells for v in c[1:])
    for column in cells:
        print(column[0].ljust(width), *(v.rjust(value_width) for v in column[1:]), sep="  ")


def format_cell(value) -> str:
    if isinstance(value, str):
        return value
    if value >= 10_000:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()
    keys = list(range(args.keys))
    groups = key_groups_of(pa.table({"k": keys}), ["k"], MAX_PARALLELISM).tolist()
    values = [os.urandom(args.value_bytes) for _ in keys]
    print(f"{args.keys:,} keys x {args.value_bytes}-byte values "
          f"(~{args.keys * args.value_bytes / 1e6:.0f} MB of values), max parallelism "
          f"{MAX_PARALLELISM}, batches of {BATCH:,}")
    with tempfile.TemporaryDirectory(prefix="state-bench-") as work:
        rows = [measure(kind, keys, groups, values, Path(work)) for kind in ("hashmap", "rocksdb")]
    print_table(rows)


if __name__ == "__main__":
    main()
