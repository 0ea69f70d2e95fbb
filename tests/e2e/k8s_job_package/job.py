"""A job package as `streamlab export` writes one (job.py, config.yaml, requirements.txt), for
the application manifest's test: a keyed sum that checks its own result against pandas, so the
application's exit code says whether it was right."""
import numpy as np
import pandas as pd

from kernel_runtime import StreamEnvironment

N = 20_000


def events(seq):
    return pd.DataFrame({"user": (seq * 7919) % 13, "amount": (seq % 11).astype("int64")})


def main(argv=None):
    env = StreamEnvironment.get_execution_environment(parallelism=2)
    (env.from_generator(events, count=N, batch_size=1_000)
     .key_by("user").aggregate(total=("amount", "sum")).collect("sums"))
    result = env.execute("k8s application keyed sum")
    got = result.to_pandas().sort_values("user").reset_index(drop=True)[["user", "total"]]
    df = events(np.arange(N, dtype=np.int64))
    expected = df.groupby("user", as_index=False).agg(total=("amount", "sum"))
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    print(got.to_string(index=False))


if __name__ == "__main__":
    main()
