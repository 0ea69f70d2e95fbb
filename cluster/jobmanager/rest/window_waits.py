"""Why a window has not fired: for each event-time window operator of a job, its oldest window not
yet fired, how far its watermark must still move, and what holds that watermark back, followed
upstream channel by channel to the source subtask (and, for a source that reads several splits at
once, the split) whose watermark is the smallest.

A task's watermark is the minimum over its active input channels (WatermarkValve), so the input
with the smallest watermark is the one to follow; a source's is its own, or its splits' minimum.
What holds it is then one of: no watermark yet (no row read there, and no idleness set: Flink's
"NaN low watermark" question), idle, or behind the job's newest event time.

Pure: the job graph and each subtask's latest metrics in, a list of dicts out (streamlab's own
``window-waits`` in GET /jobs/<id>, and the dashboard's sentence).
"""
from __future__ import annotations

from typing import Optional

from cluster.graph.event_time import MAX_WATERMARK, NO_WATERMARK, duration_text, time_text
from cluster.graph.job_graph import JobGraph
from cluster.protocol.metrics import (CURRENT_INPUT_WATERMARK, CURRENT_OUTPUT_WATERMARK, INPUT_WATERMARKS,
                                      NEWEST_EVENT_TIMESTAMP, OLDEST_OPEN_WINDOW, OUTPUT_IDLE, split_watermarks)

Metrics = dict[tuple[str, int], dict]  # (vertex id, subtask) -> that subtask's latest metrics


def _holder(graph: JobGraph, metrics: Metrics, vertex: str, subtask: int) -> dict:
    """Follows the smallest active input from (vertex, subtask) up to a source subtask."""
    names = {v.id: v.name for v in graph.vertices}
    seen = set()
    while (vertex, subtask) not in seen:  # a graph has no cycles; a stale report must not loop either
        seen.add((vertex, subtask))
        figures = metrics.get((vertex, subtask), {})
        channels = figures.get(INPUT_WATERMARKS) or {}
        active = {channel: watermark for channel, (watermark, idle) in channels.items() if not idle}
        if not active:  # a source, or a task all of whose inputs are idle
            held = {"vertex_id": vertex, "vertex": names.get(vertex, vertex), "subtask": subtask,
                    "watermark": int(figures.get(CURRENT_OUTPUT_WATERMARK, NO_WATERMARK)),
                    "idle": bool(figures.get(OUTPUT_IDLE, False) or (channels and not active)), "split": None}
            splits = {s: w for s, (w, idle) in split_watermarks(figures).items() if not idle}
            if splits and not channels:
                split = min(splits, key=lambda s: (splits[s], s))
                held.update(split=split, watermark=splits[split], idle=False)
            return held
        channel = min(active, key=lambda c: (active[c], c))
        edge, producer = channel.split("/")
        vertex, subtask = graph.edges[int(edge)].source, int(producer)
    raise ValueError(f"the inputs of vertex {vertex} lead back to it")


def _sentence(wait: dict, newest: Optional[int]) -> str:
    start, end = wait["window"]
    held = wait["held_by"]
    text = (f"window [{time_text(start)}, {time_text(end)}) of '{wait['operator']}' (subtask {wait['subtask']}) "
            f"fires when the watermark passes {time_text(end - 1)}")
    if wait["watermark"] == NO_WATERMARK:
        text += "; it has no watermark yet"
    else:
        text += f"; it is at {time_text(wait['watermark'])}, {duration_text(end - 1 - wait['watermark'])} short"
    if (held["vertex_id"], held["subtask"]) == (wait["vertex_id"], wait["subtask"]):
        return text + (". Every input of it is idle (WatermarkStrategy.with_idleness): its watermark moves when "
                       "rows come again.")
    where = f"subtask {held['subtask']} of '{held['vertex']}'"
    if held["split"] is not None:
        where = f"split {held['split']} of {where}"
    if held["idle"]:
        state = "which is idle"
    elif held["watermark"] == NO_WATERMARK:
        state = ("which has no watermark yet: it has read no row (a source split without rows holds every "
                 "window back unless the WatermarkStrategy says .with_idleness(...))")
    elif newest is not None and newest > held["watermark"]:
        state = f"whose watermark {time_text(held['watermark'])} is {duration_text(newest - held['watermark'])} " \
                "behind the newest event time"
    else:
        state = f"whose watermark is {time_text(held['watermark'])}"
    text += f". It waits for {where}, {state}"
    if wait["inputs"] > 1:
        text += f"; {wait['inputs_past']} of its {wait['inputs']} inputs is past it"
    return text + "."


def window_waits(graph: JobGraph, metrics: Metrics) -> list[dict]:
    """Per event-time window operator with a window not yet fired: the oldest such window, where it
    waits, and why, as a dict with a ``text`` sentence."""
    newest = max((int(m[NEWEST_EVENT_TIMESTAMP]) for m in metrics.values()
                  if m.get(NEWEST_EVENT_TIMESTAMP, NO_WATERMARK) > NO_WATERMARK), default=None)
    out = []
    for vertex in graph.vertices:
        window = next((op for op in vertex.operators if op.kind == "window"), None)
        if window is None:
            continue
        waiting = [(figures[OLDEST_OPEN_WINDOW][1], subtask, figures) for (vid, subtask), figures in metrics.items()
                   if vid == vertex.id and figures.get(OLDEST_OPEN_WINDOW)]
        if not waiting:
            continue
        end, subtask, figures = min(waiting, key=lambda w: (w[0], w[1]))
        watermark = int(figures.get(CURRENT_INPUT_WATERMARK, NO_WATERMARK))
        if watermark >= end - 1 or watermark == MAX_WATERMARK:
            continue  # it fires with the next batch: the report came between
        inputs = figures.get(INPUT_WATERMARKS) or {}
        wait = {"vertex_id": vertex.id, "operator": window.name, "uid": window.uid, "subtask": subtask,
                "window": [int(figures[OLDEST_OPEN_WINDOW][0]), int(end)], "watermark": watermark,
                "inputs": len(inputs), "inputs_past": sum(1 for w, _ in inputs.values() if w >= end - 1),
                "held_by": _holder(graph, metrics, vertex.id, subtask)}
        wait["text"] = _sentence(wait, newest)
        out.append(wait)
    return out
