"""Count events per user: a generator, a Spark SQL step (runs on the TaskManagers' SparkSessions), key_by and a running count.

    streamlab cluster start --taskmanagers 2 --slots 2
    streamlab run examples/keyed_count.py
"""
import pandas as pd

from kernel_runtime import StreamEnvironment


def events(seq):
    # deterministic "events": user u0..u9, amount from the sequence number
    return pd.DataFrame({"user": pd.Series(seq % 10).map(lambda u: f"u{u}"), "amount": seq % 7, "seq": seq})


env = StreamEnvironment.get_execution_environment(parallelism=2)
(
    env.from_generator(events, count=100_000, batch_size=5_000, name="events")
    .sql("SELECT user, amount * 10 AS amount, seq FROM input WHERE amount > 0", name="scale, non-zero")
    .key_by("user")
    .count(name="count per user")
    .collect(name="counts")
)
result = env.execute("keyed count")
# the count is an upsert stream: its result is the table, each user's final count
# (.changelog().collect(...) would keep every update instead)
print(result.to_pandas().sort_values("user").to_string(index=False))
