"""What the task metrics in heartbeats mean to their readers (the REST API, the dashboard)."""
from __future__ import annotations


def backpressure_level(ratio: float) -> str:
    """Flink's grading of the share of time a subtask was back-pressured, with the names of its
    REST API: "ok" up to 10 %, "low" up to 50 %, "high" above."""
    return "ok" if ratio <= 0.10 else "low" if ratio <= 0.5 else "high"
