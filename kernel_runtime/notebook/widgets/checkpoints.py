"""Checkpoints of the job (id, status, duration, size) and the one it restored, from
job_details()["checkpoints"] in the shape of Flink's GET /jobs/<id>/checkpoints; "no checkpoints"
while there are none."""
from __future__ import annotations

from kernel_runtime.notebook.widgets.base import FONT, HTMLComponent, Update, esc, table, title

SHOWN = 8  # the newest checkpoints listed


def _size(n) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


class CheckpointsView(HTMLComponent):
    css_class = "streamlab-checkpoints"

    def render(self, update: Update) -> str:
        checkpoints = update.snapshot.details.get("checkpoints") or {}
        history = checkpoints.get("history") or []
        if not history:
            return f'{title("Checkpoints")}<div style="{FONT};color:#666">no checkpoints</div>'
        counts = checkpoints.get("counts") or {}
        summary = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items())
        rows = [[esc(c.get("id", "")), esc(c.get("checkpoint_type", "CHECKPOINT").lower()),
                 f'<span class="streamlab-checkpoint" data-status="{esc(c.get("status", ""))}">'
                 f'{esc(c.get("status", ""))}</span>',
                 f"{c.get('num_acknowledged_subtasks', '?')}/{c.get('num_subtasks', '?')}",
                 f"{c['end_to_end_duration']:,} ms" if isinstance(c.get("end_to_end_duration"), int) else "",
                 _size(c.get("checkpointed_size") or c.get("state_size") or 0),
                 esc(c.get("failure_message") or "")]
                for c in sorted(history, key=lambda c: c.get("id", 0), reverse=True)[:SHOWN]]
        restored, restored_id = (checkpoints.get("latest") or {}).get("restored"), ""
        if restored:  # the one the running attempt started from (a restart's, or an upgrade's savepoint)
            kind = "savepoint" if restored.get("is_savepoint") else "checkpoint"
            summary += f"; restored {kind} {restored['id']}"
            restored_id = esc(restored["id"])
        return (f'{title("Checkpoints")}<div class="streamlab-checkpoint-counts" data-restored-id="{restored_id}" '
                f'style="{FONT}">{esc(summary)}</div>'
                + table(["id", "type", "status", "acknowledged", "duration", "size", ""], rows))
