"""Wall-clock time in milliseconds, the unit of every timestamp the cluster shows (Flink's REST
fields, checkpoint trigger times). Decisions that must be testable take a clock argument instead
of calling this directly."""
from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
