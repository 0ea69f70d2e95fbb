"""Arrow IPC: how a batch crosses a process boundary (TM to TM, TM to client)."""
from __future__ import annotations

import pyarrow as pa


def table_to_ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def ipc_to_table(data) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
