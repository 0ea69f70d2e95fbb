"""The live result table: a few rows of each collect sink and how many arrived."""
from __future__ import annotations

from kernel_runtime.notebook.widgets.base import FONT, HTMLComponent, Update, esc, title


class ResultTableView(HTMLComponent):
    css_class = "streamlab-results"

    def __init__(self, handle, rows: int = 10):
        super().__init__()
        self.handle, self.rows = handle, rows

    def render(self, update: Update) -> str:
        parts = []
        for sink in self.handle.sinks:
            summary = self.handle.summary(sink, self.rows)
            counts = (f'<span class="streamlab-row-count" data-rows="{summary.received}">'
                      f"{summary.received:,} rows received</span>, {summary.kept:,} kept ({esc(summary.mode)})")
            if summary.error:
                counts += f' <span style="color:#a50f15">{esc(summary.error)}</span>'
            frame = summary.preview.to_html(index=False, border=0, max_cols=20) if len(summary.preview) else ""
            parts.append(f'{title(sink)}<div style="{FONT}">{counts}</div><div style="{FONT}">{frame}</div>')
        return "".join(parts)
