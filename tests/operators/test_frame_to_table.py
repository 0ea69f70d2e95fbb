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
