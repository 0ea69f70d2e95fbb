"""The live results of a job: per collect sink, what its rows are, a grid to sort, filter and chart
them, and files to save them as.

The grid is Perspective's viewer in the page (grid.py): it sorts by a header's click, filters,
groups and charts there. It holds the rows the client keeps (an append stream's newest
``--max-rows``, an upsert table's row per key), sent again when they change: at most one update a
second per dashboard (feed.py), a few hundred KB for 10,000 rows. It is made with the first rows,
whose columns the chart's choices list.

Thread use: the dashboard's main thread only (updates and the buttons' clicks alike).
"""
from __future__ import annotations

from typing import Optional

import ipywidgets as widgets
import pandas as pd
import pyarrow as pa

from cluster.graph.operator_kinds import HIDDEN_KEY_PREFIX
from cluster.protocol.serde import table_to_ipc

from kernel_runtime.client.result_receiver import ResultSummary
from kernel_runtime.client.results import APPEND, UPDATE
from kernel_runtime.notebook.widgets.base import FONT, Component, Update, esc, title
from kernel_runtime.notebook.widgets.downloads import FORMATS, download

ROW_PX = 24  # a grid row's height: the grid shows about ``rows`` rows before it scrolls
# the chart toggle: Perspective's plugin for each view
PLUGINS = {"table": "Datagrid", "line": "Y Line", "bar": "Y Bar"}


def describe(summary: ResultSummary) -> str:
    """What kind of table the rows make, in words (the note a reader needs before sorting them)."""
    if summary.kind == UPDATE:
        key = shown_key(summary)
        keyed = f"keyed by <b>{esc(', '.join(key))}</b>" if key else "keyed by columns it does not show"
        return (f'<span class="streamlab-result-kind" data-kind="update">an upsert table {keyed}: one row per key, '
                "updated in place</span>")
    if summary.kind == APPEND:
        kept = "every row kept" if summary.limit is None else f"the newest {summary.limit:,} kept"
        return (f'<span class="streamlab-result-kind" data-kind="append">an append stream: every row is a new '
                f"row ({kept})</span>")
    return '<span class="streamlab-result-kind" data-kind="single">the newest row only</span>'


def shown_key(summary: ResultSummary) -> list[str]:
    """The key columns the rows show: not those a SQL query grouped by without selecting them."""
    return [k for k in summary.key if not k.startswith(HIDDEN_KEY_PREFIX)]


def for_the_grid(frame: pd.DataFrame) -> bytes:
    """``frame`` as Arrow IPC bytes Perspective loads: what it cannot show as a column of its own
    (lists, maps, structs, durations) as text, rather than flattened or refused."""
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # an object column of mixed values
        table = pa.Table.from_pandas(frame.astype(str), preserve_index=False)
    columns = []
    for column in table.columns:
        kind = column.type
        if pa.types.is_nested(kind) or pa.types.is_duration(kind) or pa.types.is_interval(kind):
            column = pa.array([None if v is None else str(v) for v in column.to_pylist()], pa.string())
        columns.append(column)
    return table_to_ipc(pa.table(columns, names=table.column_names)).to_pybytes()


