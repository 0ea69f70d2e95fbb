"""frame_to_table: a user function's pandas frame as the Arrow table that pyarrow's from_pandas makes."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from cluster.common import frames
from cluster.common.frames import frame_to_table

FRAMES = {
    "numeric, NaN, NaT": pd.DataFrame({
        "f": [1.0, np.nan, 3.0], "t": pd.to_datetime(["2020-01-01", None, "2021-01-01"]),
        "b": [True, False, True], "u": np.array([1, 2, 3], dtype=np.uint8), "i": [1, 2, 3],
        "f32": np.array([1.5, np.nan, 0.0], dtype=np.float32)}),
    "microseconds": pd.DataFrame({"t": np.array(["2020-01-01", "NaT"], dtype="datetime64[us]")}),
    "one 2-d block, Fortran order": pd.DataFrame(np.asfortranarray(np.arange(12.).reshape(4, 3)),
                                                 columns=["a", "b", "c"]),
    "strided rows, an index of its own": pd.DataFrame({"a": np.arange(10), "b": np.arange(10.)}).iloc[2:8:2],
    "time zone": pd.DataFrame({"t": pd.to_datetime(["2020-01-01", None]).tz_localize("Europe/Paris")}),
    "nullable and strings": pd.DataFrame({"i": pd.array([1, None, 3], dtype="Int64"), "s": ["a", None, "c"]}),
    "categorical": pd.DataFrame({"c": pd.Categorical(["x", "y", "x"])}),
    "integer column names": pd.DataFrame({0: [1, 2], 1: [0.5, np.nan]}),
    "no columns": pd.DataFrame(index=range(3)),
}


def _items(frame: pd.DataFrame) -> list:
    # what _column_arrays falls back to where a pandas has no frame._mgr.column_arrays
    return [series.to_numpy() if isinstance(series.dtype, np.dtype) else series.array for _, series in frame.items()]


@pytest.mark.parametrize("columns_from", ["block manager", "items"])
@pytest.mark.parametrize("name", list(FRAMES))
def test_the_table_is_from_pandas_own_without_its_index(name, columns_from, monkeypatch):
    if columns_from == "items":
        monkeypatch.setattr(frames, "_column_arrays", _items)
    frame = FRAMES[name]
    expected = pa.Table.from_pandas(frame, preserve_index=False)
    table = frame_to_table(frame)
    assert table.equals(expected)  # types, values and nulls (schema metadata aside)
    assert table.to_pandas().equals(expected.to_pandas())


def test_plain_numpy_columns_skip_pandas_metadata_and_others_keep_it():
    assert frame_to_table(FRAMES["numeric, NaN, NaT"]).schema.metadata is None
    assert b"pandas" in frame_to_table(FRAMES["categorical"]).schema.metadata  # its categories come back


def test_duplicate_column_names_are_refused_as_pyarrow_refuses_them():
    with pytest.raises(ValueError, match="Duplicate column names"):
        frame_to_table(pd.DataFrame([[1, 2]], columns=["a", "a"]))


def _tables() -> dict[str, pa.Table]:
    """Tables as tasks meet them: from frames (with and without pandas metadata), of two chunks,
    and of every Arrow type a source or Spark gives."""
    tables = {name: frame_to_table(frame) for name, frame in FRAMES.items() if len(frame.columns)}
    n = 7
    tables["every type, nulls"] = pa.table({
        "i64": pa.array(range(n), pa.int64()), "i8": pa.array(range(n), pa.int8()),
        "u32": pa.array(range(n), pa.uint32()), "i with null": pa.array([None, *range(n - 1)], pa.int64()),
        "b": pa.array([i % 2 == 0 for i in range(n)]), "b with null": pa.array([None, *([True] * (n - 1))]),
        "f64": pa.array([None, *(i / 2 for i in range(n - 1))]), "f32": pa.array([0.5] * n, pa.float32()),
        "f16": pa.array(np.ones(n, dtype=np.float16)), "s": pa.array([None, *map(str, range(n - 1))]),
        "ls": pa.array(["x"] * n, pa.large_string()), "ts": pa.array(range(n), pa.timestamp("ms")),
        "d": pa.array(["a", "b"] * 3 + ["a"]).dictionary_encode(), "date": pa.array(range(n), pa.date32())})
    chunked = tables["every type, nulls"]
    tables["two chunks"] = pa.concat_tables([chunked.slice(0, 3), chunked.slice(3)])
    tables["no rows"] = chunked.slice(0, 0)
    tables["strings and numbers only"] = chunked.select(["i64", "u32", "b", "f64", "f32", "s", "ls"])
    tables |= {f"only {name}": tables["two chunks"].select([name]) for name in chunked.column_names}
    return tables


@pytest.mark.parametrize("name", list(_tables()))
def test_a_table_becomes_the_frame_to_pandas_makes(name):
    table = _tables()[name]
    expected, frame = table.to_pandas(), frames.table_to_frame(table)
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    for column in frame.columns:  # a user's function may change its frame in place
        assert frame[column].to_numpy().flags.writeable or frame[column].dtype == object
