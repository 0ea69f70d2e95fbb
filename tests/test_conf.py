import pytest

from cluster.conf import ConfigError, Configuration, parse_duration_ms


def test_defaults_follow_flink():
    conf = Configuration()
    assert conf["jobmanager.rpc.port"] == 6123
    assert conf["rest.port"] == 8081
    assert conf["execution.buffer-timeout"] == 100
    assert conf["pipeline.max-parallelism"] == 128
    assert conf["heartbeat.timeout"] == 50_000
    assert conf["restart-strategy.type"] == "none"


def test_nested_and_flat_keys(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("taskmanager:\n  numberOfTaskSlots: 4\nrest.port: 0\n")
    conf = Configuration.from_file(f)
    assert conf["taskmanager.numberOfTaskSlots"] == 4 and conf["rest.port"] == 0


def test_unknown_key_is_an_error_naming_it(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("taskmanager.numberOfSlots: 4\n")
    with pytest.raises(ConfigError, match=r"unknown configuration key 'taskmanager.numberOfSlots' in .*c.yaml"):
        Configuration.from_file(f)


@pytest.mark.parametrize("key,value,expected", [
    ("taskmanager.numberOfTaskSlots", "many", "an integer"),
    ("taskmanager.numberOfTaskSlots", 0, r"\[1,"),
    ("heartbeat.timeout", "soon", "a duration"),
    ("restart-strategy.type", "sometimes", "none, fixed-delay, exponential-delay"),
])
def test_bad_values_name_the_key(key, value, expected):
    with pytest.raises(ConfigError, match=rf"invalid value .* for '{key}'.*{expected}"):
        Configuration({key: value})


@pytest.mark.parametrize("text,ms", [("500 ms", 500), ("10 s", 10_000), ("1 min", 60_000), (250, 250), ("2s", 2000)])
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms
