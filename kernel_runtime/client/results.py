"""Result modes: what the client keeps of the rows a collect sink streams back.

As Zeppelin's Flink interpreter offers them:

* ``append``: every row is new; the client keeps the last ``max_rows`` of them and the total
  count, so an unbounded job never exhausts the kernel's memory.
* ``update``: rows upsert by key; a running keyed aggregation shows the current value per key,
  not every update. Keys appear in the order they were first seen.
* ``single``: one row, replaced by each new one (a running total).

Without an explicit mode the pipeline decides, in scripts and notebooks alike: a keyed aggregation
feeding the collect sink gives ``update`` (keyed by the aggregation's key: the table per key, as
Flink's Table API shows an upsert stream), anything else ``append``, and so does a sink after
``DataStream.changelog()`` (every update row, as Flink's toChangelogStream). The buffers are plain
classes (no sockets, no threads); the ResultReceiver calls them under its lock.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

import pandas as pd
import pyarrow as pa

from cluster.graph.job_graph import JobGraph
from cluster.graph.operator_kinds import HIDDEN_KEY_PREFIX, ROW_KIND_COLUMN, upsert_key as upsert_key_of

APPEND, UPDATE, SINGLE = "append", "update", "single"
MODES = (APPEND, UPDATE, SINGLE)
DEFAULT_MAX_ROWS = 10_000
_ORDER = "__first_seen__"


def _concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="default")


class ResultBuffer:
    """The rows of one collect sink as the client keeps them."""

    mode = ""

    def __init__(self, max_rows: Optional[int]):
        if max_rows is not None and (not isinstance(max_rows, int) or max_rows < 1):
            raise ValueError(f"max_rows must be a positive integer or None, got {max_rows!r}")
        self.max_rows = max_rows
        self.total = 0  # rows received, kept or not

    def fresh(self) -> "ResultBuffer":
        """An empty buffer of the same kind."""
        raise NotImplementedError

    def restored(self, checkpoint: int) -> "ResultBuffer":
        """The buffer for a new attempt of the job that restored ``checkpoint`` (0: none, a
        restart from scratch, whose rows void all earlier ones)."""
        return self.fresh() if checkpoint == 0 else self._keep_before(checkpoint)

    def _keep_before(self, epoch: int) -> "ResultBuffer":
        # a latest-value view converges as the replay re-emits the values it recomputes
        return self

    def add(self, table: pa.Table, epoch: int = 0) -> None:
        """Rows of one batch; epoch: the last checkpoint barrier the sink passed before them."""
        raise NotImplementedError

    def frame(self) -> pd.DataFrame:
        raise NotImplementedError

    def preview(self, n: int) -> pd.DataFrame:
        """At most n rows to show: the newest ones."""
        return self.frame().tail(n).reset_index(drop=True)

    def __len__(self) -> int:
        raise NotImplementedError

    def describe(self) -> str:
        return self.mode


class AppendBuffer(ResultBuffer):
    """The last ``max_rows`` rows (all of them with max_rows=None) and the count of all."""

    mode = APPEND

    def __init__(self, max_rows: Optional[int] = DEFAULT_MAX_ROWS):
        super().__init__(max_rows)
        self._tables: deque[tuple[int, pa.Table]] = deque()  # (epoch, rows)
        self._kept = 0
        self._received: dict[int, int] = {}  # epoch -> rows received, kept or not

    def fresh(self) -> "AppendBuffer":
        return AppendBuffer(self.max_rows)

    def _keep_before(self, epoch: int) -> "AppendBuffer":
        kept = self.fresh()
        for table_epoch, table in self._tables:
            if table_epoch < epoch:
                kept._tables.append((table_epoch, table))
                kept._kept += table.num_rows
        kept._received = {e: n for e, n in self._received.items() if e < epoch}
        kept.total = sum(kept._received.values())
        return kept

    def add(self, table: pa.Table, epoch: int = 0) -> None:
        if table.num_rows == 0:
            return
        self._tables.append((epoch, table))
        self._kept += table.num_rows
        self._received[epoch] = self._received.get(epoch, 0) + table.num_rows
        self.total += table.num_rows
        if self.max_rows is None:
            return
        while self._kept - self._tables[0][1].num_rows >= self.max_rows:
            self._kept -= self._tables.popleft()[1].num_rows
        excess = self._kept - self.max_rows
        if excess > 0:
            first_epoch, first = self._tables[0]
            self._tables[0] = (first_epoch, first.slice(excess))
            self._kept -= excess

    def frame(self) -> pd.DataFrame:
        return _concat([t for _, t in self._tables]).to_pandas() if self._tables else pd.DataFrame()

    def preview(self, n: int) -> pd.DataFrame:
        picked, rows = [], 0
        for _, table in reversed(self._tables):  # only the tables the tail needs
            if rows >= n:
                break
            picked.append(table)
            rows += table.num_rows
        if not picked:
            return pd.DataFrame()
        table = _concat(picked[::-1])
        return table.slice(max(0, table.num_rows - n)).to_pandas()

    def __len__(self) -> int:
        return self._kept


class UpsertBuffer(ResultBuffer):
    """The latest row per key. With ``max_rows`` it keeps that many keys, dropping the ones
    updated longest ago (counted in ``evicted``), so an unbounded key space stays bounded too."""

    mode = UPDATE

    def __init__(self, key: list[str], max_rows: Optional[int] = DEFAULT_MAX_ROWS):
        super().__init__(max_rows)
        if not key:
            raise ValueError("update mode needs key columns")
        self.key = list(key)
        self._current: Optional[pd.DataFrame] = None  # one row per key, in first-seen order
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.evicted = 0

    def fresh(self) -> "UpsertBuffer":
        return UpsertBuffer(self.key, self.max_rows)

    def add(self, table: pa.Table, epoch: int = 0) -> None:
        if table.num_rows == 0:
            return
        missing = [k for k in self.key if k not in table.column_names]
        if missing:
            raise KeyError(f"update mode by {self.key}: the rows have no column(s) {missing} "
                           f"(columns: {table.column_names})")
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.total += table.num_rows
        # a merge costs about the size of what is held: merge when the pending rows match it
        if self._pending_rows >= max(1_000, 0 if self._current is None else len(self._current)):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        new = _concat(self._pending).to_pandas()
        self._pending, self._pending_rows = [], 0
        combined = new if self._current is None else pd.concat([self._current, new], ignore_index=True)
        # groups are numbered in order of first appearance, and the held keys come first
        order = combined.groupby(self.key, sort=False, dropna=False).ngroup()
        latest = combined.assign(**{_ORDER: order}).drop_duplicates(self.key, keep="last")
        if ROW_KIND_COLUMN in latest.columns:  # a key whose latest row deletes it is gone
            latest = latest[latest[ROW_KIND_COLUMN] != "-D"].drop(columns=[ROW_KIND_COLUMN])
        if self.max_rows is not None and len(latest) > self.max_rows:
            self.evicted += len(latest) - self.max_rows
            latest = latest.iloc[len(latest) - self.max_rows:]  # the keys updated most recently
        self._current = latest.sort_values(_ORDER, kind="stable").drop(columns=_ORDER).reset_index(drop=True)

    def frame(self) -> pd.DataFrame:
        self._merge()
        if self._current is None:
            return pd.DataFrame()
        return self._current.drop(columns=[c for c in self._current.columns if str(c).startswith(HIDDEN_KEY_PREFIX)])

    def preview(self, n: int) -> pd.DataFrame:
        """The first n keys (in the order they were first seen): a table whose rows stay put."""
        return self.frame().head(n)

    def __len__(self) -> int:
        self._merge()
        return 0 if self._current is None else len(self._current)

    def describe(self) -> str:
        return f"update by {', '.join(self.key)}"


class SingleRowBuffer(ResultBuffer):
    """Only the newest row."""

    mode = SINGLE

    def __init__(self):
        super().__init__(1)
        self._last: Optional[pa.Table] = None

    def fresh(self) -> "SingleRowBuffer":
        return SingleRowBuffer()

    def add(self, table: pa.Table, epoch: int = 0) -> None:
        if table.num_rows:
            self._last = table.slice(table.num_rows - 1)
            self.total += table.num_rows

    def frame(self) -> pd.DataFrame:
        return self._last.to_pandas() if self._last is not None else pd.DataFrame()

    def __len__(self) -> int:
        return 0 if self._last is None else 1


# --------------------------------------------------------------------------- choosing a mode
# operators that keep an upsert stream's rows as they are, or drop some: what comes out is still
# keyed as it came in (Flink's upsert stream through a WHERE), so the sink's rows upsert by that key
_KEY_KEEPING = frozenset({"filter"})


def upsert_key(graph: JobGraph, sink_uid: str) -> Optional[list[str]]:
    """The key of the running keyed aggregation feeding this collect sink, directly or through
    filters, if one does and the sink does not collect its changelog; whatever else feeds the
    sink is an append stream."""
    vertex = next((v for v in graph.vertices if sink_uid in [o.uid for o in v.operators]), None)
    if vertex is None:
        raise KeyError(f"the job graph has no operator {sink_uid}")
    index = [o.uid for o in vertex.operators].index(sink_uid)
    if vertex.operators[index].params.get("changelog"):
        return None
    while True:
        if index > 0:
            index -= 1
        else:
            inputs = graph.inputs_of(vertex.id)
            if len(inputs) != 1 or inputs[0][1].side_output is not None:
                return None
            vertex = graph.vertex(inputs[0][1].source)
            index = len(vertex.operators) - 1
        upstream = vertex.operators[index]
        if upstream.kind not in _KEY_KEEPING:
            return upsert_key_of(upstream.kind, upstream.params)


@dataclass(frozen=True)
class ResultMode:
    """What the client keeps of collected rows: a mode (None: the pipeline decides) and a limit
    (None: every row, as a script that waits for a bounded job wants)."""

    mode: Optional[str] = None
    max_rows: Optional[int] = DEFAULT_MAX_ROWS

    def __post_init__(self):
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"unknown result mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.max_rows is not None and (not isinstance(self.max_rows, int) or isinstance(self.max_rows, bool)
                                          or self.max_rows < 1):
            raise ValueError(f"max_rows must be a positive integer, got {self.max_rows!r}")

    def buffer_for(self, graph: JobGraph, sink_uid: str, sink_name: str = "") -> ResultBuffer:
        key = upsert_key(graph, sink_uid)
        mode = self.mode or (UPDATE if key else APPEND)
        if mode == UPDATE:
            if not key:
                raise ValueError(
                    f"collect sink {sink_name or sink_uid!r}: update mode needs a keyed aggregation right "
                    "before the sink (e.g. .key_by('user').count().collect()), not its .changelog(); "
                    "use append or single")
            return UpsertBuffer(key, self.max_rows)
        if mode == SINGLE:
            return SingleRowBuffer()
        return AppendBuffer(self.max_rows)


# what a script waiting for a bounded job wants: the stream's own mode and no limit, so every row
# of an append stream and the final row of every key of an upsert stream
KEEP_ALL = ResultMode(None, None)
