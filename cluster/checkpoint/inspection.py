"""Looking into a running job's keyed state at a checkpoint (``JobHandle.state``, ``GET
/jobs/<id>/state``): Flink's State Processor API for a live job, where Flink dropped queryable state.

The JobManager owns the checkpoint storage, so it reads the operator's snapshot files of one
completed checkpoint (cluster.state.snapshot_format, the one format of every backend) and hands the
entries on undecoded, as Arrow IPC: values are pickles of the user's objects, which only the
user's process is sure to load. Whoever shows them decodes them with the format's codecs and pivots
them to one row per key and one column per state:

* a process function's ``value_state("x")`` is column ``x`` with its value, ``list_state("x")`` a
  Python list, ``map_state("x")`` a dict;
* ``count`` is the count; ``aggregate``'s partial sums and counts become the named aggregates the
  user asked for (``mean`` is sum / count);
* internal states (timers, named ``_...``) are not shown.

A consistent cut needs nothing more: a completed checkpoint's files are what every operator held
at the same barrier, and the sources' positions in the same ``_metadata`` say which input that is.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Optional

import pandas as pd
import pyarrow as pa

from cluster.checkpoint.storage import read_metadata
from cluster.graph.job_graph import OperatorSpec
from cluster.graph.operator_kinds import KINDS

from cluster.state.snapshot_format import KeyCodec, decode_key, decode_value, read_entries

ENTRIES = pa.schema([("state", pa.string()), ("key", pa.binary()), ("value", pa.binary())])
# a process function's state handles store under these prefixes (cluster.operators.keyed)
HANDLE_PREFIXES = {"v:": "value", "l:": "list", "m:": "map"}


class StateQueryError(ValueError):
    """A state query that cannot be answered (unknown operator, no checkpoint): says what to do."""


def keyed_state_operators(operators: Iterable[OperatorSpec]) -> list[OperatorSpec]:
    return [op for op in operators if KINDS[op.kind].keyed and KINDS[op.kind].stateful]


def find_operator(operators: list[OperatorSpec], wanted: str, job: str) -> OperatorSpec:
    """The operator named ``wanted`` (as the user named it) or with that uid, if it has keyed state."""
    stateful = keyed_state_operators(operators)
    listing = ", ".join(f"'{op.name}' (uid {op.uid})" for op in stateful) or "none"
    matches = [op for op in operators if op.uid == wanted] or [op for op in operators if op.name == wanted]
    if not matches:
        raise StateQueryError(f"job {job} has no operator named {wanted!r}; its operators with keyed state: {listing}")
    if len(matches) > 1:
        raise StateQueryError(f"job {job} has {len(matches)} operators named {wanted!r}: give the uid of one "
                              f"({', '.join(op.uid for op in matches)})")
    op = matches[0]
    if op not in stateful:
        raise StateQueryError(f"operator '{op.name}' of job {job} ({op.kind}) keeps no keyed state; "
                              f"its operators with keyed state: {listing}")
    return op


def operator_info(op: OperatorSpec) -> dict:
    """What a reader needs to pivot the entries: names, kind, key columns, named aggregations."""
    info = {"name": op.name, "uid": op.uid, "kind": op.kind, "key": list(op.params.get("key") or [])}
    if op.kind == "keyed-aggregate":
        info["aggregations"] = op.params["aggregations"]
    return info


def encode_key(key: Any) -> bytes:
    """A key as the snapshot files hold it (KeyCodec); numpy scalars and lists are accepted."""
    def native(value):
        item = getattr(value, "item", None)  # numpy scalars
        return item() if item is not None and not isinstance(value, (bytes, str)) else value
    if isinstance(key, (list, tuple)):
        key = tuple(native(v) for v in key)
        if len(key) == 1:
            key = key[0]
    return KeyCodec().encode(native(key))


def read_checkpoint_state(directory: Path, uid: str, key: Optional[bytes]) -> tuple[bytes, dict, int]:
    """(Storage executor.) The operator's entries of the checkpoint in ``directory`` as Arrow IPC
    bytes, each source operator's subtask positions at it (uid -> list, by subtask), and the
    checkpoint's id, all from the checkpoint's own ``_metadata``."""
    body = read_metadata(directory)
    entry = body["operators"].get(uid)
    files = [Path(directory) / h["keyed_file"] for h in (entry or {}).get("subtasks", []) if h.get("keyed_file")]
    states, keys, values = [], [], []
    if entry is not None:
        for state, encoded, value in read_entries(files, entry["max_parallelism"], key):
            states.append(state)
            keys.append(encoded)
            values.append(value)
    table = pa.table([pa.array(states, pa.string()), pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
                     schema=ENTRIES)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ENTRIES) as writer:
        writer.write_table(table)
    positions = {op_uid: sorted(({"subtask": h["subtask"], "parallelism": h["parallelism"], "position": h["position"]}
                                 for h in op["subtasks"]), key=lambda p: p["subtask"])
                 for op_uid, op in body["operators"].items()
                 if op["subtasks"] and all("position" in h for h in op["subtasks"])}
    return sink.getvalue().to_pybytes(), positions, body["checkpoint_id"]


def decode_entries(ipc: bytes, lenient: bool = False) -> list[tuple[str, Any, Any]]:
    """(state, key, value) decoded. ``lenient``: a value that cannot be unpickled here (a class of
    the user's that this process lacks) shows as a note instead of failing the whole answer."""
    table = pa.ipc.open_stream(ipc).read_all()
    out = []
    for state, key, value in zip(*(table.column(i).to_pylist() for i in range(3))):
        try:
            decoded = decode_value(value)
        except Exception as exc:
            if not lenient:
                raise
            decoded = f"<cannot be decoded here: {type(exc).__name__}: {exc}>"
        out.append((state, decode_key(key), decoded))
    return out


def _columns_of(state: str, value: Any, info: dict) -> dict[str, Any]:
    """The shown column(s) of one state entry; {} for internal ones."""
    if state.startswith("_"):
        return {}
    kind = HANDLE_PREFIXES.get(state[:2])
    if kind == "value":
        return {state[2:]: value}
    if kind == "list":
        return {state[2:]: list(value)}
    if kind == "map":
        return {state[2:]: dict(value)}
    if state == "partials" and info["kind"] == "keyed-aggregate":
        from cluster.operators.aggregates import partial_columns, value_of  # the operator's layout
        partial = {name: v for (name, _, _), v in zip(partial_columns(info["aggregations"]), value)}
        return {out: value_of(out, func, partial) for out, (_, func) in info["aggregations"].items()}
    if state == "kept" and info["kind"] == "keyed-deduplicate":  # the kept row, by its columns
        return {column: v for column, v in value.items() if column not in info["key"]}
    return {state: value}


def state_frame(entries: Iterable[tuple[str, Any, Any]], info: dict) -> pd.DataFrame:
    """One row per key (the key columns first, named as key_by named them), one column per state;
    a key without some state has None there. Rows sorted by key."""
    key_columns = info["key"]
    rows: dict[Any, dict[str, Any]] = {}
    columns: list[str] = []
    for state, key, value in entries:
        shown = _columns_of(state, value, info)
        if not shown:
            continue
        row = rows.setdefault(key, {})
        for name, v in shown.items():
            if name not in columns:
                columns.append(name)
            row[name] = v
    try:
        keys = sorted(rows)
    except TypeError:  # keys of several types
        keys = sorted(rows, key=repr)
    records = []
    for key in keys:
        parts = key if len(key_columns) > 1 else (key,)
        records.append(dict(zip(key_columns, parts)) | {c: rows[key].get(c) for c in sorted(columns)})
    return pd.DataFrame(records, columns=[*key_columns, *sorted(columns)])


def jsonable(value: Any) -> Any:
    """A value for a JSON answer: numbers, strings, lists and string-keyed maps as they are,
    anything else as its repr."""
    item = getattr(value, "item", None)
    if item is not None and not isinstance(value, (bytes, str)) and getattr(value, "ndim", 1) == 0:
        value = item()  # numpy scalars
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(jsonable(k)): jsonable(v) for k, v in value.items()}
    return repr(value)


def json_rows(frame: pd.DataFrame) -> tuple[list[str], list[list]]:
    return list(frame.columns), [[jsonable(v) for v in row] for row in frame.itertuples(index=False, name=None)]
