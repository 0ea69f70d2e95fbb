"""The dashboard's header: the job, its state, how long it runs, why it waits or how it failed."""
from __future__ import annotations

from .base import FONT, HTMLComponent, Update, esc, state_color


class StatusView(HTMLComponent):
    css_class = "streamlab-status"

    def __init__(self, name: str, job_id: str):
        super().__init__()
        self.name, self.job_id = name, job_id

    def render(self, update: Update) -> str:
        snapshot = update.snapshot
        details = snapshot.details
        state = snapshot.state or "UNKNOWN"
        parts = [f"<b>Job {esc(repr(self.name))}</b>", f"<code>{esc(self.job_id)}</code>",
                 f'<span class="streamlab-state" data-state="{esc(state)}" style="background:{state_color(state)};'
                 f'padding:0 6px;border-radius:3px">{esc(state)}</span>']
        if details.get("duration", -1) >= 0:  # since the job's start, over all its attempts
            parts.append(f"{details['duration'] / 1000:.1f} s")
        if details.get("attempt"):
            parts.append(f'<span class="streamlab-attempt" data-attempt="{int(details["attempt"])}">'
                         f'attempt {int(details["attempt"])}</span>')
        note = snapshot.error or details.get("status-reason") or ""
        failure = details.get("failure-cause")
        if failure:
            note = failure.strip().splitlines()[-1]
        if note:
            parts.append(f'<span style="color:#a50f15">{esc(note)}</span>')
        return f'<div style="{FONT}">{" &middot; ".join(parts)}</div>'
