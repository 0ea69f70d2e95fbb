"""Event time per vertex: its watermark, how far it trails the newest event time of the job, and
the late records it dropped. Nothing at all for a job without event time."""
from __future__ import annotations

from datetime import datetime, timezone

from cluster.graph.event_time import MAX_WATERMARK, NO_WATERMARK

from kernel_runtime.notebook.widgets.base import FONT, HTMLComponent, Update, esc, table, title
from kernel_runtime.notebook.widgets.metrics import event_time


def time_text(ms: int) -> str:
    """An event time or watermark as a UTC date and time to the millisecond, or what it stands for."""
    if ms == NO_WATERMARK:
        return "no watermark"
    if ms == MAX_WATERMARK:
        return "end of input"
    try:
        when = datetime.fromtimestamp(ms / 1000, timezone.utc)
    except (OverflowError, OSError, ValueError):  # beyond what datetime holds: the number itself
        return f"{ms:,} ms"
    return when.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def duration_text(ms: int) -> str:
    """A lag as a person reads it: 350 ms, 1.25 s, 2 min 05 s, 3 h 02 min."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600:,} h {seconds % 3600 // 60:02d} min"


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
                + table(["vertex", "watermark (UTC)", "lag behind newest", "late records dropped"], rows))
