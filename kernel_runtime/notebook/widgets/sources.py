"""The partitions a Kafka source reads, per source vertex: each one's offset, its lag (Flink's
pendingRecords: records in the partition not yet read) and, with a WatermarkStrategy, its own
watermark (Flink's per-split watermarks). Nothing for a job without such a source."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from cluster.graph.event_time import time_text
from cluster.protocol.metrics import split_watermarks

from kernel_runtime.notebook.widgets.base import HTMLComponent, Update, esc, table, title

# what cluster/connectors/kafka/source.py reports (and the timestamps operator after it: split_watermarks)
_READER = re.compile(r"^KafkaSourceReader\.topic\.(.+)\.partition\.(\d+)\.(currentOffset|pendingRecords)$")


@dataclass
class PartitionRow:
    vertex: str
    subtask: int
    split: str  # topic-partition
    offset: Optional[int] = None
    lag: Optional[int] = None
    watermark: Optional[int] = None


def partitions(details: dict) -> list[PartitionRow]:
    """One row per partition a source subtask reads, from job_details() (or the events' summary)."""
    names = {v["id"]: v["name"] for v in details.get("vertices", [])}
    rows: dict[tuple[str, str], PartitionRow] = {}
    for subtask in details.get("subtasks", []):
        vertex = names.get(subtask["vertex_id"], subtask["vertex_id"])
        figures = subtask.get("metrics") or {}
        for name, value in figures.items():
            if (reader := _READER.match(name)) is not None:
                split = f"{reader.group(1)}-{reader.group(2)}"
                row = rows.setdefault((vertex, split), PartitionRow(vertex, subtask["subtask"], split))
                if reader.group(3) == "currentOffset":
                    row.offset = value
                else:
                    row.lag = value
        for split, (watermark, _) in split_watermarks(figures).items():
            rows.setdefault((vertex, split), PartitionRow(vertex, subtask["subtask"], split)).watermark = watermark
    return sorted(rows.values(), key=lambda r: (r.vertex, _split_order(r.split)))


def _split_order(split: str) -> tuple[str, int]:
    topic, _, partition = split.rpartition("-")
    return topic, int(partition) if partition.isdigit() else -1


class SourcesView(HTMLComponent):
    css_class = "streamlab-sources"

    def render(self, update: Update) -> str:
        rows = partitions(update.snapshot.details)
        if not rows:
            return ""
        cells = [[esc(r.vertex), str(r.subtask), esc(r.split),
                  f'<span class="streamlab-offset">{"" if r.offset is None else f"{r.offset:,}"}</span>',
                  f'<span class="streamlab-pending" data-pending="{"" if r.lag is None else r.lag}">'
                  f'{"" if r.lag is None else f"{r.lag:,}"}</span>',
                  "" if r.watermark is None else esc(time_text(r.watermark))]
                 for r in rows]
        return title("Source partitions") + table(
            ["source", "subtask", "partition", "next offset", "lag (records)", "watermark (UTC)"], cells)
