"""FileSink driven directly: rolling, in-progress files, two-phase commit, part numbering."""
from __future__ import annotations

import os
import re

import msgpack
import pandas as pd
import pyarrow as pa
import pytest

from kernel_runtime.api.connectors import FileSink

from .harness import WHERE, Driven


def batch(start: int, n: int) -> pa.Table:
    numbers = range(start, start + n)
    return pa.Table.from_pandas(pd.DataFrame({"n": numbers, "s": [f"r{i}" for i in numbers]}), preserve_index=False)


def visible(directory) -> list[str]:
    return sorted(p for p in os.listdir(directory) if not p.startswith((".", "_")))


def hidden(directory) -> list[str]:
    return sorted(p for p in os.listdir(directory) if p.startswith("."))


def test_rolls_by_row_count_and_readers_see_only_committed_files(tmp_path):
    sink = Driven(FileSink.parquet(tmp_path / "out", rows_per_file=100), subtask=1, parallelism=2).op
    for start in range(0, 250, 70):
        sink.process(batch(start, min(70, 250 - start)))
    assert visible(tmp_path / "out") == ["part-1-0.parquet", "part-1-1.parquet"]
    (in_progress,) = hidden(tmp_path / "out")
    assert in_progress.startswith(".part-1-2.parquet.inprogress.")
    # what a reader of the directory sees meanwhile: whole committed files only
    assert list(pd.read_parquet(tmp_path / "out")["n"]) == list(range(200))
    assert sink.finish() == []
    assert visible(tmp_path / "out") == ["part-1-0.parquet", "part-1-1.parquet", "part-1-2.parquet"]
    assert hidden(tmp_path / "out") == []
    out = pd.read_parquet(tmp_path / "out")
    assert list(out["n"]) == list(range(250)) and list(out["s"]) == [f"r{i}" for i in range(250)]
    assert [len(pd.read_parquet(tmp_path / "out" / f"part-1-{i}.parquet")) for i in range(3)] == [100, 100, 50]


def test_two_phase_commit_makes_files_visible_only_on_commit(tmp_path):
    sink = Driven(FileSink.parquet(tmp_path, rows_per_file=10)).op
    sink.commit_on_roll = False  # as with checkpoints: prepare on the barrier, commit on completion
    sink.process(batch(0, 25))
    assert visible(tmp_path) == []
    pending = sink.prepare_commit()
    assert [os.path.basename(p["final"]) for p in pending] == ["part-0-0.parquet", "part-0-1.parquet",
                                                               "part-0-2.parquet"]
    assert [p["rows"] for p in pending] == [10, 10, 5] and visible(tmp_path) == []
    assert len(hidden(tmp_path)) == 3
    stored = msgpack.unpackb(msgpack.packb(pending))  # pending files are plain data: they go in a checkpoint
    sink.process(batch(25, 3))  # rows after the barrier belong to the next checkpoint
    sink.commit(stored)
    assert visible(tmp_path) == ["part-0-0.parquet", "part-0-1.parquet", "part-0-2.parquet"]
    assert len(pd.read_parquet(tmp_path)) == 25
    sink.commit(stored)  # replayed after a restore: nothing to do, no error
    (after_barrier,) = hidden(tmp_path)
    assert after_barrier.startswith(".part-0-3.parquet.inprogress.")
    os.remove(stored[0]["final"])
    with pytest.raises(FileNotFoundError, match="cannot commit .*part-0-0.parquet: its in-progress file"):
        sink.commit(stored)


def test_part_numbers_continue_after_files_already_there(tmp_path):
    first = Driven(FileSink.parquet(tmp_path, rows_per_file=5)).op
    first.process(batch(0, 7))
    first.finish()
    uncommitted = Driven(FileSink.parquet(tmp_path)).op
    uncommitted.process(batch(100, 1))  # a failed attempt's in-progress file, left behind
    second = Driven(FileSink.parquet(tmp_path, rows_per_file=5)).op
    second.process(batch(7, 3))
    second.finish()
    assert visible(tmp_path) == ["part-0-0.parquet", "part-0-1.parquet", "part-0-3.parquet"]
    assert sorted(pd.read_parquet(tmp_path)["n"]) == list(range(10))


def test_close_without_finish_discards_the_in_progress_file(tmp_path):
    sink = Driven(FileSink.parquet(tmp_path)).op
    sink.process(batch(0, 3))
    assert len(hidden(tmp_path)) == 1
    sink.close()
    assert os.listdir(tmp_path) == []


def test_an_old_attempt_closes_after_the_next_one_removed_its_in_progress_file(tmp_path):
    # a failover: the new attempt restores (removing the old attempt's uncovered in-progress file as
    # a stray) while the old attempt's task, being cancelled elsewhere, has yet to close
    old = Driven(FileSink.parquet(tmp_path)).op
    old.process(batch(0, 3))
    new = Driven(FileSink.parquet(tmp_path)).op
    new.restore_state([])
    assert hidden(tmp_path) == []
    old.close()  # no error: its file is gone already
    new.process(batch(3, 2))
    new.finish()
    assert sorted(pd.read_parquet(tmp_path)["n"]) == [3, 4]


def test_batches_are_cast_to_the_file_schema_or_fail_clearly(tmp_path):
    sink = Driven(FileSink.parquet(tmp_path)).op
    sink.process(pa.table({"n": pa.array([1], pa.int64()), "s": ["a"]}))
    sink.process(pa.table({"s": ["b"], "n": pa.array([2], pa.int32())}))  # other order, narrower type
    with pytest.raises(ValueError, match=rf"{re.escape(WHERE)}: a batch does not fit "
                                         r"the schema of the part file being written"):
        sink.process(pa.table({"n": ["not a number"], "s": ["c"]}))
    sink.finish()
    assert pd.read_parquet(tmp_path).to_dict("list") == {"n": [1, 2], "s": ["a", "b"]}
