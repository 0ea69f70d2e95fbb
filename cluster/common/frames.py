"""A user function's result as the Arrow table a task passes on: what operators return and what
the client's schema sampling computes alike (kernel_runtime.api.schema), so both live here.

A user function may return a pandas DataFrame, a dict of columns, or Arrow (a Table or a
RecordBatch); anything else is the user's mistake, said as a UserFunctionError naming where.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.common.failures import UserFunctionError


def frame_to_table(frame: "pd.DataFrame") -> pa.Table:
    """A pandas frame as an Arrow table (its index dropped), converted on the calling thread.

    A frame of plain numpy columns (bool, integers, floats, naive datetimes) with unique string
    names is taken column by column, NaN and NaT as nulls, as pyarrow's from_pandas takes it, and
    to the same types and values; only the schema's pandas metadata is left out, which holds
    nothing such columns need to come back to pandas the same. from_pandas builds that metadata
    and inspects every column for each call: 180-380 us against 30-50 for 2,200 rows of three columns,
    and in a TaskManager with a generator at 887k rows/s (400 frames a second) it took a third
    of a core, half of the process's CPU. Any other frame goes through from_pandas, on this thread:
    its default starts a pool of cpu_count threads for every frame of over 100 rows per column
    and joins it after, which cost more than the conversion."""
    columns = frame.columns
    if len(columns) and columns.is_unique and all(type(name) is str for name in columns):
        arrays = []
        for values in _column_arrays(frame):
            if not (isinstance(values, np.ndarray) and values.dtype.kind in _NUMPY_KINDS):
                break
            arrays.append(pa.array(values, from_pandas=values.dtype.kind in "fM"))
        else:
            return pa.Table.from_arrays(arrays, names=list(columns))
    return pa.Table.from_pandas(frame, preserve_index=False, nthreads=1)


def table_to_frame(table: pa.Table) -> "pd.DataFrame":
    """An Arrow table as the pandas frame ``table.to_pandas()`` gives it, on the calling thread.

    A table of numeric, boolean and string columns (``pandas_values``) with unique names and no
    pandas metadata (which may name an index to restore) is taken column by column: to_pandas
    reads the schema's metadata and plans its blocks for each call, 330 us for a table of three
    rows against 60 us, and a keyed task's pandas step of a slow stream spent most of its time
    there. Any other table goes through to_pandas."""
    names = table.column_names
    metadata = table.schema.metadata or {}
    if names and len(set(names)) == len(names) and b"pandas" not in metadata:
        columns = {}
        for name, column in zip(names, table.columns):
            values = pandas_values(column)
            if values is None:
                break
            columns[name] = values
        else:
            return pd.DataFrame(columns)  # copied, so writable, as to_pandas's columns are
    return table.to_pandas()


def pandas_values(column: pa.ChunkedArray) -> "np.ndarray | None":
    """The column's values as ``to_pandas`` holds them, where numpy's conversion gives the same
    array and dtype: strings as objects (nulls None), floats (nulls NaN), and integers and
    booleans without nulls. None for any other column: an integer with nulls is float in pandas,
    a timestamp's unit and a dictionary's categories are pandas' choice."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or kind in (pa.float32(), pa.float64()):
        return column.to_numpy()
    if (pa.types.is_integer(kind) or pa.types.is_boolean(kind)) and column.null_count == 0:
        return column.to_numpy()
    return None


def to_table(result, where: str) -> pa.Table:
    if isinstance(result, pa.Table):
        return result
    if isinstance(result, pa.RecordBatch):
        return pa.Table.from_batches([result])
    if isinstance(result, dict):
        result = pd.DataFrame(result)
    if isinstance(result, pd.DataFrame):
        return frame_to_table(result)
    raise UserFunctionError(f"{where} must return a pandas DataFrame, got {type(result).__name__}")


def _column_arrays(frame: "pd.DataFrame") -> list:
    """The frame's columns as pandas holds them (numpy arrays, or pandas' own arrays for other
    dtypes). Read from its block manager: the public way, frame.items(), builds a Series for every
    column, 30 us each here, more than the conversion; that way where a pandas has moved it."""
    try:
        return list(frame._mgr.column_arrays)
    except AttributeError:
        return [series.to_numpy() if isinstance(series.dtype, np.dtype) else series.array
                for _, series in frame.items()]


# numpy kinds whose arrays pyarrow takes as from_pandas would: bool, int, uint, float, datetime64
_NUMPY_KINDS = frozenset("biufM")
