"""Event time per vertex: its watermark, how far it trails the newest event time of the job, and
the late records it dropped; then the newest late rows of each window or join that found some.
Nothing at all for a job without event time."""
from __future__ import annotations

from cluster.graph.event_time import duration_text, time_text
from cluster.protocol.metrics import OperatorLateRows, late_rows

from kernel_runtime.notebook.widgets.base import FONT, HTMLComponent, Update, esc, table, title
from kernel_runtime.notebook.widgets.metrics import event_time


class WatermarksView(HTMLComponent):
    css_class = "streamlab-watermarks"

    def render(self, update: Update) -> str:
        job = event_time(update.snapshot.details)
        if job is None:
            return ""
        newest = "none yet" if job.newest is None else time_text(job.newest)
        rows = [[esc(v.name),
                 f'<span class="streamlab-watermark" data-watermark="{v.watermark}">'
                 f'{esc(time_text(v.watermark))}</span>',
                 f'<span class="streamlab-lag" data-lag-ms="{"" if v.lag_ms is None else v.lag_ms}">'
                 f'{"" if v.lag_ms is None else esc(duration_text(v.lag_ms))}</span>',
                 f'<span class="streamlab-late" data-late="{v.late_dropped}">{v.late_dropped:,}</span>']
                for v in job.vertices]
        return (f'{title("Event time")}<div style="{FONT}">newest event time: {esc(newest)} (UTC)</div>'
                + "".join(wait_line(wait) for wait in update.snapshot.details.get("window-waits") or []
                          if update.snapshot.details.get("state") == "RUNNING")
                + table(["vertex", "watermark (UTC)", "lag behind newest", "late records dropped"], rows)
                + "".join(late_table(report) for report in late_rows(update.snapshot.details.get("subtasks", []))
                          if report.count))


def wait_line(wait: dict) -> str:
    """Why a window has not fired (cluster.jobmanager.rest.window_waits), one sentence."""
    held = wait["held_by"]
    return (f'<div class="streamlab-window-wait" data-operator="{esc(wait["operator"])}" '
            f'data-held-vertex="{esc(held["vertex"])}" data-held-subtask="{held["subtask"]}" '
            f'data-held-split="{esc(held["split"] or "")}" style="{FONT};margin:2px 0;color:#8c510a">'
            f'{esc(wait["text"])}</div>')


LATE_SHOWN = 5  # per operator, the newest first: handle.late_rows(operator) has the rest of the sample


def late_table(report: OperatorLateRows) -> str:
    went = f'to side output "{report.side_output}"' if report.side_output else "dropped"
    newest = report.sample[::-1][:LATE_SHOWN]
    rows = [[esc(time_text(entry["event_time"])), esc(time_text(entry["watermark"])),
             esc(duration_text(max(0, entry["watermark"] - entry["event_time"]))),
             esc(", ".join(f"{k}={v}" for k, v in entry["row"].items())), str(entry["subtask"])]
            for entry in newest]
    return (f'<div class="streamlab-late-rows" data-operator="{esc(report.name)}" data-count="{report.count}" '
            f'style="{FONT};margin-top:4px">Late rows of <b>{esc(report.name)}</b>: {report.count:,} ({went}); '
            f'the newest {len(newest)} (handle.late_rows("{esc(report.name)}") has up to 20 per subtask)</div>'
            + table(["event time (UTC)", "watermark then", "late by", "row", "subtask"], rows))
