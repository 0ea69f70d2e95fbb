"""Key groups, as Flink assigns them: key -> key group -> operator subtask.

A key's group never changes (it depends only on the key and the max parallelism), so keyed state
partitioned by key group can be moved to a new parallelism by moving whole groups. The hash is
pandas' stable row hash (fixed hash key), identical in every process.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common.frames import pandas_values


def key_groups_of(table: pa.Table, key: list[str], max_parallelism: int) -> np.ndarray:
    """The key group of every row of ``table``: pandas' row hash of its key columns, as
    ``key_groups_of_frame`` gives it. Key columns whose numpy values are those pandas would hold
    are hashed as they are: building the DataFrame cost a keyed exchange's task a third of its CPU."""
    values = [pandas_values(table.column(name)) for name in key]
    if any(v is None for v in values):
        return key_groups_of_frame(table.select(key).to_pandas(), max_parallelism)
    hashes = _combine_hashes([pd.util.hash_array(v) for v in values])
    return (hashes % np.uint64(max_parallelism)).astype(np.int64)


def _combine_hashes(arrays: list[np.ndarray]) -> np.ndarray:
    """pandas' combination of a DataFrame's column hashes into its row hash (hash_pandas_object
    with index=False), which pandas keeps private."""
    mult = np.uint64(1000003)
    out = np.zeros_like(arrays[0]) + np.uint64(0x345678)
    for i, array in enumerate(arrays):
        inverse = len(arrays) - i
        out ^= array
        out *= mult
        mult += np.uint64(82520 + inverse + inverse)
    return out + np.uint64(97531)


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
