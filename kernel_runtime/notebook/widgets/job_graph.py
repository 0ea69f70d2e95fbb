"""The job graph: vertices (chains of operators) with their parallelism, state, busy and
back-pressured time, and the edges between them with their ship strategy; drawn as SVG from the
job's plan. A running vertex is filled as Flink's job graph fills it (metrics.load_colors): the busy
bottleneck red, the operators that wait for it dark, idle ones blue."""
from __future__ import annotations

import re

from kernel_runtime.notebook.widgets.base import FONT, HTMLComponent, Update, esc, percent, state_color, title
from kernel_runtime.notebook.widgets.metrics import bottleneck, load_colors

BOX_W, LINE_H, GAP_X, GAP_Y, PAD = 210, 15, 70, 16, 8
_OPERATOR = re.compile(r"^(?P<name>.*?) \[(?P<kind>[^\]]+)\](?: \(.*\))?$")


def operators(description: str) -> list[tuple[str, str]]:
    """The chained operators' (name, kind) from a plan node's description ("name [kind] (site)<br/>...");
    kind "" where the description has none."""
    found = []
    for part in description.split("<br/>"):
        match = _OPERATOR.match(part.strip())
        found.append((match["name"], match["kind"]) if match else (part.strip(), ""))
    return [(name, kind) for name, kind in found if name]


def operator_names(description: str) -> list[str]:
    return [name for name, _ in operators(description)]


def layout(plan: dict) -> dict[str, tuple[int, int]]:
    """vertex id -> (column, row): a column per distance from the sources."""
    nodes = {n["id"]: n for n in plan.get("nodes", [])}
    column: dict[str, int] = {}

    def depth(vid: str, seen: frozenset = frozenset()) -> int:
        if vid not in column:
            inputs = [i["id"] for i in nodes[vid].get("inputs", []) if i["id"] in nodes and i["id"] not in seen]
            column[vid] = 1 + max((depth(i, seen | {vid}) for i in inputs), default=-1)
        return column[vid]

    rows: dict[int, int] = {}
    placed = {}
    for vid in reversed(list(nodes)):  # the plan lists sinks first
        col = depth(vid)
        placed[vid] = (col, rows.get(col, 0))
        rows[col] = rows.get(col, 0) + 1
    return placed


class JobGraphView(HTMLComponent):
    css_class = "streamlab-graph"

    def render(self, update: Update) -> str:
        plan = update.snapshot.details.get("plan") or {}
        nodes = {n["id"]: n for n in plan.get("nodes", [])}
        if not nodes:
            return ""
        states = {v["id"]: v.get("status", "") for v in update.snapshot.details.get("vertices", [])}
        stats = {s.vertex_id: s for s in update.stats}
        slowest = bottleneck(update.stats)
        places = layout(plan)
        heights = {vid: (3 + len(operator_names(n.get("description", "")))) * LINE_H + PAD for vid, n in nodes.items()}
        row_h = max(heights.values()) + GAP_Y
        pos: dict[str, tuple[float, float]] = {vid: (PAD + col * (BOX_W + GAP_X), PAD + row * row_h) for vid, (col, row) in places.items()}
        width = max(x for x, _ in pos.values()) + BOX_W + PAD
        height = max(y + heights[vid] for vid, (_, y) in pos.items()) + PAD
        parts = ['<defs><marker id="streamlab-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
                 'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#666"/></marker></defs>']
        for vid, node in nodes.items():
            for edge in node.get("inputs", []):
                if edge["id"] not in pos:
                    continue
                (x1, y1), (x2, y2) = pos[edge["id"]], pos[vid]
                y1 += heights[edge["id"]] / 2
                y2 += heights[vid] / 2
                x1 += BOX_W
                parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#666" '
                             f'marker-end="url(#streamlab-arrow)"/>')
                parts.append(f'<text x="{(x1 + x2) / 2}" y="{(y1 + y2) / 2 - 4}" text-anchor="middle" '
                             f'font-size="10" fill="#444">{esc(edge.get("ship_strategy", ""))}</text>')
        for vid, node in nodes.items():
            x, y = pos[vid]
            state, vertex = states.get(vid, ""), stats.get(vid)
            level = vertex.level if vertex else "OK"
            fill, ink, load = state_color(state), "black", ""
            if vertex is not None:  # the last figures of an ended vertex, on its state's colour
                load = f"busy {percent(vertex.busy_max)} · back-pressured {percent(vertex.backpressured)}"
                if vid == slowest:
                    load = f"bottleneck: busy {percent(vertex.busy_max)}"
                if state == "RUNNING":
                    fill, ink = load_colors(vertex.busy_max, vertex.backpressured)
            parts.append(f'<g class="streamlab-vertex" data-state="{esc(state)}" data-level="{level}" '
                         f'data-bottleneck="{int(vid == slowest)}" '
                         f'data-busy="{round(100 * vertex.busy_max) if vertex else 0}" '
                         f'data-backpressured="{round(100 * vertex.backpressured) if vertex else 0}">'
                         f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{heights[vid]}" rx="4" '
                         f'fill="{fill}" stroke="#666" stroke-width="1"/>')
            lines = [f"parallelism {node.get('parallelism', '?')} · {state}", load]
            lines += operator_names(node.get("description", ""))
            for i, text in enumerate(lines):
                weight = "normal" if i < 2 else "600"
                parts.append(f'<text x="{x + 6}" y="{y + PAD + (i + 1) * LINE_H - 3}" font-size="11" '
                             f'font-weight="{weight}" fill="{ink}">{esc(text[:34])}</text>')
            parts.append("</g>")
        # a wide graph scales down to its column rather than be cut off at the right edge
        svg = (f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
               f'style="max-width:100%;height:auto;{FONT}">{"".join(parts)}</svg>')
        return f'{title("Job graph")}{svg}'
