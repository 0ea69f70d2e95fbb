from cluster.conf import Configuration
from cluster.jobmanager.jobmaster.restart_strategy import RestartStrategy


def test_none_never_restarts():
    assert RestartStrategy.from_config(Configuration()).next_delay_ms() is None


def test_fixed_delay_counts_attempts():
    rs = RestartStrategy.from_config(Configuration({"restart-strategy.type": "fixed-delay",
                                                    "restart-strategy.fixed-delay.attempts": 2,
                                                    "restart-strategy.fixed-delay.delay": "3 s"}))
    assert [rs.next_delay_ms() for _ in range(3)] == [3000, 3000, None]


def test_exponential_delay_grows_to_its_cap():
    rs = RestartStrategy.from_config(Configuration({
        "restart-strategy.type": "exponential-delay",
        "restart-strategy.exponential-delay.initial-backoff": "1 s",
        "restart-strategy.exponential-delay.max-backoff": "3 s",
        "restart-strategy.exponential-delay.backoff-multiplier": 2.0,
        "restart-strategy.exponential-delay.attempts-before-reset-backoff": 4}))
    assert [rs.next_delay_ms() for _ in range(5)] == [1000, 2000, 3000, 3000, None]
