import dataclasses
import re

import pytest
import yaml

from cluster.conf import (DEFAULTS_FILE, OPTIONS, ConfigError, ConfigOption, Configuration, TaskConfig, parse_duration_ms,
                          port_candidates)
from cluster.conf import options
from cluster.conf.options import CheckpointingOptions, HeartbeatManagerOptions, RestOptions, SparkOptions


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


def test_task_config_defaults_are_those_of_config_yaml():
    written = yaml.safe_load(DEFAULTS_FILE.read_text())
    config = TaskConfig.from_dict({})
    for f in dataclasses.fields(TaskConfig):
        key = f.metadata["key"]
        assert key in written, f"{key} has no default in config.yaml"
        assert getattr(config, f.name) == OPTIONS[key].parse(written[key]), key
    assert config.batch_size == 10_000 and config.buffer_timeout_ms == 100 and not config.checkpointing


def test_task_config_reads_the_job_configuration():
    config = TaskConfig.from_dict({"execution.checkpointing.interval": "30 s", "execution.checkpointing.mode":
                                   "at-least-once", "state.backend.type": "rocksdb", "execution.buffer-timeout": 0})
    assert config.checkpoint_interval_ms == 30_000 and config.checkpointing and not config.exactly_once
    assert config.state_backend == "rocksdb" and config.buffer_timeout_ms == 0


@pytest.mark.parametrize("values,expected", [
    ({"execution.batch-size": 0}, r"invalid value 0 for 'execution.batch-size' in the configuration of job j"),
    ({"execution.checkpointing.mode": "twice"}, r"for 'execution.checkpointing.mode' .*EXACTLY_ONCE"),
    ({"execution.batchsize": 5}, r"unknown configuration key 'execution.batchsize' in the configuration of job j"),
])
def test_a_bad_job_configuration_is_an_error_naming_the_key(values, expected):
    with pytest.raises(ConfigError, match=expected):
        TaskConfig.from_dict(values, "the configuration of job j")


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[2,3]", "spark://10.0.0.5:7077",
                                    "spark://a:7077,b:7077", "k8s://https://api.example:6443", "yarn"])
def test_spark_masters(master):
    assert TaskConfig.from_dict({"taskmanager.spark.master": master}).spark_master == master


@pytest.mark.parametrize("master", ["spark://10.0.0.5", "local[0]", "spark:/h:7077", "mesos://h:5050", "cluster"])
def test_a_bad_spark_master_is_an_error_naming_the_key(master):
    with pytest.raises(ConfigError, match=r"'taskmanager.spark.master' in job j: expected a Spark master: .*spark://HOST:PORT"):
        TaskConfig.from_dict({"taskmanager.spark.master": master}, "job j")


