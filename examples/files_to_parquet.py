"""Read a directory of CSV files, count orders per user, write the counts as Parquet part files.

Records that do not fit the schema are not lost: they come back from the "malformed" side output.

    python examples/files_to_parquet.py [WORK_DIR]           (an embedded local cluster)
    streamlab run examples/files_to_parquet.py [WORK_DIR]    (a running cluster)
"""
import sys
import tempfile
from pathlib import Path

import pandas as pd

from kernel_runtime import StreamEnvironment
from kernel_runtime.api.connectors import FileSink, FileSource

work = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="streamlab-files-"))
orders, counts = work / "orders", work / "counts"
orders.mkdir(parents=True, exist_ok=True)
for day in range(3):  # sample input: three days of orders, one line of which is broken
    seq = pd.RangeIndex(day * 1000, (day + 1) * 1000)
    frame = pd.DataFrame({"user": [f"u{i % 10}" for i in seq], "amount": seq % 7, "price": seq / 100})
    frame.to_csv(orders / f"day-{day}.csv", index=False)
with open(orders / "day-2.csv", "a") as f:
    f.write("u3,seven,1.5\n")

env = StreamEnvironment.get_execution_environment(parallelism=2)
stream = env.from_source(FileSource.csv(orders, schema={"user": "string", "amount": "int64", "price": "double"}),
                         name="orders")
(stream.filter(lambda df: df.amount > 0, name="non-empty")
    .key_by("user")
    .count(name="orders per user")
    .sink_to(FileSink.parquet(counts, rows_per_file=50_000)))
stream.get_side_output("malformed").collect(name="malformed")
result = env.execute("files to parquet")

final = pd.read_parquet(counts).groupby("user", as_index=False)["count"].max()
print(final.sort_values("user").to_string(index=False))
print(f"\nParquet part files in {counts}: {sorted(p.name for p in counts.iterdir())}")
print("\nmalformed records:")
print(result.to_pandas("malformed").to_string(index=False))
