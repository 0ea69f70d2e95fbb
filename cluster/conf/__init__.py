"""Configuration: one YAML file with Flink's key names, validated key by key.

Every key the cluster understands is a typed option (cluster.conf.options, one per key of
config.yaml) that says how its value is read (cluster.conf.parsers). An unknown key or a value of
the wrong kind is a ConfigError that names the key and where it came from, never a silent no-op.
``conf.get(RestOptions.PORT)`` reads a value with its type; ``conf["rest.port"]`` by key, untyped.
``TaskConfig`` is the typed part of a job's configuration that tasks and operators read.

This package's names below are its interface; the modules behind them are its parts.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Optional, TypeVar, Union, overload

import yaml

from cluster.conf.options import (DEFAULTS_FILE, MAX_JOB_GRAPH_BYTES, OPTIONS, CheckpointingOptions, ConfigOption,
                                  CoreOptions, ExecutionOptions, PipelineOptions, SparkOptions, StateBackendOptions,
                                  TaskManagerOptions, default_values)
from cluster.conf.parsers import (ConfigError, flatten, format_size, load_yaml, parse_duration_ms, parse_size_bytes,
                                  port_candidates)

__all__ = ["Configuration", "ConfigError", "ConfigOption", "OPTIONS", "DEFAULTS_FILE", "MAX_JOB_GRAPH_BYTES",
           "TaskConfig", "check_slot_bounds", "format_size", "parse_duration_ms", "parse_size_bytes",
           "port_candidates"]

T = TypeVar("T")

# one Spark setting given on its own ("taskmanager.spark.conf.spark.executor.instances: 4"), as Flink
# passes "flink.hadoop.*"
_SPARK_CONF_PREFIX = SparkOptions.CONF.key + "."


def check_slot_bounds(min_slots: int, max_slots: int) -> None:
    if min_slots > max_slots:
        raise ConfigError(f"slotmanager.number-of-slots.min ({min_slots}) is above "
                          f"slotmanager.number-of-slots.max ({max_slots})")


class Configuration:
    """The value of every key: config.yaml's defaults, then the sources given in order (a file,
    overrides, a job's configuration), each value parsed by its option as it comes in."""

    def __init__(self, values: Optional[Mapping[str, Any]] = None, source: str = "configuration"):
        self._values: dict[str, Any] = {}
        self._explicit: set[str] = set()
        self.update(default_values(), str(DEFAULTS_FILE))
        self._explicit.clear()
        if values:
            self.update(values, source)

    @classmethod
    def from_file(cls, path: Path, overrides: Optional[Mapping[str, Any]] = None) -> "Configuration":
        conf = cls()
        conf.update(load_yaml(Path(path)), str(path))
        if overrides:
            conf.update(overrides, "overrides")
        return conf

    def update(self, values: Mapping[str, Any], source: str = "configuration") -> "Configuration":
        for key, raw in flatten(values, keep=OPTIONS).items():
            if key.startswith(_SPARK_CONF_PREFIX):  # one Spark setting: merged into the map
                key, raw = SparkOptions.CONF.key, {key[len(_SPARK_CONF_PREFIX):]: raw}
            option = OPTIONS.get(key)
            if option is None:
                close = [k for k in OPTIONS if k.split(".")[-1] == key.split(".")[-1]]
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"unknown configuration key {key!r} in {source}{hint}")
            previous = self._values.get(key)
            try:
                self._values[key] = option.parse(raw)
                if key == SparkOptions.CONF.key:  # later sources add to (or override) earlier ones, key by key
                    self._values[key] = (previous or {}) | self._values[key]
            except ValueError as exc:
                raise ConfigError(f"invalid value {raw!r} for {key!r} in {source}: expected {exc}") from None
            self._explicit.add(key)
        return self

    def is_set(self, key: str) -> bool:
        """Given explicitly (not only by the defaults file)."""
        return key in self._explicit

    def __getitem__(self, key: str) -> Any:
        if key not in OPTIONS:
            raise KeyError(f"unknown configuration key {key!r}")
        return self._values[key]

    @overload
    def get(self, key: ConfigOption[T]) -> T: ...

    @overload
    def get(self, key: str, default: Any = None) -> Any: ...

    def get(self, key: Union[ConfigOption[Any], str], default: Any = None) -> Any:
        """``get(RestOptions.PORT)``: the option's value, of its type (every key has one: its
        default at least). ``get("rest.port", default)``: the value by key, untyped (as
        ``conf["rest.port"]``, which refuses an unknown key)."""
        if isinstance(key, ConfigOption):
            return self._values[key.key]
        return self._values.get(key, default)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def copy(self) -> "Configuration":
        conf = Configuration.__new__(Configuration)
        conf._values = dict(self._values)
        conf._explicit = set(self._explicit)
        return conf

    def write(self, path: Path) -> None:
        """The keys given explicitly; defaults stay defaults (Flink's rules depend on what was set)."""
        Path(path).write_text(yaml.safe_dump({k: self._values[k] for k in sorted(self._explicit)}))


