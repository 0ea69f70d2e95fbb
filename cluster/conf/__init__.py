"""Configuration: one YAML file with Flink's key names, validated key by key.

Every key the cluster understands is declared in OPTIONS with its type and default. An unknown
key or a value of the wrong kind is a ConfigError that names the key and where it came from,
never a silent no-op. ``TaskConfig`` is the typed part of a job's configuration that tasks and
operators read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import yaml

from cluster.protocol.codec import MAX_HEADER_BYTES

DEFAULTS_FILE = Path(__file__).with_name("config.yaml")

# A job graph travels whole in one control message (SubmitJob), and each vertex of it again in a
# task's deployment, whose other fields (configuration, channels, restore plan) need room too: the
# largest graph a cluster may accept stays this far below the wire's header cap, so a graph the
# client lets through is never refused by a codec as "header too large".
ENVELOPE_RESERVE_BYTES = 1 << 20
MAX_JOB_GRAPH_BYTES = MAX_HEADER_BYTES - ENVELOPE_RESERVE_BYTES


class ConfigError(ValueError):
    pass


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|milli|millis|s|sec|secs|second|seconds|min|m|minute|minutes|h|hour|hours)?\s*$")
_UNIT_MS = {None: 1, "ms": 1, "milli": 1, "millis": 1, "s": 1000, "sec": 1000, "secs": 1000,
            "second": 1000, "seconds": 1000, "m": 60000, "min": 60000, "minute": 60000,
            "minutes": 60000, "h": 3600000, "hour": 3600000, "hours": 3600000}


def check_slot_bounds(min_slots: int, max_slots: int) -> None:
    if min_slots > max_slots:
        raise ConfigError(f"slotmanager.number-of-slots.min ({min_slots}) is above "
                          f"slotmanager.number-of-slots.max ({max_slots})")


def parse_duration_ms(value: Any) -> int:
    """Flink's duration notation ("500 ms", "10 s", "1 min") or a plain number of milliseconds."""
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, (int, float)):
        return int(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError('a duration such as "500 ms", "10 s" or "1 min"')
    return int(float(m.group(1)) * _UNIT_MS[m.group(2)])


def _positive_duration_ms(value: Any) -> int:
    ms = parse_duration_ms(value)
    if ms <= 0:
        raise ValueError("a duration above 0")
    return ms


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
# Flink's MemorySize units: powers of 1024 whatever the spelling ("64 mb" is 64 MiB)
_UNIT_BYTES = {"": 1, "b": 1, "bytes": 1, "k": 1 << 10, "kb": 1 << 10, "kibibytes": 1 << 10,
               "m": 1 << 20, "mb": 1 << 20, "mebibytes": 1 << 20, "g": 1 << 30, "gb": 1 << 30,
               "gibibytes": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tebibytes": 1 << 40}


def parse_size_bytes(value: Any) -> int:
    """Flink's memory size notation ("64 mb", "512k", "1 gb") or a plain number of bytes."""
    if isinstance(value, bool):
        raise ValueError("a size, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size >= 0")
        return value
    m = _SIZE.match(str(value))
    if not m or m.group(2).lower() not in _UNIT_BYTES:
        raise ValueError('a size such as "64 mb", "512 kb" or a number of bytes')
    return int(float(m.group(1)) * _UNIT_BYTES[m.group(2).lower()])


def format_size(size: int) -> str:
    """A byte count as a person reads it, in Flink's binary units ("63.9 mb")."""
    for unit, scale in (("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _size(minimum: int = 0, maximum: Optional[int] = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        size = parse_size_bytes(value)
        if size < minimum or (maximum is not None and size > maximum):
            if maximum is None:
                raise ValueError(f"a size of at least {format_size(minimum)}")
            raise ValueError(f"a size between {format_size(minimum)} and {format_size(maximum)} ({maximum} bytes)")
        return size
    return parse


def _seconds(value: Any) -> int:
    """Flink's jobstore.expiration-time: a plain number is seconds; a duration ("1 h") also works."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    seconds = int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else parse_duration_ms(value) // 1000
    if seconds < 1:
        raise ValueError("at least 1 second")
    return seconds


def _int(minimum: Optional[int] = None, maximum: Optional[int] = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError("an integer")
        try:
            number = int(value)
        except ValueError:
            raise ValueError("an integer") from None
        if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
            raise ValueError(f"an integer in [{minimum}, {maximum if maximum is not None else '...'}]")
        return number
    return parse


def _str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("a non-empty string")
    return value


def _str_or_empty(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError("a string")
    return value


def _str_list(value: Any) -> list[str]:
    """A YAML list of strings, or Flink's notation for lists in one string ("a;b", also "a,b")."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [part for part in re.split(r"[;,]", value)]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("a list of strings")
    return [v.strip() for v in value if v.strip()]


_PORT_RANGE_HELP = ('a port, a list of ports ("50100,50101"), a range ("50100-50200") or a combination of '
                    'both, each port in [0, 65535] (0: any free port)')


def _port_range(value: Any) -> str:
    """Flink's port-range notation (rest.bind-port), kept as its canonical text; ``port_candidates``
    reads it. Empty: the key is not set (rest.port is bound)."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(_PORT_RANGE_HELP)
    parts = []
    for part in str(value).split(","):
        low, dash, high = (p.strip() for p in part.partition("-"))
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{_PORT_RANGE_HELP}; {part.strip()!r} is not one")
        first, last = int(low), int(high) if dash else int(low)
        if last > 65535:
            raise ValueError(f"{_PORT_RANGE_HELP}; {part.strip()!r} is beyond 65535")
        if first > last:
            raise ValueError(f"{_PORT_RANGE_HELP}; the range {part.strip()!r} runs backwards")
        parts.append(f"{first}-{last}" if dash else str(first))
    return ",".join(parts)


def port_candidates(spec: str) -> Iterator[int]:
    """The ports of a canonical port range (``_port_range``), in the order a server tries them."""
    for part in spec.split(","):
        low, _, high = part.partition("-")
        yield from range(int(low), int(high or low) + 1)


def _enum_exact(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).upper().replace("-", "_") if isinstance(value, str) else ""
        if text not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return text
    return parse


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError("true or false")


def _enum(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).lower() if not isinstance(value, bool) else ""
        if text not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return text
    return parse


# Spark's own settings of each TaskManager's session, passed through under this key, as a map or
# one by one ("taskmanager.spark.conf.spark.executor.instances: 4"), as Flink passes "flink.hadoop.*".
SPARK_CONF = "taskmanager.spark.conf"
SPARK_CONF_PREFIX = SPARK_CONF + "."
# Spark keys that streamlab keys set: one way to say each, so that the two cannot disagree
_SPARK_KEYS_OF_OURS = {"spark.master": "taskmanager.spark.master",
                       "spark.driver.memory": "taskmanager.spark.driver-memory",
                       "spark.executor.cores": "taskmanager.spark.executor-cores",
                       "spark.executor.memory": "taskmanager.spark.executor-memory",
                       "spark.cores.max": "taskmanager.spark.cores-max"}

_SPARK_MASTER = re.compile(r"^(local(\[(\*|[1-9]\d*)(,\d+)?\])?"
                           r"|spark://[^\s:/,]+:\d{1,5}(,[^\s:/,]+:\d{1,5})*"
                           r"|k8s://\S+|yarn)$")


def _spark_master(value: Any) -> str:
    if not isinstance(value, str) or not _SPARK_MASTER.match(value.strip()):
        raise ValueError("a Spark master: local, local[N], local[*], spark://HOST:PORT (a standalone cluster; "
                         "several masters comma-separated), k8s://https://HOST:PORT or yarn")
    return value.strip()


def _spark_memory(value: Any) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not re.match(r"^\d+[kmgt]?$", value.strip().lower()):
        raise ValueError('a JVM memory size as Spark writes it, such as "512m" or "2g"')
    return value.strip().lower()


def _spark_properties(value: Any) -> dict[str, str]:
    """A map of Spark's own settings by Spark's names (nested maps joined with dots)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("a map of Spark settings, such as {spark.executor.instances: 4}")
    return dict(sorted(_spark_property(key, raw) for key, raw in _flatten(value, "", nested=True).items()))


def _spark_property(key: str, value: Any) -> tuple[str, str]:
    if not key.startswith("spark."):
        raise ValueError(f"Spark settings, whose names start with 'spark.' (not {key!r})")
    if key in _SPARK_KEYS_OF_OURS:
        raise ValueError(f"no {key} here: {_SPARK_KEYS_OF_OURS[key]!r} sets it")
    if isinstance(value, bool):
        return key, str(value).lower()
    if not isinstance(value, (str, int, float)) or value == "":
        raise ValueError(f"a string or a number for {key}")
    return key, str(value)


@dataclass(frozen=True)
class ConfigOption:
    key: str
    parse: Callable[[Any], Any]
    description: str


OPTIONS: dict[str, ConfigOption] = {
    o.key: o
    for o in [
        ConfigOption("jobmanager.rpc.address", _str, "Host the JobManager is reached at (advertised to TaskManagers and clients)."),
        ConfigOption("jobmanager.bind-host", _str_or_empty,
                     "Address the JobManager's rpc and events sockets bind to, e.g. 0.0.0.0 in a container "
                     "(empty: jobmanager.rpc.address)."),
        ConfigOption("jobmanager.rpc.port", _int(0, 65535), "JobManager control port (0: any free port)."),
        ConfigOption("jobmanager.events.port", _int(0, 65535),
                     "Port the JobManager publishes job events on, beside its control port (0: any free port)."),
        ConfigOption("rest.address", _str, "Host the REST API is reached at (advertised to clients)."),
        ConfigOption("rest.bind-address", _str_or_empty,
                     "Address the REST API binds to, e.g. 0.0.0.0 in a container (empty: rest.address)."),
        ConfigOption("rest.port", _int(0, 65535), "REST API port (0: any free port)."),
        ConfigOption("rest.bind-port", _port_range,
                     "Ports the REST API binds, the first free one: a list (\"50100,50101\"), a range "
                     "(\"50100-50200\") or both, so several JobManagers of one host share a configuration "
                     "(empty: rest.port)."),
        ConfigOption("rest.auth", _enum("all", "mutating"),
                     "Routes that need the REST token: all, or only mutating ones (read-only GETs open)."),
        ConfigOption("rest.allowed-hosts", _str_list,
                     "Host header names the REST API answers besides localhost, loopback and rest.address "
                     "(DNS rebinding guard); \"*\" allows any."),
        ConfigOption("rest.server.max-content-length", _int(1, 2**31 - 1),
                     "Largest request body the REST API accepts, in bytes (larger: 413 before it is read)."),
        ConfigOption("taskmanager.host", _str, "Host a TaskManager is reached at by the other TaskManagers (advertised)."),
        ConfigOption("taskmanager.bind-host", _str_or_empty,
                     "Address a TaskManager's data socket binds to, e.g. 0.0.0.0 in a container "
                     "(empty: taskmanager.host)."),
        ConfigOption("security.ssl.internal.enabled", _bool,
                     "Encrypt and mutually authenticate every ZeroMQ socket between cluster processes and "
                     "clients with CurveZMQ, keys derived from the cluster secret (Flink's switch for TLS "
                     "on internal connections); every process of the cluster must set the same value."),
        ConfigOption("taskmanager.data.port", _int(0, 65535), "TaskManager data port (0: any free port)."),
        ConfigOption("taskmanager.numberOfTaskSlots", _int(1, 1024), "Slots per TaskManager."),
        ConfigOption("taskmanager.network.memory.buffers-per-channel", _int(1, 1024),
                     "Credits a consumer grants each input channel."),
        ConfigOption("parallelism.default", _int(1, 32768), "Parallelism of operators that set none."),
        ConfigOption("pipeline.name", _str_or_empty, "The job's name (empty: the one the program gives)."),
        ConfigOption("pipeline.max-parallelism", _int(1, 32768), "Number of key groups."),
        # Flink's nearest key is pekko.framesize (the largest RPC message); ours names what it
        # limits, because the job graph (pickled user functions) is what users make too large.
        ConfigOption("pipeline.jobgraph.max-size", _size(1 << 10, MAX_JOB_GRAPH_BYTES),
                     "Largest job graph (pickled user functions included) a client sends and the "
                     "JobManager accepts; cluster-wide."),
        ConfigOption("jobstore.max-capacity", _int(1, 2**31 - 1),
                     "Finished jobs the JobManager keeps for REST and the CLI (oldest dropped first)."),
        ConfigOption("jobstore.expiration-time", _seconds,
                     "Seconds a finished job is kept for REST and the CLI."),
        ConfigOption("log.file.max-size", _size(1 << 10),
                     "Size at which a JobManager or TaskManager log file is rolled over."),
        ConfigOption("log.file.max-backups", _int(1, 1000),
                     "Rolled-over log files kept per process (<name>.log.1 ... .N)."),
        ConfigOption("heartbeat.interval", parse_duration_ms, "TaskManager heartbeat interval."),
        ConfigOption("heartbeat.timeout", parse_duration_ms, "A TaskManager silent this long is lost."),
        ConfigOption("task.cancellation.interval", _positive_duration_ms,
                     "How often a TaskManager interrupts a cancelling task again until it stops."),
        ConfigOption("task.cancellation.timeout", parse_duration_ms,
                     "A cancelling task not stopped after this long is a fatal error of its TaskManager, "
                     "which restarts (0: never)."),
        ConfigOption("cluster.evenly-spread-out-slots", _bool,
                     "Spread a job's slots over all TaskManagers (false: fill one TaskManager first, as Flink)."),
        ConfigOption("high-availability.type", _enum("none", "zookeeper"),
                     "none: one JobManager, its jobs die with it; zookeeper: JobManagers elect a leader in "
                     "ZooKeeper and a standby that wins recovers every running job."),
        ConfigOption("high-availability.zookeeper.quorum", _str_or_empty,
                     "ZooKeeper servers, host:port[,host:port...] (required with high-availability.type zookeeper)."),
        ConfigOption("high-availability.zookeeper.path.root", _str,
                     "ZooKeeper node under which every cluster keeps its HA data."),
        ConfigOption("high-availability.cluster-id", _str,
                     "Names this cluster's HA data under the root node: clusters sharing a ZooKeeper differ in it."),
        ConfigOption("high-availability.storageDir", _str_or_empty,
                     "Folder for the HA payloads (job graphs) ZooKeeper points to; every JobManager must reach it "
                     "(empty: <cluster-dir>/ha)."),
        ConfigOption("high-availability.zookeeper.client.session-timeout", _positive_duration_ms,
                     "ZooKeeper session timeout: how long a dead leader still holds leadership."),
        ConfigOption("high-availability.zookeeper.client.connection-timeout", _positive_duration_ms,
                     "How long a JobManager or TaskManager waits to connect to ZooKeeper at start."),
        ConfigOption("resourcemanager.provider", _enum("standalone", "process"),
                     "standalone: hand out the slots of the TaskManagers that registered; process: also "
                     "start TaskManager processes on this machine when requests wait for slots."),
        ConfigOption("slotmanager.number-of-slots.max", _int(1),
                     "Most slots in the cluster; an active ResourceManager starts no TaskManager beyond."),
        ConfigOption("slotmanager.number-of-slots.min", _int(0),
                     "Slots an active ResourceManager keeps started, jobs or not."),
        ConfigOption("resourcemanager.taskmanager-timeout", _positive_duration_ms,
                     "An active ResourceManager stops a TaskManager it started that held no slot this long."),
        ConfigOption("resourcemanager.taskmanager-registration.timeout", _positive_duration_ms,
                     "A TaskManager an active ResourceManager started and that is not registered after this "
                     "long is stopped (and replaced if still needed)."),
        ConfigOption("slot.request.timeout", parse_duration_ms,
                     "How long a job waits for enough free slots before it fails."),
        ConfigOption("restart-strategy.type", _enum("none", "fixed-delay", "exponential-delay"),
                     "What a job does after a failure."),
        ConfigOption("restart-strategy.fixed-delay.attempts", _int(0), "Restarts before the job fails."),
        ConfigOption("restart-strategy.fixed-delay.delay", parse_duration_ms, "Delay before each restart."),
        ConfigOption("restart-strategy.exponential-delay.initial-backoff", parse_duration_ms, "First delay."),
        ConfigOption("restart-strategy.exponential-delay.max-backoff", parse_duration_ms, "Largest delay."),
        ConfigOption("restart-strategy.exponential-delay.backoff-multiplier",
                     lambda v: float(_float(v, 1.0)), "Delay growth per restart."),
        ConfigOption("restart-strategy.exponential-delay.attempts-before-reset-backoff", _int(0),
                     "Restarts before the job fails."),
        ConfigOption("metrics.fetcher.update-interval", parse_duration_ms,
                     "How often TaskManagers report task metrics (and heartbeat)."),
        ConfigOption("taskmanager.spark.startup", _enum("eager", "lazy"),
                     "eager: start the SparkSession when the TaskManager starts; lazy: on the first Spark task."),
        ConfigOption("taskmanager.spark.master", _spark_master,
                     "Spark master of each TaskManager's session: local[N], or a cluster (spark://HOST:PORT, "
                     "k8s://https://HOST:PORT, yarn) whose executors run the per-batch plans."),
        ConfigOption("taskmanager.spark.driver-memory", _str, "JVM heap of each TaskManager's SparkSession."),
        ConfigOption("taskmanager.spark.executor-cores", _int(0),
                     "spark.executor.cores of each TaskManager's Spark application on a cluster (0: Spark's default)."),
        ConfigOption("taskmanager.spark.executor-memory", _spark_memory,
                     "spark.executor.memory of each TaskManager's Spark application on a cluster (empty: Spark's default)."),
        ConfigOption("taskmanager.spark.cores-max", _int(0),
                     "spark.cores.max: most executor cores one TaskManager's application takes from a standalone "
                     "cluster (0: Spark's default, every free core, which leaves none for the next TaskManager)."),
        ConfigOption(SPARK_CONF, _spark_properties,
                     "Spark's own settings of each TaskManager's session, by Spark's names (a map, or one "
                     "key each: taskmanager.spark.conf.spark.executor.instances)."),
        ConfigOption("execution.spark.max-batch-rows", _int(1),
                     "Most rows one Spark job of a task takes (the input that waits while Spark is busy)."),
        ConfigOption("execution.spark.max-batch-size", _size(1),
                     "Most bytes one Spark job of a task takes (never more than a sixteenth of "
                     "taskmanager.spark.driver-memory, which bounds a TaskManager's jobs together)."),
        ConfigOption("execution.spark.local-batch-rows", _int(0),
                     "Batches of a .sql chain of projections and filters up to this many rows run in the "
                     "TaskManager's Spark driver, without a Spark job (0: every batch is a Spark job)."),
        ConfigOption("execution.spark.max-concurrent-batches", _int(1, 8),
                     "Spark jobs of one task in flight at once (results keep their order)."),
        ConfigOption("execution.spark.fuse-subtasks", _bool,
                     "One Spark job for the waiting batches of a chain's subtasks that share a TaskManager, "
                     "when the chain's plan keeps each input partition's rows apart (filters, projections)."),
        ConfigOption("execution.checkpointing.interval", parse_duration_ms,
                     "Time between checkpoints (0: checkpointing off)."),
        ConfigOption("execution.checkpointing.mode", _enum_exact("EXACTLY_ONCE", "AT_LEAST_ONCE"),
                     "EXACTLY_ONCE aligns barriers; AT_LEAST_ONCE does not."),
        ConfigOption("execution.checkpointing.timeout", parse_duration_ms, "A checkpoint not done by then is aborted."),
        ConfigOption("execution.checkpointing.min-pause", parse_duration_ms,
                     "Least time between the end of one checkpoint and the start of the next."),
        ConfigOption("execution.checkpointing.max-concurrent-checkpoints", _int(1), "Checkpoints pending at once."),
        ConfigOption("execution.checkpointing.dir", _str_or_empty,
                     "Where checkpoints go (empty: <cluster dir>/checkpoints)."),
        ConfigOption("state.savepoints.dir", _str_or_empty, "Default savepoint folder (empty: <cluster dir>/savepoints)."),
        ConfigOption("state.savepoints.allowed-dirs", _str_list,
                     "Folders besides state.savepoints.dir (and below) that REST may write savepoints to."),
        ConfigOption("state.checkpoints.num-retained", _int(1), "Completed checkpoints kept."),
        ConfigOption("state.backend.type", _enum("hashmap", "heap", "rocksdb"), "Keyed state backend."),
        ConfigOption("execution.savepoint.path", _str_or_empty, "Savepoint (or checkpoint) a job starts from."),
        ConfigOption("execution.savepoint.ignore-unclaimed-state", _bool,
                     "Start from a savepoint even if some of its state fits no operator of the job (an operator "
                     "removed, or of another kind under the same uid): that state is left out (Flink's -n)."),
        ConfigOption("io.tmp.dirs", _str_or_empty, "Working directory of TaskManagers (RocksDB); empty: the system's."),
        ConfigOption("pipeline.auto-watermark-interval", parse_duration_ms,
                     "How often sources emit watermarks (0: after every batch they read, deterministic)."),
        ConfigOption("execution.buffer-timeout", parse_duration_ms,
                     "Longest a partly filled batch waits before it is sent."),
        ConfigOption("execution.batch-size", _int(1), "Rows at which a batch is sent at once."),
    ]
}


def _float(value: Any, minimum: float) -> float:
    if isinstance(value, bool):
        raise ValueError("a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("a number") from None
    if number < minimum:
        raise ValueError(f"a number >= {minimum}")
    return number


def _flatten(data: Mapping, prefix: str = "", nested: bool = False) -> dict[str, Any]:
    # Flink accepts both "a.b.c: v" and nested maps; so do we. A map-valued option stays a map
    # (unless ``nested``: the map's own nesting).
    flat: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and (nested or full not in OPTIONS):
            flat.update(_flatten(value, full + ".", nested))
        else:
            flat[full] = value
    return flat


class Configuration:
    def __init__(self, values: Optional[Mapping[str, Any]] = None, source: str = "configuration"):
        self._values: dict[str, Any] = {}
        self._explicit: set[str] = set()
        self.update(_defaults(), str(DEFAULTS_FILE))
        self._explicit.clear()
        if values:
            self.update(values, source)

    @classmethod
    def from_file(cls, path: Path, overrides: Optional[Mapping[str, Any]] = None) -> "Configuration":
        conf = cls()
        conf.update(_load_yaml(Path(path)), str(path))
        if overrides:
            conf.update(overrides, "overrides")
        return conf

    def update(self, values: Mapping[str, Any], source: str = "configuration") -> "Configuration":
        for key, raw in _flatten(values).items():
            if key.startswith(SPARK_CONF_PREFIX):  # one Spark setting: merged into the map
                key, raw = SPARK_CONF, {key[len(SPARK_CONF_PREFIX):]: raw}
            option = OPTIONS.get(key)
            if option is None:
                close = [k for k in OPTIONS if k.split(".")[-1] == key.split(".")[-1]]
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"unknown configuration key {key!r} in {source}{hint}")
            previous = self._values.get(key)
            try:
                self._values[key] = option.parse(raw)
                if key == SPARK_CONF:  # later sources add to (or override) earlier ones, key by key
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

    def get(self, key: str, default: Any = None) -> Any:
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


@lru_cache(maxsize=1)
def _defaults() -> Mapping[str, Any]:
    # read once per process: every task parses its job's configuration over these
    return _load_yaml(DEFAULTS_FILE)


def _key(name: str) -> Any:
    return field(metadata={"key": name})


@dataclass(frozen=True)
class TaskConfig:
    """What a task and its operators read of the job's configuration, parsed once per task.

    Each field names its key; its type and default are the key's (OPTIONS, config.yaml)."""

    checkpoint_interval_ms: int = _key("execution.checkpointing.interval")
    checkpointing_mode: str = _key("execution.checkpointing.mode")
    batch_size: int = _key("execution.batch-size")
    buffer_timeout_ms: int = _key("execution.buffer-timeout")
    watermark_interval_ms: int = _key("pipeline.auto-watermark-interval")
    state_backend: str = _key("state.backend.type")
    tmp_dir: str = _key("io.tmp.dirs")
    spark_master: str = _key("taskmanager.spark.master")
    spark_driver_memory: str = _key("taskmanager.spark.driver-memory")
    spark_executor_cores: int = _key("taskmanager.spark.executor-cores")
    spark_executor_memory: str = _key("taskmanager.spark.executor-memory")
    spark_cores_max: int = _key("taskmanager.spark.cores-max")
    # the address executors of a Spark cluster reach the TaskManager's driver at, and its bind address
    host: str = _key("taskmanager.host")
    bind_host: str = _key("taskmanager.bind-host")
    spark_max_batch_rows: int = _key("execution.spark.max-batch-rows")
    spark_max_batch_bytes: int = _key("execution.spark.max-batch-size")
    spark_local_batch_rows: int = _key("execution.spark.local-batch-rows")
    spark_max_concurrent_batches: int = _key("execution.spark.max-concurrent-batches")
    spark_fuse_subtasks: bool = _key("execution.spark.fuse-subtasks")
    spark_properties: dict[str, str] = _key(SPARK_CONF)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "the job configuration") -> "TaskConfig":
        """From a deployment's job configuration (a ConfigError names a bad key and ``source``)."""
        return cls.from_configuration(Configuration(values, source))

    @classmethod
    def from_configuration(cls, conf: Configuration) -> "TaskConfig":
        return cls(**{f.name: conf[f.metadata["key"]] for f in fields(cls)})

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


def _load_yaml(path: Path) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path} must be a map of configuration keys")
    return data
