"""Key groups, as Flink assigns them: key -> key group -> operator subtask.

A key's group never changes (it depends only on the key and the max parallelism), so keyed state
partitioned by key group can be moved to a new parallelism by moving whole groups. The hash is
pandas' stable row hash (fixed hash key), identical in every process.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa


def key_groups_of(table: pa.Table, key: list[str], max_parallelism: int) -> np.ndarray:
    return key_groups_of_frame(table.select(key).to_pandas(), max_parallelism)


def key_groups_of_frame(keys: pd.DataFrame, max_parallelism: int) -> np.ndarray:
    """The same, for key columns already converted to pandas (the same conversion, the same groups)."""
    hashes = pd.util.hash_pandas_object(keys, index=False).to_numpy()
    return (hashes % np.uint64(max_parallelism)).astype(np.int64)


def operator_index_for_key_group(key_group, max_parallelism: int, parallelism: int):
    return key_group * parallelism // max_parallelism


def key_group_range(max_parallelism: int, parallelism: int, index: int) -> range:
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)
