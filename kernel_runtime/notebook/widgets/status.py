"""The dashboard's header: the job, its state, how long it runs, why it waits or how it failed,
and why a later attempt runs (the failure it restarted after, the checkpoint it restored).

A failing, failed or restarting job's header names the root cause in one line (cluster.common.failures:
the user's exception, the operator, the cell line); below it, smaller, which task failed and
whether the job restarts, and the user's traceback one click away (a <details>). The cause has a
widget of its own, written only when the cause changes, so an opened traceback stays open while
the header's clock goes on.
"""
from __future__ import annotations

import time
from typing import Optional

import ipywidgets as widgets

from cluster.common.failures import Failure
from cluster.graph.event_time import duration_text
from cluster.protocol.states import JobState

from kernel_runtime.notebook.widgets.base import FONT, Component, Update, esc, state_color

CAUSE_COLOR = "#a50f15"
REASON_COLOR = "#555"


def restart_note(details: dict, state: str) -> str:
    """Why a later attempt runs: "restarted 12:01:03 after TaskManager tm-1 lost: no heartbeat for
    2.0 s; restored checkpoint 7". "" for a first attempt, and while the job fails (the cause
    line says why)."""
    last = details.get("last-failure")
    if int(details.get("attempt") or 1) < 2 or not last or state in JobState.FAILURE:
        return ""
    when = time.strftime(" %H:%M:%S", time.localtime(last["timestamp"] / 1000)) if last.get("timestamp") else ""
    restored = ((details.get("checkpoints") or {}).get("latest") or {}).get("restored")
    if restored:
        start = f"restored {'savepoint' if restored.get('is_savepoint') else 'checkpoint'} {restored['id']}"
    else:
        start = "no checkpoint to restore: it started from the beginning"
    return f"restarted{when} after {Failure.parse(last['cause']).headline}; {start}"


def _ms(value: float) -> str:
    return duration_text(int(round(value)))


class StatusView(Component):
    def __init__(self, name: str, job_id: str, upgraded_from: Optional[str] = None):
        self.name, self.job_id, self.upgraded_from = name, job_id, upgraded_from
        self.header = widgets.HTML()
        self.header.add_class("streamlab-status")
        self.cause = widgets.HTML()
        self.cause.add_class("streamlab-failure")
        self.root = widgets.VBox([self.header, self.cause])

    def synced(self) -> list[widgets.Widget]:
        return [self.header, self.cause]

    def update(self, update: Update) -> None:
        header, cause = self.render(update)
        for widget, text in ((self.header, header), (self.cause, cause)):
            if text != widget.value:
                widget.value = text

    def render(self, update: Update) -> tuple[str, str]:
        """(the header's HTML, the failure's notes and traceback as HTML, "" when none)."""
        snapshot = update.snapshot
        details = snapshot.details
        state = snapshot.state or "UNKNOWN"
        parts = [f"<b>Job {esc(repr(self.name))}</b>", f"<code>{esc(self.job_id)}</code>",
                 f'<span class="streamlab-state" data-state="{esc(state)}" style="background:{state_color(state)};'
                 f'padding:0 6px;border-radius:3px">{esc(state)}</span>']
        if details.get("duration", -1) >= 0:  # since the job's start, over all its attempts
            parts.append(f"{details['duration'] / 1000:.1f} s")
        if self.upgraded_from:
            parts.append(f'<span class="streamlab-upgraded" style="color:{REASON_COLOR}">upgraded from savepoint '
                         f'<code>{esc(self.upgraded_from)}</code></span>')
        if details.get("attempt"):
            parts.append(f'<span class="streamlab-attempt" data-attempt="{int(details["attempt"])}">'
                         f'attempt {int(details["attempt"])}</span>')
        latency = details.get("latency") or {}
        if state == JobState.RUNNING and latency.get("p50") is not None:  # ingestion to sink, last seconds
            lag = latency.get("event-time-lag")
            parts.append(f'<span class="streamlab-latency" data-p50="{latency["p50"]}" data-p90="{latency["p90"]}" '
                         f'data-p99="{latency["p99"]}" title="end to end, from ingestion to the sink, rows of the '
                         f'last 5-10 s">latency p50 {_ms(latency["p50"])}, p90 {_ms(latency["p90"])}, '
                         f'p99 {_ms(latency["p99"])}</span>'
                         + ("" if lag is None else f' &middot; <span class="streamlab-event-time-lag" '
                            f'data-p50="{lag["p50"]}" data-p99="{lag["p99"]}">event time {_ms(lag["p50"])} behind '
                            f'(p99 {_ms(lag["p99"])})</span>'))
        restart = restart_note(details, state)
        if restart:
            parts.append(f'<span class="streamlab-restart" style="color:{REASON_COLOR}">{esc(restart)}</span>')
        failure = Failure.parse(details["failure-cause"]) \
            if details.get("failure-cause") and state in JobState.FAILURE else None
        alarm = failure.headline if failure else snapshot.error
        if alarm:
            parts.append(f'<span class="streamlab-cause" style="color:{CAUSE_COLOR}">{esc(alarm)}</span>')
        elif details.get("status-reason"):  # why it waits ("starting Spark (12 s)"): news, not trouble
            parts.append(f'<span class="streamlab-reason" style="color:{REASON_COLOR}">'
                         f'{esc(details["status-reason"])}</span>')
        header = f'<div style="{FONT}">{" &middot; ".join(parts)}</div>'
        limit = details.get("bottleneck") or {}
        if state == JobState.RUNNING and limit.get("vertex-id"):  # the answer, beside the job graph's red box
            skew = limit.get("skew") or {}
            header += (f'<div class="streamlab-bottleneck-text" data-vertex="{esc(limit["name"])}" '
                       f'data-chronic="{int(bool(limit.get("chronic")))}" '
                       f'data-key-group="{"" if skew.get("key-group") is None else skew["key-group"]}" '
                       f'style="{FONT};color:{REASON_COLOR}">Bottleneck: {esc(limit["text"])}</div>')
        return header, self._cause(failure) if failure else ""

    @staticmethod
    def _cause(failure: Failure) -> str:
        small = f"{FONT};font-size:11px;color:#555"
        notes = "".join(f"<div>{esc(n)}</div>" for n in failure.notes)
        trace = ""
        if failure.traceback:
            trace = (f'<details class="streamlab-traceback"><summary style="cursor:pointer">Traceback of the '
                     f'user code</summary><pre style="font-size:11px;white-space:pre-wrap;margin:2px 0 0 12px">'
                     f'{esc(failure.traceback)}</pre></details>')
        return f'<div style="{small}">{notes}{trace}</div>'
