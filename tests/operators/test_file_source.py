"""FileSource driven directly: formats, splitting, positions, malformed records, watching."""
from __future__ import annotations

import os
import re
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cluster.graph.schema import MalformedInputError
from kernel_runtime.api.connectors import FileSource

from .harness import WHERE, Driven, rows

SCHEMA = {"user": "string", "amount": "int64", "price": "double", "ok": "bool", "at": "timestamp[ms]"}


def frame(n: int, start: int = 0) -> pd.DataFrame:
    seq = range(start, start + n)
    return pd.DataFrame({
        "user": [f"u{i % 7}" for i in seq], "amount": [i * 3 for i in seq], "price": [i / 4 for i in seq],
        "ok": [i % 2 == 0 for i in seq],
        "at": pd.to_datetime([1_700_000_000_000 + i * 1000 for i in seq], unit="ms")})


def write(df: pd.DataFrame, path, fmt: str) -> None:
    if fmt == "csv":
        df.to_csv(path, index=False, date_format="%Y-%m-%d %H:%M:%S.%f")
    elif fmt == "json":
        df.assign(at=df["at"].dt.strftime("%Y-%m-%dT%H:%M:%S.%f")).to_json(path, orient="records", lines=True)
    else:
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=7)


def source(fmt: str, path, **kwargs) -> FileSource:
    factory = {"csv": FileSource.csv, "json": FileSource.json_lines, "parquet": FileSource.parquet}[fmt]
    return factory(path, **kwargs)


def as_frame(tables) -> pd.DataFrame:
    out = pa.concat_tables(tables).to_pandas() if tables else pd.DataFrame()
    out["at"] = out["at"].astype("datetime64[ns]")
    return out.reset_index(drop=True)


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_each_format_reads_typed_rows_in_batches(tmp_path, fmt):
    expected = frame(50)
    write(expected, tmp_path / f"data.{fmt}", fmt)
    driven = Driven(source(fmt, tmp_path, schema=SCHEMA, batch_size=8))
    tables = driven.drain()
    assert [t.num_rows for t in tables] == [8] * 6 + [2]
    assert tables[0].schema == pa.schema([(k, pa.type_for_alias(v)) for k, v in SCHEMA.items()])
    pd.testing.assert_frame_equal(as_frame(tables), expected)


