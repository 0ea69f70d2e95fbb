"""Restart strategies with Flink's names and options (restart-strategy.type and friends)."""
from __future__ import annotations
from cluster.conf.options import CheckpointingOptions, RestartStrategyOptions

from dataclasses import dataclass
from typing import Optional


@dataclass
class RestartStrategy:
    kind: str
    attempts: int
    delay_ms: int
    max_delay_ms: int = 0
    multiplier: float = 1.0
    restarts: int = 0

    @classmethod
    def from_config(cls, conf) -> "RestartStrategy":
        kind = conf.get(RestartStrategyOptions.RESTART_STRATEGY)
        if not conf.is_set("restart-strategy.type") and conf.get(CheckpointingOptions.INTERVAL) > 0:
            # Flink's rule: with checkpointing and no strategy given, restart (fixed delay) forever
            return cls("fixed-delay", 2**31 - 1, conf.get(RestartStrategyOptions.FIXED_DELAY_DELAY))
        if kind == "fixed-delay":
            return cls(kind, conf.get(RestartStrategyOptions.FIXED_DELAY_ATTEMPTS),
                       conf.get(RestartStrategyOptions.FIXED_DELAY_DELAY))
        if kind == "exponential-delay":
            return cls(kind, conf.get(RestartStrategyOptions.EXPONENTIAL_DELAY_ATTEMPTS),
                       conf.get(RestartStrategyOptions.EXPONENTIAL_DELAY_INITIAL_BACKOFF),
                       conf.get(RestartStrategyOptions.EXPONENTIAL_DELAY_MAX_BACKOFF),
                       conf.get(RestartStrategyOptions.EXPONENTIAL_DELAY_BACKOFF_MULTIPLIER))
        return cls("none", 0, 0)

    def next_delay_ms(self) -> Optional[int]:
        """Delay before the next restart, or None when the job must fail instead."""
        if self.kind == "none" or self.restarts >= self.attempts:
            return None
        if self.kind == "exponential-delay":
            delay = min(self.max_delay_ms, int(self.delay_ms * self.multiplier ** self.restarts))
        else:
            delay = self.delay_ms
        self.restarts += 1
        return delay

    def describe(self) -> str:
        if self.kind == "none":
            return "restart-strategy.type is none"
        return f"{self.kind} restart strategy used all {self.attempts} attempts"
