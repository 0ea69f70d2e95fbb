import numpy as np
import pyarrow as pa

from cluster.state.key_groups import key_group_range, key_groups_of, operator_index_for_key_group


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