def test_files_are_split_by_sorted_index_and_hidden_files_skipped(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".hidden").mkdir()
    paths = [tmp_path / f"f{i}.csv" for i in range(5)] + [tmp_path / "sub" / f"g{i}.csv" for i in range(2)]
    for i, path in enumerate(paths):
        write(frame(3, start=i * 3), path, "csv")
    for skipped in (tmp_path / "_SUCCESS", tmp_path / ".part-0-0.inprogress", tmp_path / ".hidden" / "x.csv"):
        write(frame(1, start=999), skipped, "csv")
    order = sorted(str(p) for p in paths)
    seen = {}
    for subtask in range(3):
        tables = Driven(FileSource.csv(tmp_path, schema=SCHEMA), subtask=subtask, parallelism=3).drain()
        for row in rows(tables):
            seen.setdefault(row["amount"] // 3 // 3, set()).add(subtask)  # which file the row came from
    # every file read by exactly one subtask: file i (in sorted order) by subtask i % 3
    assert seen == {i: {order.index(str(p)) % 3} for i, p in enumerate(paths)}


def test_glob_and_single_file(tmp_path):
    for name in ("a.csv", "b.csv", "c.txt", "_marker.csv"):
        write(frame(2), tmp_path / name, "csv")
    assert sum(t.num_rows for t in Driven(FileSource.csv(str(tmp_path / "*.csv"))).drain()) == 4
    assert sum(t.num_rows for t in Driven(FileSource.csv(tmp_path / "c.txt")).drain()) == 2
    # a file named explicitly is read even if its name looks hidden
    assert sum(t.num_rows for t in Driven(FileSource.csv(tmp_path / "_marker.csv")).drain()) == 2
    assert Driven(FileSource.csv(str(tmp_path / "*.none"))).drain() == []
    with pytest.raises(FileNotFoundError, match=f"{re.escape(WHERE)}: the path .*missing.* does not exist"):
        Driven(FileSource.csv(tmp_path / "missing"))


def test_csv_without_schema_has_string_columns_from_the_header(tmp_path):
    (tmp_path / "a.csv").write_text("b,a\n1,x\n2,\n")
    (table,) = Driven(FileSource.csv(tmp_path)).drain()
    assert table.schema == pa.schema([("b", pa.string()), ("a", pa.string())])
    assert table.to_pylist() == [{"b": "1", "a": "x"}, {"b": "2", "a": ""}]


def test_csv_semicolons_without_header_quoted_newlines_and_empty_values(tmp_path):
    (tmp_path / "a.csv").write_text('1;"two\nlines";2.5\n\n3;;\n')
    tables = Driven(FileSource.csv(tmp_path, schema={"n": "int64", "s": "string", "x": "double"},
                                   delimiter=";", header=False)).drain()
    assert rows(tables) == [{"n": 1, "s": "two\nlines", "x": 2.5}, {"n": 3, "s": "", "x": None}]


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_resume_from_any_position_loses_and_repeats_nothing(tmp_path, fmt):
    for i, n in enumerate((11, 0, 9, 13)):
        write(frame(n, start=i * 100), tmp_path / f"part{i}.{fmt}", fmt)
    if fmt == "csv":  # malformed records count as consumed too: they must not be reported twice
        with open(tmp_path / "part2.csv", "a") as f:
            f.write("u1,not a number,1.0,true,2024-01-01 00:00:00\n")
    connector = source(fmt, tmp_path, schema=SCHEMA, batch_size=4)
    whole = Driven(connector, side=True).drain()
    assert sum(t.num_rows for t in whole) == 33
    for cut in range(len(whole) + 1):
        before = Driven(connector, side=True)
        first = before.poll(cut)
        position = before.position()
        after = Driven(connector, side=True)
        after.op.restore_position(position)
        rest = after.drain()
        assert rows(first + rest) == rows(whole), f"resumed after {cut} batches"
        assert before.malformed().num_rows + after.malformed().num_rows == (fmt == "csv")
    end = after.position()
    assert end == {"pending": [], "offset": 0, "done": sorted(str(p) for p in tmp_path.iterdir()),
                   "schema": end["schema"]}


def test_malformed_csv_record_fails_naming_operator_file_line_and_reason(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("user,amount\nann,1\nbob,abc\n")
    driven = Driven(FileSource.csv(path, schema={"user": "string", "amount": "int64"}))
    with pytest.raises(MalformedInputError) as info:
        driven.drain()
    message = str(info.value)
    assert message.startswith(f"{WHERE}: malformed record in {path}, line 3: column 'amount': 'abc' is not a "
                              "valid int64")
    assert "the record: 'bob,abc'" in message and 'get_side_output(\'malformed\')' in message


def test_malformed_csv_records_go_to_the_side_output(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(b'user,amount\nann,1\nbob,abc\n"multi\nline",2\ncid\ndan,4,extra\n\xff\xfe,5\n"open,6\neve,7\n')
    driven = Driven(FileSource.csv(path, schema={"user": "string", "amount": "int64"}), side=True)
    assert rows(driven.drain()) == [{"user": "ann", "amount": 1}, {"user": "multi\nline", "amount": 2}]
    bad = driven.malformed().to_pylist()
    assert [(r["source"], r["position"], r["raw"]) for r in bad] == [
        (str(path), "3", "bob,abc"), (str(path), "6", "cid"), (str(path), "7", "dan,4,extra"),
        (str(path), "8", "\ufffd\ufffd,5"), (str(path), "9", '"open,6\neve,7')]
    assert [r["reason"].split(" (")[0] for r in bad] == [
        "column 'amount': 'abc' is not a valid int64", "expected 2 fields, got 1", "expected 2 fields, got 3",
        "not valid UTF-8 text", "expected 2 fields, got 1"]


def test_malformed_json_records_go_to_the_side_output(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"n": 1, "s": "a"}\n{"n": 1.5, "s": "b"}\n{"n": "2", "s": "c"}\n[1]\n{"n": 3\n'
                    '{"n": 4, "s": 5}\n{"s": "only s", "extra": true}\n')
    driven = Driven(FileSource.json_lines(path, schema={"n": "int64", "s": "string"}), side=True)
    assert rows(driven.drain()) == [{"n": 1, "s": "a"}, {"n": None, "s": "only s"}]
    bad = {r["position"]: r["reason"] for r in driven.malformed().to_pylist()}
    assert sorted(bad) == ["2", "3", "4", "5", "6"]
    assert bad["2"].startswith("column 'n': 1.5 is not a valid int64")  # never truncated to 1
    assert bad["3"].startswith("column 'n': '2' is not a valid int64 (expected int64, got a string)")
    assert bad["4"] == "not a JSON object but list"
    assert bad["5"].startswith("not valid JSON: ")
    assert bad["6"].startswith("column 's': 5 is not a valid string")


def test_json_without_schema_keeps_the_types_of_the_first_records_after_a_restore(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"n": 1, "t": "x"}\n{"n": 2, "t": "y"}\n{"n": "three", "t": "z"}\n')
    driven = Driven(FileSource.json_lines(tmp_path, batch_size=2), side=True)
    (first,) = driven.poll(1)
    assert first.schema == pa.schema([("n", pa.int64()), ("t", pa.string())])
    restored = Driven(FileSource.json_lines(tmp_path, batch_size=2), side=True)
    restored.op.restore_position(driven.position())
    assert restored.drain() == []
    (bad,) = restored.malformed().to_pylist()
    assert bad["position"] == "3" and bad["reason"].startswith("column 'n': 'three' is not a valid int64")


def test_parquet_schema_selects_and_casts_columns_or_fails_naming_the_file(tmp_path):
    pq.write_table(pa.table({"a": pa.array([1, 2], pa.int32()), "b": ["x", "y"]}), tmp_path / "p.parquet")
    (table,) = Driven(FileSource.parquet(tmp_path, schema={"a": "double"})).drain()
    assert table.schema == pa.schema([("a", pa.float64())]) and table.column("a").to_pylist() == [1.0, 2.0]
    with pytest.raises(MalformedInputError, match=rf"{re.escape(WHERE)}: .*p\.parquet has no column\(s\) \['c'\]"):
        Driven(FileSource.parquet(tmp_path, schema={"c": "int64"})).drain()
    with pytest.raises(MalformedInputError, match=rf"{re.escape(WHERE)}: .*p\.parquet does not fit the schema"):
        Driven(FileSource.parquet(tmp_path, schema={"b": "int64"})).drain()


def test_csv_header_missing_a_schema_column_fails(tmp_path):
    (tmp_path / "a.csv").write_text("user\nann\n")
    with pytest.raises(MalformedInputError, match=r"header of .*a\.csv has no column\(s\) \['amount'\]"):
        Driven(FileSource.csv(tmp_path, schema={"user": "string", "amount": "int64"})).drain()


def add_file(directory, name: str, df: pd.DataFrame) -> None:
    """As a writer should: under a hidden name, then renamed into place."""
    hidden = directory / f".{name}.tmp"
    write(df, hidden, "csv")
    os.rename(hidden, directory / name)


def test_watch_reads_new_files_once_and_idles_briefly(tmp_path):
    add_file(tmp_path, "a.csv", frame(5))
    connector = FileSource.csv(tmp_path, schema=SCHEMA, watch=True, monitor_interval=0.05)
    subtasks = [Driven(connector, subtask=i, parallelism=2) for i in range(2)]
    assert not subtasks[0].op.is_bounded

    def read_until(total: int, timeout: float = 10) -> list[dict]:
        got: list[dict] = []
        deadline = time.monotonic() + timeout
        while len(got) < total and time.monotonic() < deadline:
            for s in subtasks:
                table = s.op.poll()
                assert table is not None  # a watching source never ends
                got += table.to_pylist()
        return got

    def poll_idle(polls: int) -> list[dict]:
        """What ``polls`` more polls of each subtask read: an idle poll sleeps at most until the
        next scan is due, so every second poll of a subtask scans the directory again."""
        return [row for _ in range(polls) for s in subtasks for row in s.op.poll().to_pylist()]

    first = read_until(5)
    for i in range(1, 6):
        add_file(tmp_path, f"new{i}.csv", frame(5, start=i * 5))
    second = read_until(25)
    assert sorted(r["amount"] for r in first + second) == [i * 3 for i in range(30)]
    assert poll_idle(20) == []  # nothing read twice, though the directory was scanned ten times again
    # a restored subtask reads only files it has not finished
    position = subtasks[0].position()
    restored = Driven(connector, subtask=0, parallelism=2)
    restored.op.restore_position(position)
    add_file(tmp_path, "late.csv", frame(2, start=100))
    subtasks = [restored, subtasks[1]]
    assert sorted(r["amount"] for r in read_until(2)) == [300, 303]
