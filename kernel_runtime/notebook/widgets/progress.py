"""Progress of the sources: rows taken in, against the rows they will take in all when known."""
from __future__ import annotations

import ipywidgets as widgets

from kernel_runtime.notebook.widgets.base import Component, Update, esc
from kernel_runtime.notebook.widgets.metrics import source_progress


class ProgressView(Component):
    def __init__(self, job_graph):
        self.job_graph = job_graph
        self.bar = widgets.FloatProgress(min=0.0, max=1.0, description="sources", bar_style="info")
        self.label = widgets.HTML()
        self.root = widgets.HBox([self.bar, self.label])
        self.root.add_class("streamlab-progress")

    def synced(self) -> list[widgets.Widget]:
        return [self.bar, self.label]

    def update(self, update: Update) -> None:
        progress = source_progress(self.job_graph, update.stats)
        if progress is None:
            return
        done, total, bounded = progress
        if total is None:
            self.bar.layout.display = "none"
            text = f"{done:,} rows so far ({'bounded' if bounded else 'unbounded'} source)"
        else:
            self.bar.value = min(1.0, done / total) if total else 1.0
            if update.snapshot.state == "FINISHED":
                self.bar.bar_style = "success"
            text = f"{done:,} of {total:,} rows from the sources ({self.bar.value:.0%})"
        text = f'<span class="streamlab-source-rows" data-rows="{done}">{esc(text)}</span>'
        if text != self.label.value:
            self.label.value = text
