"""What a fault test reports, on one line that ``bench/faults.py`` collects when it runs the fault
tests again and again: the committed rows, how many were lost and how many doubled, and how long
the job took to recover. The seed of a fault's random moment is printed, and
STREAMLAB_FAULT_SEED (set by the bench) varies it."""
from __future__ import annotations

import os
import random
import time
from typing import Optional, Sequence, Union

import pandas as pd

PREFIX = "FAULT-RESULT"


def seed(name: str) -> str:
    """Seed ``random`` for one run of a fault; the seed is printed (pytest shows it on a failure)."""
    value = f"{name}{os.environ.get('STREAMLAB_FAULT_SEED', '')}"
    random.seed(value)
    print(f"fault seed: {value!r}")
    return value


class Stopwatch:
    """From the fault's start to the job running again (``recovered()``)."""

    def __init__(self):
        self.started = time.monotonic()
        self.seconds: Optional[float] = None

    def recovered(self) -> None:
        if self.seconds is None:
            self.seconds = time.monotonic() - self.started


def check_exactly_once(fault: str, got: pd.DataFrame, want: pd.DataFrame,
                       watch: Union[Stopwatch, Sequence[Stopwatch], None], key: str = "seq") -> None:
    """Print the fault's line, then assert the committed output equals the reference row for row.
    ``watch``: the fault's, or one per fault of a test that injects it several times (the line says
    how many, and the longest recovery)."""
    lost = len(set(want[key]) - set(got[key]))
    doubled = int(got.duplicated(key).sum())
    watches = [] if watch is None else [watch] if isinstance(watch, Stopwatch) else list(watch)
    times = [w.seconds for w in watches if w.seconds is not None]
    recover = f"{max(times):.2f}" if times else "-"
    print(f"{PREFIX} fault={fault} rows={len(got)} lost={lost} duplicated={doubled} recover_s={recover} "
          f"injected={max(len(watches), 1)}")
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True), check_dtype=False)
