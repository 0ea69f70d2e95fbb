import numpy as np
import pyarrow as pa

from cluster.state.key_groups import key_group_range, key_groups_of, key_groups_of_frame, operator_index_for_key_group


def test_key_group_ranges_partition_all_groups_like_flink():
    for parallelism in (1, 2, 3, 7, 128):
        ranges = [key_group_range(128, parallelism, i) for i in range(parallelism)]
        assert [g for r in ranges for g in r] == list(range(128))
        for i, r in enumerate(ranges):
            assert all(operator_index_for_key_group(g, 128, parallelism) == i for g in r)


def test_key_groups_are_stable_and_depend_only_on_the_key():
    t = pa.table({"k": ["a", "b", "a", "c"], "v": [1, 2, 3, 4]})
    groups = key_groups_of(t, ["k"], 128)
    assert groups[0] == groups[2] and groups.min() >= 0 and groups.max() < 128
    again = key_groups_of(pa.table({"k": ["c", "a"]}), ["k"], 128)
    assert list(again) == [groups[3], groups[0]]
    # known values pin the hash: a change would silently move keyed state between subtasks
    assert list(key_groups_of(pa.table({"k": np.array([42, 7], dtype=np.int64)}), ["k"], 128)) == [9, 63]
    assert list(key_groups_of(pa.table({"k": ["user-1"]}), ["k"], 128)) == [57]


def test_a_tables_key_groups_are_those_of_its_pandas_frame_for_every_key_type():
    """key_groups_of hashes some Arrow columns without building a DataFrame: the groups must be
    the ones pandas' row hash gives the same rows (key_groups_of_frame), or keyed state would be
    looked for in the wrong subtask, and a savepoint's groups would move."""
    n = 200
    seq = np.arange(n)
    columns = {
        "int64": pa.array(seq * 7919 - 1000, pa.int64()),
        "int32": pa.array(seq % 50, pa.int32()),
        "uint8": pa.array(seq % 256, pa.uint8()),
        "int with nulls": pa.array([None if i % 7 == 0 else i for i in range(n)], pa.int64()),
        "bool": pa.array(seq % 3 == 0),
        "float64 with nulls": pa.array([None if i % 5 == 0 else i / 3 for i in range(n)], pa.float64()),
        "float32": pa.array(seq / 7, pa.float32()),
        "string with nulls": pa.array([None if i % 9 == 0 else f"user-{i % 17}" for i in range(n)]),
        "large_string": pa.array([f"k{i % 23}" for i in range(n)], pa.large_string()),
        "timestamp": pa.array(seq * 1_000, pa.timestamp("ms")),
        "dictionary": pa.array([f"d{i % 4}" for i in range(n)]).dictionary_encode(),
    }
    table = pa.Table.from_batches([pa.record_batch(columns)]).combine_chunks()
    chunked = pa.concat_tables([table.slice(0, 61), table.slice(61)])  # columns of two chunks
    for name in columns:
        for key in ([name], [name, "int32"], ["string with nulls", name]):
            expected = key_groups_of_frame(table.select(key).to_pandas(), 128)
            assert list(key_groups_of(chunked, key, 128)) == list(expected), key
