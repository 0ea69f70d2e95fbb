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
        "restart-strategy.exponential-delay.attempts-before-reset-backoff": 4,
        "restart-strategy.exponential-delay.jitter-factor": 0}))
    assert [rs.next_delay_ms() for _ in range(5)] == [1000, 2000, 3000, 3000, None]


def exponential(**options):
    conf = {"restart-strategy.type": "exponential-delay", "restart-strategy.exponential-delay.jitter-factor": 0}
    conf.update({f"restart-strategy.exponential-delay.{k.replace('_', '-')}": v for k, v in options.items()})
    return RestartStrategy.from_config(Configuration(conf))


def test_a_checkpointed_job_without_a_strategy_gets_flinks_exponential_delay_defaults():
    rs = RestartStrategy.from_config(Configuration({"execution.checkpointing.interval": "1 s"}))
    assert (rs.kind, rs.delay_ms, rs.max_delay_ms, rs.multiplier) == ("exponential-delay", 1_000, 60_000, 1.5)
    assert (rs.reset_after_ms, rs.jitter, rs.attempts) == (3_600_000, 0.1, 2**31 - 1)
    assert RestartStrategy.from_config(Configuration()).kind == "none"  # not checkpointed: Flink's none
    given = Configuration({"execution.checkpointing.interval": "1 s", "restart-strategy.type": "fixed-delay"})
    assert RestartStrategy.from_config(given).kind == "fixed-delay"


def test_exponential_delay_grows_by_half_each_time_up_to_a_minute():
    rs = exponential()
    delays = [rs.next_delay_ms(now_ms=i) for i in range(12)]
    assert delays[:5] == [1000, 1500, 2250, 3375, 5062]
    assert delays[-1] == 60_000 and rs.restarts == 12


def test_a_run_past_the_threshold_resets_the_backoff_and_the_attempts():
    rs = exponential(attempts_before_reset_backoff=3, reset_backoff_threshold="1 h")
    hour = 3_600_000
    assert [rs.next_delay_ms(now_ms=t) for t in (0, 10_000, 20_000)] == [1000, 1500, 2250]
    assert rs.next_delay_ms(now_ms=30_000) is None  # three restarts within the hour: fails
    rs = exponential(attempts_before_reset_backoff=3, reset_backoff_threshold="1 h")
    assert [rs.next_delay_ms(now_ms=t) for t in (0, 10_000, 20_000)] == [1000, 1500, 2250]
    # ran an hour after its last restart: back to the first delay, and three attempts again
    assert rs.next_delay_ms(now_ms=22_250 + hour) == 1000
    assert rs.next_delay_ms(now_ms=22_250 + hour + 1) == 1500 and rs.restarts == 5


def test_jitter_moves_each_delay_within_its_fraction_either_way():
    rs = exponential(jitter_factor=0.1)
    rs.random = lambda: 0.0
    assert rs.next_delay_ms() == 900  # 1 s less 10 %
    rs.random = lambda: 1.0
    assert rs.next_delay_ms() == 1650  # 1.5 s more 10 %: the backoff itself grew without the jitter


def test_a_jitter_factor_outside_zero_to_one_is_refused_naming_the_key():
    import pytest
    from cluster.conf import ConfigError
    with pytest.raises(ConfigError, match="restart-strategy.exponential-delay.jitter-factor"):
        Configuration({"restart-strategy.exponential-delay.jitter-factor": 1.5})
