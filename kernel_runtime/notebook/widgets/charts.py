"""The views over time: back-pressure per vertex (graded as Flink grades it) and throughput
(records/s in and out per vertex). Each is a Bokeh chart, streamed one point per update, over
a table of the current values."""
from __future__ import annotations

from typing import Optional

import ipywidgets as widgets
from bokeh.models import ColumnDataSource, Range1d
# bokeh.models' type stub does not list these
from bokeh.models.annotations import BoxAnnotation, Legend, LegendItem
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from jupyter_bokeh import BokehModel

from cluster.protocol.states import JobState
from kernel_runtime.notebook.widgets.base import LEVEL_COLORS, Component, Update, badge, esc, percent, swatch, table
from kernel_runtime.notebook.widgets.metrics import VertexStats, bottleneck

ROLLOVER = 600  # points kept per chart: a few minutes at a few updates a second
LEGEND_ROW_PX = 16  # the figure grows by a row of legend per two series


class TimeSeries:
    """A Bokeh line chart over time, one line per series; new points are streamed."""

    def __init__(self, title: str, y_label: str, series: list[tuple[str, str, int, str]], **figure_args):
        """series: (column, legend label, color index, dash)."""
        self.columns = [column for column, _, _, _ in series]
        self.source = ColumnDataSource({"t": [], **{c: [] for c in self.columns}})
        # the legend goes below the plot area, never over the lines: two columns of labels
        legend_rows = (len(series) + 1) // 2
        fig = figure(title=title, width=400, height=200 + LEGEND_ROW_PX * legend_rows, tools="",
                     toolbar_location=None, x_axis_label="seconds", y_axis_label=y_label, **figure_args)
        items = []
        for column, label, color, dash in series:
            line = fig.line("t", column, source=self.source, line_width=2, line_dash=dash,
                            color=Category10_10[color % 10])
            # bokeh's stubs type a GlyphRenderer invariant in its glyph and padding by its descriptor
            items.append(LegendItem(label=label[:30], renderers=[line]))  # type: ignore[list-item]
        legend = Legend(items=items, ncols=2, label_text_font_size="9px", spacing=8, padding=2,  # type: ignore[arg-type]
                        margin=0, border_line_alpha=0, label_height=12, glyph_height=12)
        fig.add_layout(legend, "below")
        self.figure = fig
        self.widget = BokehModel(fig)
        self._last_t: Optional[float] = None

    def add(self, t: float, values: dict[str, float]) -> None:
        if t == self._last_t:
            return
        self._last_t = t
        self.source.stream({"t": [round(t, 2)], **{c: [values.get(c, 0.0)] for c in self.columns}},
                           rollover=ROLLOVER)


def _series_key(index: int, suffix: str = "") -> str:
    return f"v{index}{suffix}"


class _ChartWithTable(Component):
    def __init__(self, chart: TimeSeries, vertices: list[tuple[str, str]], css_class: str):
        self.vertices = vertices
        self.chart = chart
        self.table = widgets.HTML()
        # two side by side where the notebook is wide enough, else one under the other
        self.root = widgets.VBox([chart.widget, self.table], layout=widgets.Layout(flex="1 1 400px", max_width="520px"))
        self.root.add_class(css_class)

    def synced(self) -> list[widgets.Widget]:
        return [self.table, self.chart.widget]

    def _chart_or_totals(self, update: Update) -> None:
        """A job that ended before its chart had two points (shorter than a second or two) would
        leave empty axes from -1 to 1 above its table: the table of its totals shows alone."""
        points = len(self.chart.source.data["t"])
        display = "none" if update.snapshot.state in JobState.GLOBALLY_TERMINAL and points < 2 else None
        if self.chart.widget.layout.display != display:
            self.chart.widget.layout.display = display

    def _set_table(self, text: str) -> None:
        if text != self.table.value:
            self.table.value = text

    def _by_vertex(self, update: Update) -> list[tuple[int, VertexStats]]:
        stats = {s.vertex_id: s for s in update.stats}
        return [(i, stats[vid]) for i, (vid, _) in enumerate(self.vertices) if vid in stats]


BOTTLENECK_MARK = (' <span data-bottleneck="1" style="color:#cb181d;font-weight:600" '
                   'title="busy most of the time and not back-pressured: what holds the job back">bottleneck</span>')


class BackpressureView(_ChartWithTable):
    """Back-pressured share of time per vertex (its most back-pressured subtask), over time,
    with Flink's bands: OK up to 10 %, LOW up to 50 %, HIGH above."""

    def __init__(self, vertices: list[tuple[str, str]]):
        chart = TimeSeries("Back pressure (max over subtasks)", "back-pressured share",
                           [(_series_key(i), name, i, "solid") for i, (_, name) in enumerate(vertices)],
                           y_range=Range1d(start=0, end=1.05))
        for (bottom, top), color in zip(((0, 0.10), (0.10, 0.5), (0.5, 1.05)), LEVEL_COLORS.values()):
            chart.figure.add_layout(BoxAnnotation(bottom=bottom, top=top, fill_color=color, fill_alpha=0.07))
        super().__init__(chart, vertices, "streamlab-backpressure")

    def update(self, update: Update) -> None:
        rows = self._by_vertex(update)
        self.chart.add(update.elapsed, {_series_key(i): s.backpressured for i, s in rows})
        self._chart_or_totals(update)
        slowest = bottleneck([s for _, s in rows])
        self._set_table(table(
            ["vertex", "busy", "back-pressured", "idle", "level"],
            [[swatch(s.load_color) + esc(s.name) + (BOTTLENECK_MARK if s.vertex_id == slowest else ""),
              percent(s.busy), percent(s.backpressured), percent(s.idle), badge(s.level)] for _, s in rows]))


DELIVERED = (' <span class="streamlab-delivered" title="of them, rows its sinks delivered out of the job '
             '(Flink\'s numRecordsSend)" style="color:#666">delivered</span>')


class ThroughputView(_ChartWithTable):
    """Records per second out of (solid) and into (dashed) each vertex, and the totals. A sink's
    vertex counts what it delivered as out (records-sent), as Flink counts a sink's records out."""

    def __init__(self, vertices: list[tuple[str, str]]):
        series = []
        for i, (_, name) in enumerate(vertices):
            series += [(_series_key(i, "out"), f"{name} out", i, "solid"),
                       (_series_key(i, "in"), f"{name} in", i, "dashed")]
        super().__init__(TimeSeries("Throughput", "records/s", series), vertices, "streamlab-throughput")

    def update(self, update: Update) -> None:
        rows = self._by_vertex(update)
        values = {}
        for i, s in rows:
            values[_series_key(i, "out")] = s.out_rate
            values[_series_key(i, "in")] = s.in_rate
        self.chart.add(update.elapsed, values)
        self._chart_or_totals(update)
        self._set_table(table(
            ["vertex", "records in", "records out", "in/s", "out/s"],
            [[esc(s.name), f"{s.records_in:,}", f"{s.records_out:,}" + (DELIVERED if s.records_sent else ""),
              f"{s.in_rate:,.0f}", f"{s.out_rate:,.0f}"] for _, s in rows],
            attrs='class="streamlab-records"'))