def test_spark_settings_pass_through_by_sparks_names(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("taskmanager:\n  spark:\n    conf:\n      spark.executor.instances: 4\n"
                 "taskmanager.spark.conf.spark.network.timeout: 60s\n")
    conf = Configuration.from_file(f, {"taskmanager.spark.conf.spark.executor.instances": 2})
    config = TaskConfig.from_configuration(conf)
    assert config.spark_properties == {"spark.executor.instances": "2", "spark.network.timeout": "60s"}
    # the job's configuration travels as a dict and is parsed again on the TaskManager
    assert TaskConfig.from_dict(conf.to_dict()).spark_properties == config.spark_properties


def test_the_session_jvm_uses_the_parallel_collector_and_a_late_c2_unless_the_user_says_otherwise():
    """And it ends at its first OutOfMemoryError (docs/spark.md), unless the user's own options say
    otherwise after it."""
    from cluster.spark.runner import LATE_C2, spark_conf
    assert "-XX:Tier4InvocationThreshold=50000" in LATE_C2
    assert spark_conf(TaskConfig.from_dict({}))["spark.driver.extraJavaOptions"] == \
        f"-XX:+ExitOnOutOfMemoryError -XX:+UseParallelGC {LATE_C2}"
    own = TaskConfig.from_dict({"taskmanager.spark.conf.spark.driver.extraJavaOptions": "-XX:+UseG1GC -Xss4m"})
    assert spark_conf(own)["spark.driver.extraJavaOptions"] == "-XX:+ExitOnOutOfMemoryError -XX:+UseG1GC -Xss4m"


@pytest.mark.parametrize("values,expected", [
    ({"taskmanager.spark.conf.spark.executor.memory": "2g"},
     r"'taskmanager.spark.conf'.*no spark.executor.memory here: 'taskmanager.spark.executor-memory' sets it"),
    ({"taskmanager.spark.conf.executor.memory": "2g"}, r"'taskmanager.spark.conf'.*start with 'spark.'"),
    ({"taskmanager.spark.executor-memory": "a lot"}, r"'taskmanager.spark.executor-memory'.*\"512m\""),
])
def test_bad_spark_settings_name_the_key(values, expected):
    with pytest.raises(ConfigError, match=expected):
        Configuration(values)


@pytest.mark.parametrize("given,canonical,ports", [
    ("50100", "50100", [50100]),
    (50100, "50100", [50100]),
    ("50100,50101", "50100,50101", [50100, 50101]),
    ("50100-50103", "50100-50103", [50100, 50101, 50102, 50103]),
    (" 50105 , 50100-50101,0", "50105,50100-50101,0", [50105, 50100, 50101, 0]),
    ("65535-65535", "65535-65535", [65535]),
])
def test_rest_bind_port_takes_lists_and_ranges_in_order(given, canonical, ports):
    spec = Configuration({"rest.bind-port": given})["rest.bind-port"]
    assert spec == canonical
    assert list(port_candidates(spec)) == ports


def test_rest_bind_port_not_set_is_empty():
    # empty: the REST server binds rest.port (Flink's fallback key)
    assert Configuration()["rest.bind-port"] == ""
    assert not Configuration().is_set("rest.bind-port")


@pytest.mark.parametrize("given,why", [
    ("http", "'http' is not one"),
    ("50100,,50101", "'' is not one"),
    ("50100-", "'50100-' is not one"),
    ("-50100", "'-50100' is not one"),
    ("50100-50200-50300", "'50100-50200-50300' is not one"),
    ("65536", "'65536' is beyond 65535"),
    ("50100-70000", "'50100-70000' is beyond 65535"),
    ("50200-50100", "the range '50200-50100' runs backwards"),
    (True, "a port, a list of ports"),
    (1.5, "a port, a list of ports"),
])
def test_rest_bind_port_errors_name_the_key_and_the_bad_part(given, why):
    with pytest.raises(ConfigError, match=rf"invalid value .* for 'rest.bind-port' in test.yaml: expected .*{re.escape(why)}"):
        Configuration({"rest.bind-port": given}, "test.yaml")


def test_every_key_of_config_yaml_has_exactly_one_option():
    written = yaml.safe_load(DEFAULTS_FILE.read_text())
    holders = [value for value in vars(options).values()
               if isinstance(value, type) and value.__name__.endswith("Options")]
    declared = [o.key for holder in holders for o in vars(holder).values() if isinstance(o, ConfigOption)]
    assert sorted(declared) == sorted(written), "one option per key of config.yaml, none more"
    assert set(OPTIONS) == set(written)


def test_every_option_s_default_is_config_yaml_s_value_parsed():
    written = yaml.safe_load(DEFAULTS_FILE.read_text())
    conf = Configuration()
    for key, option in OPTIONS.items():
        assert option.default == option.parse(written[key]) == conf.get(option) == conf[key], key


def test_get_returns_the_typed_default_and_a_parsed_user_value():
    conf = Configuration()
    port: int = conf.get(RestOptions.PORT)
    assert port == 8081 and conf.get(HeartbeatManagerOptions.HEARTBEAT_TIMEOUT) == 50_000
    assert conf.get(CheckpointingOptions.MODE) == "EXACTLY_ONCE" and conf.get(SparkOptions.CONF) == {}
    conf = Configuration({"rest.port": "9090", "heartbeat.timeout": "2 min", "execution.checkpointing.mode":
                          "at-least-once", "taskmanager.spark.conf.spark.executor.instances": 4})
    assert conf.get(RestOptions.PORT) == 9090 and conf.get(HeartbeatManagerOptions.HEARTBEAT_TIMEOUT) == 120_000
    assert conf.get(CheckpointingOptions.MODE) == "AT_LEAST_ONCE"
    assert conf.get(SparkOptions.CONF) == {"spark.executor.instances": "4"}
    # the key's old spellings still answer, untyped
    assert conf["rest.port"] == 9090 and conf.get("rest.port") == 9090 and conf.get("no.such.key", 1) == 1
