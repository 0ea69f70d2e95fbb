"""Restart strategies with Flink's names, options and defaults (restart-strategy.type and friends).

A checkpointed job without a strategy of its own restarts with Flink 2.x's default,
``exponential-delay``: 1 s, then half as long again each time up to 1 min, each delay moved by up
to 10 % either way (jitter: jobs failed by the same outage do not all come back in the same
instant), and back to 1 s once the job ran an hour (``reset-backoff-threshold``) without failing.
A job that fails all the time waits ever longer instead of hammering what it depends on.

Called by the DefaultScheduler only (the JobMaster's loop thread); time comes in as an argument
and randomness from ``random``, so a test fixes both.
"""
from __future__ import annotations

import random as random_module
from dataclasses import dataclass, field
from typing import Callable, Optional

from cluster.conf.options import CheckpointingOptions, RestartStrategyOptions as R


@dataclass
class RestartStrategy:
    kind: str
    attempts: int  # for exponential-delay: since the backoff was last reset
    delay_ms: int  # the fixed delay, or the initial backoff
    max_delay_ms: int = 0
    multiplier: float = 1.0
    reset_after_ms: int = 0  # a run this long without failure resets the backoff (0: never)
    jitter: float = 0.0
    random: Callable[[], float] = field(default=random_module.random, repr=False)
    restarts: int = 0  # in all, for the job's status
    _since_reset: int = 0
    _backoff_ms: float = 0.0
    _last_restart_ms: Optional[int] = None

    @classmethod
    def from_config(cls, conf) -> "RestartStrategy":
        kind = conf.get(R.RESTART_STRATEGY)
        if not conf.is_set("restart-strategy.type") and conf.get(CheckpointingOptions.INTERVAL) > 0:
            kind = "exponential-delay"  # Flink's rule since 1.19: checkpointed, no strategy given
        if kind == "fixed-delay":
            return cls(kind, conf.get(R.FIXED_DELAY_ATTEMPTS), conf.get(R.FIXED_DELAY_DELAY))
        if kind == "exponential-delay":
            return cls(kind, conf.get(R.EXPONENTIAL_DELAY_ATTEMPTS), conf.get(R.EXPONENTIAL_DELAY_INITIAL_BACKOFF),
                       conf.get(R.EXPONENTIAL_DELAY_MAX_BACKOFF), conf.get(R.EXPONENTIAL_DELAY_BACKOFF_MULTIPLIER),
                       conf.get(R.EXPONENTIAL_DELAY_RESET_BACKOFF_THRESHOLD), conf.get(R.EXPONENTIAL_DELAY_JITTER))
        return cls("none", 0, 0)

    def next_delay_ms(self, now_ms: int = 0) -> Optional[int]:
        """Delay before the next restart after a failure at ``now_ms``, or None when the job must
        fail instead."""
        if self.kind == "none":
            return None
        if self.kind == "exponential-delay":
            return self._exponential(now_ms)
        if self.restarts >= self.attempts:
            return None
        self.restarts += 1
        return self.delay_ms

    def _exponential(self, now_ms: int) -> Optional[int]:
        ran_long = self._last_restart_ms is not None and self.reset_after_ms > 0 \
            and now_ms - self._last_restart_ms >= self.reset_after_ms
        if ran_long:
            self._since_reset, self._backoff_ms = 0, 0.0
        if self._since_reset >= self.attempts:
            return None
        self._backoff_ms = float(self.delay_ms) if not self._backoff_ms else \
            min(float(self.max_delay_ms), self._backoff_ms * self.multiplier)
        spread = self._backoff_ms * self.jitter
        delay = max(0, round(self._backoff_ms + (2 * self.random() - 1) * spread))
        self._since_reset += 1
        self.restarts += 1
        self._last_restart_ms = now_ms + delay
        return delay

    def describe(self) -> str:
        if self.kind == "none":
            return "restart-strategy.type is none"
        if self.kind == "exponential-delay":
            return (f"exponential-delay restart strategy used all {self.attempts} attempts "
                    f"(restart-strategy.exponential-delay.attempts-before-reset-backoff)")
        return f"{self.kind} restart strategy used all {self.attempts} attempts"
