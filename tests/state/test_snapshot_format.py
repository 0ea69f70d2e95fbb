"""Files a restore must refuse, each with a StateFormatError naming the file and the problem."""
from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from cluster.state.snapshot_format import COLUMNS, StateFormatError

from .conftest import MAX_PARALLELISM


@pytest.fixture
def snapshot_file(make_backend, tmp_path):
    backend = make_backend("hashmap")
    backend.put_many("count", [g for g in range(MAX_PARALLELISM)],
                     [f"key-{g}" for g in range(MAX_PARALLELISM)],
                     [f"MARK-{g}" for g in range(MAX_PARALLELISM)])
    path = tmp_path / "good"
    backend.snapshot().write(path)
    return path


def refused(make_backend, kind, path, problem, max_parallelism=MAX_PARALLELISM):
    backend = make_backend(kind, range(max_parallelism), max_parallelism)
    with pytest.raises(StateFormatError, match=re.escape(str(path)) + ".*" + problem) as caught:
        backend.restore([path])
    assert caught.value.path == path
    assert list(backend.items("count")) == []


def test_the_good_file_restores(kind, make_backend, snapshot_file):
    backend = make_backend(kind)
    backend.restore([snapshot_file])
    assert backend.get("count", 5, "key-5") == "MARK-5"


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_truncated_file(kind, make_backend, snapshot_file, tmp_path, keep):
    data = snapshot_file.read_bytes()
    path = tmp_path / "truncated"
    path.write_bytes(data[:int(len(data) * keep)])
    refused(make_backend, kind, path, "truncated or corrupt")


def test_empty_and_garbage_files(kind, make_backend, tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    refused(make_backend, kind, empty, "truncated or corrupt")
    garbage = tmp_path / "garbage"
    garbage.write_bytes(bytes(range(256)) * 40)
    refused(make_backend, kind, garbage, "truncated or corrupt")


def test_flipped_byte_in_the_data(kind, make_backend, snapshot_file, tmp_path):
    data = bytearray(snapshot_file.read_bytes())
    data[data.index(b"MARK-77")] ^= 0x01
    path = tmp_path / "flipped"
    path.write_bytes(bytes(data))
    refused(make_backend, kind, path, "record batch 0 fails its checksum")


def test_another_max_parallelism(kind, make_backend, snapshot_file):
    refused(make_backend, kind, snapshot_file,
            "written with max parallelism 128, restoring with 256", max_parallelism=256)


def test_arrow_file_that_is_not_a_state_snapshot(kind, make_backend, tmp_path):
    path = tmp_path / "other.arrow"
    table = pa.table({"a": [1, 2]})
    with ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
    refused(make_backend, kind, path, "not a keyed state snapshot")


def test_parquet_file(kind, make_backend, tmp_path):
    path = tmp_path / "state.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), path)
    refused(make_backend, kind, path, "not a complete Arrow IPC file")


def test_future_format_version(kind, make_backend, tmp_path):
    path = tmp_path / "v99"
    schema = COLUMNS.with_metadata({b"streamlab.format": b"streamlab-keyed-state",
                                    b"streamlab.format.version": b"99",
                                    b"streamlab.max_parallelism": b"128"})
    with ipc.new_file(path, schema):
        pass
    refused(make_backend, kind, path, "format version 99, this reader knows 1")


def test_a_missing_file_is_not_a_format_error(make_backend, tmp_path):
    with pytest.raises(FileNotFoundError):
        make_backend("hashmap").restore([tmp_path / "absent"])
