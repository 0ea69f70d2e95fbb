"""What a fault test reports, on one line that ``bench/faults.py`` collects when it runs the fault
tests again and again: the committed rows, how many were lost and how many doubled, and how long
the job took to recover. The seed of a fault's random moment is printed, and
STREAMLAB_FAULT_SEED (set by the bench) varies it."""
from __future__ import annotations

import os
import random
import time
from typing import Callable, Optional, Sequence, Union

import pandas as pd

from tests.conftest import rest, wait_for

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


ROUNDS = 3  # how often a fault test injects its fault, each at a random moment


def completed_checkpoints(local, handle) -> int:
    return rest(local, f"/jobs/{handle.job_id}/checkpoints")[1]["counts"]["completed"]


def in_rounds(local, client, handles: list, fault: Callable[[Stopwatch], None], rounds: int = ROUNDS,
              within: float = 120.0) -> list[Stopwatch]:
    """Inject ``fault`` ``rounds`` times into jobs that run side by side (one per state backend), each
    time at a random moment of processing once every job is RUNNING with a checkpoint completed
    since the last fault (so that every restart restores, and the jobs progress between faults).
    ``fault(watch)`` returns once the fault is over (healed, resumed); the watch stops when every
    job runs again, unless the fault stopped it sooner. The faults' stopwatches are returned."""
    def all_in(states: tuple[str, ...]) -> bool:
        return all(h.job_status().state in states and all(
            t["status"] in states for t in client.job_details(h.job_id)["subtasks"]) for h in handles)

    watches = []
    for round_ in range(1, rounds + 1):
        done = [completed_checkpoints(local, h) for h in handles]
        wait_for(lambda: all_in(("RUNNING",)) and all(completed_checkpoints(local, h) > n
                                                      for h, n in zip(handles, done)),
                 within, f"every job running with a new checkpoint before fault {round_}")
        time.sleep(random.uniform(0.2, 1.5))  # a random moment of processing
        watch = Stopwatch()
        watches.append(watch)
        fault(watch)
        wait_for(lambda: all_in(("RUNNING", "FINISHED")), within, f"every job running after fault {round_}")
        watch.recovered()
    return watches