def _option(option: ConfigOption[Any]) -> Any:
    return field(metadata={"key": option.key, "option": option})


@dataclass(frozen=True)
class TaskConfig:
    """What a task and its operators read of the job's configuration, parsed once per task.

    Each field names its option; its type and default are the option's (config.yaml's)."""

    checkpoint_interval_ms: int = _option(CheckpointingOptions.INTERVAL)
    checkpointing_mode: str = _option(CheckpointingOptions.MODE)
    batch_size: int = _option(ExecutionOptions.BATCH_SIZE)
    buffer_timeout_ms: int = _option(ExecutionOptions.BUFFER_TIMEOUT)
    watermark_interval_ms: int = _option(PipelineOptions.AUTO_WATERMARK_INTERVAL)
    state_backend: str = _option(StateBackendOptions.STATE_BACKEND)
    tmp_dir: str = _option(CoreOptions.TMP_DIRS)
    spark_master: str = _option(SparkOptions.MASTER)
    spark_driver_memory: str = _option(SparkOptions.DRIVER_MEMORY)
    spark_executor_cores: int = _option(SparkOptions.EXECUTOR_CORES)
    spark_executor_memory: str = _option(SparkOptions.EXECUTOR_MEMORY)
    spark_cores_max: int = _option(SparkOptions.CORES_MAX)
    # the address executors of a Spark cluster reach the TaskManager's driver at, and its bind address
    host: str = _option(TaskManagerOptions.HOST)
    bind_host: str = _option(TaskManagerOptions.BIND_HOST)
    spark_max_batch_rows: int = _option(SparkOptions.MAX_BATCH_ROWS)
    spark_max_batch_bytes: int = _option(SparkOptions.MAX_BATCH_SIZE)
    spark_local_batch_rows: int = _option(SparkOptions.LOCAL_BATCH_ROWS)
    spark_max_concurrent_batches: int = _option(SparkOptions.MAX_CONCURRENT_BATCHES)
    spark_fuse_subtasks: bool = _option(SparkOptions.FUSE_SUBTASKS)
    spark_arrow_projections: bool = _option(SparkOptions.ARROW_PROJECTIONS)
    spark_properties: dict[str, str] = _option(SparkOptions.CONF)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "the job configuration") -> "TaskConfig":
        """From a deployment's job configuration (a ConfigError names a bad key and ``source``)."""
        return cls.from_configuration(Configuration(values, source))

    @classmethod
    def from_configuration(cls, conf: Configuration) -> "TaskConfig":
        return cls(**{f.name: conf.get(f.metadata["option"]) for f in fields(cls)})

    @property
    def spark_local(self) -> bool:
        """The session runs its plans in its own JVM (not on a cluster's executors)."""
        return self.spark_master.startswith("local")

    @property
    def checkpointing(self) -> bool:
        return self.checkpoint_interval_ms > 0

    @property
    def exactly_once(self) -> bool:
        return self.checkpointing_mode == "EXACTLY_ONCE"
