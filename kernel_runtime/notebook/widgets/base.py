"""What every dashboard component is, and the small HTML helpers they share.

A component owns its data source (what it derives from each update), its root view (the widget
the dashboard lays out) and ``update()``. An update that changes nothing sends nothing: HTML is
assigned only when it differs (traitlets send nothing for an equal value), charts stream only
new points.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Iterable

import ipywidgets as widgets

from kernel_runtime.notebook.widgets.feed import Snapshot
from kernel_runtime.notebook.widgets.metrics import VertexStats

FONT = "font-family:var(--jp-ui-font-family,sans-serif);font-size:12px"
STATE_COLORS = {"RUNNING": "#c7e9c0", "FINISHED": "#d9d9d9", "FAILED": "#fcbba1", "CANCELED": "#eeeeee",
                "CANCELING": "#eeeeee", "FAILING": "#fcbba1", "RESTARTING": "#fff7bc"}
WAITING_COLOR = "#fff7bc"  # CREATED, SCHEDULED, DEPLOYING, INITIALIZING
# Back pressure grades in the colours of Flink's job graph, where back-pressured is dark: a
# back-pressured operator waits for a busy one downstream, which is the one to look at (red there)
LEVEL_COLORS = {"OK": "#4292c6", "LOW": "#737373", "HIGH": "#252525"}


@dataclass(frozen=True)
class Update:
    """One snapshot of the job and what the dashboard derived from it."""

    snapshot: Snapshot
    stats: list[VertexStats]
    elapsed: float  # seconds since the dashboard started


class Component:
    root: widgets.Widget

    def synced(self) -> list[widgets.Widget]:
        """The widgets whose trait writes one update batches (hold_sync)."""
        return [self.root]

    def update(self, update: Update) -> None:
        raise NotImplementedError


class HTMLComponent(Component):
    """A component whose view is one HTML widget, rendered from each update."""

    css_class = ""

    def __init__(self):
        self.root = widgets.HTML()
        if self.css_class:
            self.root.add_class(self.css_class)

    def render(self, update: Update) -> str:
        raise NotImplementedError

    def update(self, update: Update) -> None:
        text = self.render(update)
        if text != self.root.value:
            self.root.value = text


def esc(value) -> str:
    return html.escape(str(value))


def state_color(state: str) -> str:
    return STATE_COLORS.get(state, WAITING_COLOR)


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], attrs: str = "") -> str:
    """An HTML table; the cells are HTML already (escape text with esc)."""
    cell = "padding:1px 8px;text-align:left;border-bottom:1px solid #e0e0e0"
    head = "".join(f'<th style="{cell}">{h}</th>' for h in headers)
    body = "".join("<tr>" + "".join(f'<td style="{cell}">{c}</td>' for c in row) + "</tr>" for row in rows)
    return f'<table {attrs} style="border-collapse:collapse;{FONT}"><tr>{head}</tr>{body}</table>'


def badge(level: str) -> str:
    color = LEVEL_COLORS.get(level, "#888")
    return (f'<span data-level="{esc(level)}" style="color:white;background:{color};border-radius:3px;'
            f'padding:0 4px;font-weight:600">{esc(level)}</span>')


def swatch(color: str) -> str:
    """A small square of the vertex's colour in the job graph, beside its name in a table."""
    return (f'<span class="streamlab-swatch" style="display:inline-block;width:9px;height:9px;margin-right:4px;'
            f'background:{color};border:1px solid #666"></span>')


def percent(share: float) -> str:
    return f"{share * 100:.0f}%"


def title(text: str) -> str:
    return f'<div style="{FONT};font-weight:600;margin:4px 0 2px">{esc(text)}</div>'