class SinkResults:
    """One collect sink's results: summary line, toolbar, grid."""

    def __init__(self, handle, sink: str, rows: int):
        self.handle, self.sink = handle, sink
        self.summary = widgets.HTML()
        self.summary.add_class("streamlab-results-summary")
        self.view = widgets.ToggleButtons(options=list(PLUGINS), value="table", tooltips=[
            "the rows as a grid: click a header to sort, open the settings to filter or group",
            "a line of the value column over the chosen column", "bars of the value column per chosen column"],
            style={"button_width": "56px"})
        self.over = widgets.Dropdown(description="over", layout=widgets.Layout(width="180px"),
                                     style={"description_width": "32px"})
        self.value = widgets.Dropdown(description="of", layout=widgets.Layout(width="180px"),
                                      style={"description_width": "20px"})
        self.saves = [widgets.Button(description=kind, tooltip=f"the rows kept, as a {kind} file",
                                     layout=widgets.Layout(width="72px")) for kind in FORMATS]
        self.link = widgets.HTML()
        self.link.add_class("streamlab-download-link")
        for button in self.saves:
            button.on_click(self._save)
        for control in (self.view, self.over, self.value):
            control.observe(self._chart, "value")
        self.toolbar = widgets.HBox([self.view, self.over, self.value, widgets.Label("save:"), *self.saves, self.link],
                                    layout=widgets.Layout(flex_flow="row wrap", align_items="center"))
        self.toolbar.layout.display = "none"  # until the first rows
        self.holder = widgets.Box(layout=widgets.Layout(height=f"{ROW_PX * (rows + 3)}px", width="100%"))
        self.holder.layout.display = "none"
        self.root = widgets.VBox([self.summary, self.toolbar, self.holder])
        # Perspective's widget, in the page from the start (hidden): its module (6 MB, WebAssembly
        # inside) loads while the job starts, not after the first rows (a loaded machine took the
        # whole of a ten-second job to show them)
        from kernel_runtime.notebook.widgets.grid import ResultsGrid
        self.grid = ResultsGrid(title=sink, layout=widgets.Layout(height="100%", width="100%"))
        self.grid.add_class("streamlab-results-grid")
        self.holder.children = [self.grid]
        self.filled = False  # the first rows came: the toolbar knows the columns, the grid shows
        self._shown: Optional[tuple[int, int]] = None  # (attempt, rows received) the grid holds

    # ---------------------------------------------------------------- updates
    def refresh(self) -> None:
        summary = self.handle.summary(self.sink, 0)
        counts = (f'<span class="streamlab-row-count" data-rows="{summary.received}">{summary.received:,} rows '
                  f"received</span>, {summary.kept:,} kept: {describe(summary)}")
        if summary.error:
            counts += f' <span style="color:#a50f15">{esc(summary.error)}</span>'
        text = f'{title(self.sink)}<div style="{FONT}">{counts}</div>'
        if text != self.summary.value:
            self.summary.value = text
        if summary.error or (summary.attempt, summary.received) == self._shown:
            return
        self._fill(summary)

    def _fill(self, summary: ResultSummary) -> None:
        self._shown = (summary.attempt, summary.received)
        rows = self.handle.to_pandas(self.sink)
        if not len(rows.columns):
            return
        if not self.filled:
            self._first_rows(rows, summary)
        self.grid.data = for_the_grid(rows)

    def _first_rows(self, rows: pd.DataFrame, summary: ResultSummary) -> None:
        columns = [str(c) for c in rows.columns]
        numeric = [str(c) for c in rows.columns if pd.api.types.is_numeric_dtype(rows[c])
                   and not pd.api.types.is_bool_dtype(rows[c])]
        self.over.options = columns  # before the grid is set: the chart toggle's observer waits for it
        self.over.value = next((k for k in shown_key(summary) if k in columns), columns[0])
        self.value.options = numeric or columns
        self.value.value = (numeric or columns)[-1]
        self.filled = True
        self._chart()
        self.holder.layout.display = self.toolbar.layout.display = None

    # ---------------------------------------------------------------- the user's controls
    def _chart(self, _change=None) -> None:
        """The grid's settings as the toggle says: a table of every column, or a chart of the value
        column summed over the chosen one."""
        if not self.filled:
            return
        if self.view.value == "table":
            self.grid.config = dict(plugin=PLUGINS["table"], group_by=[], columns=list(self.over.options),
                                    aggregates={}, sort=[])
            return
        over, value = self.over.value, self.value.value
        self.grid.config = dict(plugin=PLUGINS[self.view.value], group_by=[over], columns=[value],
                                aggregates={value: "sum"}, sort=[[over, "asc"]])

    def _save(self, button: widgets.Button) -> None:
        frame = self.handle.to_pandas(self.sink)
        self.link.value = download(frame, self.sink, button.description).link()


class ResultTableView(Component):
    """The results of every collect sink of the job, one below the other."""

    def __init__(self, handle, rows: int = 10):
        self.sinks = [SinkResults(handle, sink, rows) for sink in handle.sinks]
        self.root = widgets.VBox([s.root for s in self.sinks])
        self.root.add_class("streamlab-results")

    def synced(self) -> list[widgets.Widget]:
        return [s.summary for s in self.sinks]

    def update(self, update: Update) -> None:
        for sink in self.sinks:
            sink.refresh()
