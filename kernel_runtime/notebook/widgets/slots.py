"""Slot utilisation: every TaskManager's slots, free or busy, with the subtasks each one runs."""
from __future__ import annotations

from kernel_runtime.notebook.widgets.base import FONT, HTMLComponent, Update, esc, title

SLOT_COLORS = {"busy": "#c7e9c0", "free": "#f4f4f4", "other": "#fdd0a2"}


def slot_table(job_id: str, taskmanagers: list[dict], subtasks: list[dict]) -> list[tuple[str, list[dict]]]:
    """[(TaskManager id, [{"state": busy|free|other, "subtasks": [label, ...]}, ...]), ...]

    busy: held by this job; other: held by another job."""
    running: dict[tuple[str, int], list[str]] = {}
    for s in subtasks:
        if s.get("taskmanager_id") is not None and s.get("slot") is not None:
            label = f"{s['vertex']} ({s['subtask'] + 1}) {s['status']}"
            running.setdefault((s["taskmanager_id"], s["slot"]), []).append(label)
    layout = []
    for tm in sorted(taskmanagers, key=lambda t: t["id"]):
        slots = []
        for index, slot in enumerate(tm.get("slots") or [None] * tm.get("slotsNumber", 0)):
            if slot is None:
                slots.append({"state": "free", "subtasks": []})
            elif slot.get("job_id") == job_id:
                slots.append({"state": "busy", "subtasks": running.get((tm["id"], index), [])})
            else:
                slots.append({"state": "other", "subtasks": [f"job {slot.get('job_id', '?')[:8]}"]})
        layout.append((tm["id"], slots))
    return layout


class SlotsView(HTMLComponent):
    css_class = "streamlab-slots"

    def __init__(self, job_id: str):
        super().__init__()
        self.job_id = job_id

    def render(self, update: Update) -> str:
        layout = slot_table(self.job_id, update.snapshot.taskmanagers, update.snapshot.details.get("subtasks", []))
        busy = sum(s["state"] == "busy" for _, slots in layout for s in slots)
        total = sum(len(slots) for _, slots in layout)
        rows = []
        for tm_id, slots in layout:
            cells = []
            for index, slot in enumerate(slots):
                lines = "".join(f"<br/>{esc(label)}" for label in slot["subtasks"])
                cells.append(
                    f'<div class="streamlab-slot" data-state="{slot["state"]}" style="display:inline-block;'
                    f'vertical-align:top;width:190px;min-height:30px;margin:2px;padding:2px 4px;'
                    f'border:1px solid #bbb;border-radius:3px;background:{SLOT_COLORS[slot["state"]]};'
                    f'overflow:hidden;white-space:nowrap;text-overflow:ellipsis">'
                    f'<b>slot {index}</b> {slot["state"]}{lines}</div>')
            rows.append(f'<div><div style="color:#555">TaskManager {esc(tm_id)}</div>{"".join(cells)}</div>')
        header = title(f"Slots: {busy} of {total} held by this job")
        return f'<div style="{FONT}" data-busy="{busy}">{header}{"".join(rows)}</div>'
