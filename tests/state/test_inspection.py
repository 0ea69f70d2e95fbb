"""Reading keyed state out of snapshot files for a look (cluster.checkpoint.inspection), from files
written by either backend at parallelism 2, as a checkpoint holds them."""
from __future__ import annotations

import math
import zlib

import pytest

from cluster.checkpoint.storage import write_metadata
from cluster.checkpoint.inspection import (decode_entries, encode_key, json_rows, jsonable, read_checkpoint_state, state_frame)
from cluster.state.key_groups import key_group_range
from cluster.state.snapshot_format import StateFormatError

from .conftest import MAX_PARALLELISM



def group_of(key) -> int:
    return zlib.crc32(repr(key).encode()) % MAX_PARALLELISM  # any fixed assignment will do


def checkpoint(tmp_path, make_backend, kind, fill) -> tuple:
    """A checkpoint folder of one operator "op" at parallelism 2 whose subtasks ``fill`` their backend."""
    handles = []
    for subtask in range(2):
        backend = make_backend(kind, key_group_range(MAX_PARALLELISM, 2, subtask))
        for state, key, value in fill:
            if group_of(key) in backend.key_group_range:
                backend.put(state, group_of(key), key, value)
        name = f"op-{subtask}.state"
        backend.snapshot().write(tmp_path / name)
        handles.append({"keyed_file": name, "subtask": subtask, "parallelism": 2})
    source = [{"subtask": s, "parallelism": 2, "position": {"facts": [], "partial": {str(s): 5}}} for s in (1, 0)]
    write_metadata(tmp_path, {"job_id": "j", "checkpoint_id": 4, "kind": "checkpoint", "operators": {
        "op": {"vertex": "v", "max_parallelism": MAX_PARALLELISM, "subtasks": handles},
        "src": {"vertex": "s", "max_parallelism": MAX_PARALLELISM, "subtasks": source}}})
    return tmp_path


PROCESS = [("v:total", k, 10 * k) for k in range(10)] + [("l:seen", k, (k, k + 1)) for k in range(0, 10, 2)] + \
          [("m:by", k, {"a": k}) for k in range(3)] + [("_timers/event", k, 0) for k in range(10)]
INFO = {"name": "process", "uid": "op", "kind": "keyed-process", "key": ["k"]}


def test_a_process_function_state_one_row_per_key(tmp_path, make_backend, kind):
    directory = checkpoint(tmp_path, make_backend, kind, PROCESS)
    entries, positions, checkpoint_id = read_checkpoint_state(directory, "op", None)
    frame = state_frame(decode_entries(entries), INFO)
    assert checkpoint_id == 4
    assert [p["subtask"] for p in positions["src"]] == [0, 1] and "op" not in positions
    assert list(frame.columns) == ["k", "by", "seen", "total"]  # the timers are internal
    assert frame["k"].tolist() == list(range(10))
    assert frame["total"].tolist() == [10 * k for k in range(10)]
    assert frame.loc[2, "seen"] == [2, 3] and frame.loc[1, "seen"] is None
    assert frame.loc[1, "by"] == {"a": 1} and frame.loc[5, "by"] is None


def test_one_key(tmp_path, make_backend, kind):
    directory = checkpoint(tmp_path, make_backend, kind, PROCESS)
    frame = state_frame(decode_entries(read_checkpoint_state(directory, "op", encode_key(4))[0]), INFO)
    assert frame.to_dict("records") == [{"k": 4, "seen": [4, 5], "total": 40}]  # the states it has
    assert state_frame(decode_entries(read_checkpoint_state(directory, "op", encode_key(99))[0]), INFO).empty


def test_aggregates_by_the_names_given(tmp_path, make_backend, kind):
    aggregations = {"total": ["x", "sum"], "avg": ["x", "mean"], "top": ["x", "max"]}
    # the operator's partial layout: total s, avg s and c, top max
    directory = checkpoint(tmp_path, make_backend, kind, [("partials", k, (k * 3, k * 3, 3, k + 1)) for k in range(4)])
    info = {"name": "agg", "uid": "op", "kind": "keyed-aggregate", "key": ["k"], "aggregations": aggregations}
    frame = state_frame(decode_entries(read_checkpoint_state(directory, "op", None)[0]), info)
    assert frame.to_dict("records") == [{"k": k, "avg": float(k), "top": k + 1, "total": 3 * k} for k in range(4)]


def test_several_key_columns(tmp_path, make_backend, kind):
    keys = [(k, str(k)) for k in range(3)]
    directory = checkpoint(tmp_path, make_backend, kind, [("count", key, 1) for key in keys])
    info = {"name": "count", "uid": "op", "kind": "keyed-count", "key": ["n", "s"]}
    frame = state_frame(decode_entries(read_checkpoint_state(directory, "op", encode_key([1, "1"]))[0]), info)
    assert frame.to_dict("records") == [{"n": 1, "s": "1", "count": 1}]


def test_a_truncated_file_is_a_format_error(tmp_path, make_backend):
    directory = checkpoint(tmp_path, make_backend, "hashmap", PROCESS)
    path = directory / "op-1.state"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(StateFormatError, match="op-1.state"):
        read_checkpoint_state(directory, "op", None)


def test_values_that_do_not_load_here_are_shown_as_a_note():
    import pyarrow as pa
    from cluster.checkpoint.inspection import ENTRIES
    table = pa.table({"state": ["v:x"], "key": [encode_key(1)], "value": [b"\x80\x05not a pickle"]}, schema=ENTRIES)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ENTRIES) as writer:
        writer.write_table(table)
    with pytest.raises(Exception):
        decode_entries(sink.getvalue().to_pybytes())
    ((_, _, value),) = decode_entries(sink.getvalue().to_pybytes(), lenient=True)
    assert value.startswith("<cannot be decoded here:")


def test_json():
    class Thing:
        def __repr__(self):
            return "Thing()"
    import numpy as np
    assert jsonable({1: [np.int64(2), (3.5, math.nan)], "a": Thing(), "b": b"x"}) == \
        {"1": [2, [3.5, None]], "a": "Thing()", "b": "b'x'"}
    frame = state_frame([("count", 1, 2)], {"name": "c", "uid": "u", "kind": "keyed-count", "key": ["k"]})
    assert json_rows(frame) == (["k", "count"], [[1, 2]])


def test_a_deduplicated_key_shows_its_kept_row_by_column(tmp_path, make_backend, kind):
    rows = [("kept", k, {"k": k, "v": 10 * k, "ts": k + 0.5}) for k in range(3)]
    directory = checkpoint(tmp_path, make_backend, kind, rows)
    info = {"name": "dedup", "uid": "op", "kind": "keyed-deduplicate", "key": ["k"]}
    frame = state_frame(decode_entries(read_checkpoint_state(directory, "op", None)[0]), info)
    assert frame.to_dict("records") == [{"k": k, "v": 10 * k, "ts": k + 0.5} for k in range(3)]
