"""The live dashboard of one job: its components laid out in one widget, fed by one JobFeed.

Every update is applied on the kernel's main thread, all of its widget writes batched in
hold_sync(); the first update comes with the first answer of the JobManager.
"""
from __future__ import annotations

import time
from contextlib import ExitStack

import ipywidgets as widgets

from kernel_runtime.notebook.widgets.base import Component, Update
from kernel_runtime.notebook.widgets.charts import BackpressureView, ThroughputView
from kernel_runtime.notebook.widgets.checkpoints import CheckpointsView
from kernel_runtime.notebook.widgets.feed import JobFeed, Snapshot
from kernel_runtime.notebook.widgets.job_graph import JobGraphView
from kernel_runtime.notebook.widgets.metrics import JobMetrics
from kernel_runtime.notebook.widgets.progress import ProgressView
from kernel_runtime.notebook.widgets.result_table import ResultTableView
from kernel_runtime.notebook.widgets.slots import SlotsView
from kernel_runtime.notebook.widgets.sources import SourcesView
from kernel_runtime.notebook.widgets.status import StatusView
from kernel_runtime.notebook.widgets.watermarks import WatermarksView


class Dashboard:
    def __init__(self, handle, poll_interval: float = 0.3, rows: int = 10):
        self.handle = handle
        graph = handle.job_graph
        vertices = [(v.id, v.name) for v in graph.vertices] if graph is not None else []
        self.status = StatusView(handle.name, handle.job_id, handle.upgraded_from)
        self.progress = ProgressView(graph)
        self.slots = SlotsView(handle.job_id)
        self.graph = JobGraphView()
        self.backpressure = BackpressureView(vertices)
        self.throughput = ThroughputView(vertices)
        self.watermarks = WatermarksView()
        self.sources = SourcesView()
        self.checkpoints = CheckpointsView()
        self.results = None if handle.detached or not handle.sinks else ResultTableView(handle, rows)
        self.components: list[Component] = [c for c in (
            self.status, self.progress, self.slots, self.graph, self.backpressure, self.throughput,
            self.watermarks, self.sources, self.checkpoints, self.results) if c is not None]
        # each view of a row is a column of its own, however little it shows (after a cancel the
        # slots and the graph are small): their headings never run together on one line
        for view in (self.slots, self.graph):
            view.root.layout = widgets.Layout(flex="1 1 420px", min_width="420px", margin="0 16px 0 0")
        row = lambda *children: widgets.HBox(list(children), layout=widgets.Layout(flex_flow="row wrap"))
        self.root = widgets.VBox([
            self.status.root, self.progress.root, row(self.slots.root, self.graph.root),
            row(self.backpressure.root, self.throughput.root), self.watermarks.root, self.sources.root,
            self.checkpoints.root,
            *([self.results.root] if self.results else [])])
        self.root.add_class("streamlab-dashboard")
        self.metrics = JobMetrics()
        self.updates = 0
        self._started = time.monotonic()
        self.feed = JobFeed(handle.client.cluster, handle.job_id, self.apply, poll_interval).start()
        handle.wait_hooks.append(self.feed.pump)

    def apply(self, snapshot: Snapshot) -> None:
        stats = self.metrics.observe(snapshot.t, snapshot.details) if snapshot.details else []
        update = Update(snapshot, stats, snapshot.t - self._started)
        with ExitStack() as stack:
            for component in self.components:
                for widget in component.synced():
                    stack.enter_context(widget.hold_sync())
            for component in self.components:
                component.update(update)
        self.updates += 1

    def close(self) -> None:
        """Stop following the job (the views keep their last picture)."""
        self.feed.stop()

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.root._repr_mimebundle_()
