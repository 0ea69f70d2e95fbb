"""Every configuration key, one typed option each, as Flink's ConfigOptions.

An option names its key (Flink's where Flink has the key), how its value is read (the parser,
whose return type is the option's type: ``ConfigOption[int]``), and what it means; its default is
the one config.yaml gives, so that file stays the one list of defaults a user reads. The options
are grouped in holder classes as Flink's (JobManagerOptions, RestOptions, CheckpointingOptions,
...); ``Configuration.get(RestOptions.PORT)`` is typed ``int`` for mypy. OPTIONS maps each key to
its option, for the code that meets keys as text (a configuration file, a magic's arguments).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, TypeVar

from cluster.conf.parsers import (boolean, constant_of, fraction, int_in, load_yaml, non_empty_str, number_at_least,
                                  one_of, parse_duration_ms, port_range, positive_duration_ms, seconds, size_in,
                                  spark_master, spark_memory, spark_properties, str_list, str_or_empty)
from cluster.protocol.codec import MAX_HEADER_BYTES

T = TypeVar("T")

DEFAULTS_FILE = Path(__file__).with_name("config.yaml")

# A job graph travels whole in one control message (SubmitJob), and each vertex of it again in a
# task's deployment, whose other fields (configuration, channels, restore plan) need room too: the
# largest graph a cluster may accept stays this far below the wire's header cap, so a graph the
# client lets through is never refused by a codec as "header too large".
ENVELOPE_RESERVE_BYTES = 1 << 20
MAX_JOB_GRAPH_BYTES = MAX_HEADER_BYTES - ENVELOPE_RESERVE_BYTES


@lru_cache(maxsize=1)
def default_values() -> Mapping[str, Any]:
    """config.yaml as written (unparsed); read once per process: every task parses its job's
    configuration over these."""
    return load_yaml(DEFAULTS_FILE)


@dataclass(frozen=True)
class ConfigOption(Generic[T]):
    key: str
    parse: Callable[[Any], T]  # raises ValueError saying what it expected
    description: str

    @property
    def default(self) -> T:
        """config.yaml's value, parsed."""
        return self.parse(default_values()[self.key])


class JobManagerOptions:
    """The JobManager's addresses, its store of finished jobs, and how long a job waits for slots."""
    ADDRESS = ConfigOption(
        "jobmanager.rpc.address", non_empty_str,
        "Host the JobManager is reached at (advertised to TaskManagers and clients).")
    BIND_HOST = ConfigOption(
        "jobmanager.bind-host", str_or_empty,
        "Address the JobManager's rpc and events sockets bind to, e.g. 0.0.0.0 in a container (empty: "
        "jobmanager.rpc.address).")
    PORT = ConfigOption(
        "jobmanager.rpc.port", int_in(0, 65535), "JobManager control port (0: any free port).")
    EVENTS_PORT = ConfigOption(
        "jobmanager.events.port", int_in(0, 65535),
        "Port the JobManager publishes job events on, beside its control port (0: any free port).")
    JOB_STORE_MAX_CAPACITY = ConfigOption(
        "jobstore.max-capacity", int_in(1, 2**31 - 1),
        "Finished jobs the JobManager keeps for REST and the CLI (oldest dropped first).")
    JOB_STORE_EXPIRATION_TIME = ConfigOption(
        "jobstore.expiration-time", seconds, "Seconds a finished job is kept for REST and the CLI.")
    SLOT_REQUEST_TIMEOUT = ConfigOption(
        "slot.request.timeout", parse_duration_ms,
        "How long a job waits for enough free slots before it fails.")


class RestOptions:
    """The REST API: where it listens and whom it answers."""
    ADDRESS = ConfigOption(
        "rest.address", non_empty_str, "Host the REST API is reached at (advertised to clients).")
    BIND_ADDRESS = ConfigOption(
        "rest.bind-address", str_or_empty,
        "Address the REST API binds to, e.g. 0.0.0.0 in a container (empty: rest.address).")
    PORT = ConfigOption("rest.port", int_in(0, 65535), "REST API port (0: any free port).")
    BIND_PORT = ConfigOption(
        "rest.bind-port", port_range,
        "Ports the REST API binds, the first free one: a list (\"50100,50101\"), a range (\"50100-50200\") "
        "or both, so several JobManagers of one host share a configuration (empty: rest.port).")
    AUTH = ConfigOption(
        "rest.auth", one_of("all", "mutating"),
        "Routes that need the REST token: all, or only mutating ones (read-only GETs open).")
    ALLOWED_HOSTS = ConfigOption(
        "rest.allowed-hosts", str_list,
        "Host header names the REST API answers besides localhost, loopback and rest.address (DNS rebinding "
        "guard); \"*\" allows any.")
    SERVER_MAX_CONTENT_LENGTH = ConfigOption(
        "rest.server.max-content-length", int_in(1, 2**31 - 1),
        "Largest request body the REST API accepts, in bytes (larger: 413 before it is read).")


class TaskManagerOptions:
    """A TaskManager: its addresses, slots, network credit and how it cancels tasks."""
    HOST = ConfigOption(
        "taskmanager.host", non_empty_str,
        "Host a TaskManager is reached at by the other TaskManagers (advertised).")
    BIND_HOST = ConfigOption(
        "taskmanager.bind-host", str_or_empty,
        "Address a TaskManager's data socket binds to, e.g. 0.0.0.0 in a container (empty: "
        "taskmanager.host).")
    DATA_PORT = ConfigOption(
        "taskmanager.data.port", int_in(0, 65535), "TaskManager data port (0: any free port).")
    NUM_TASK_SLOTS = ConfigOption("taskmanager.numberOfTaskSlots", int_in(1, 1024), "Slots per TaskManager.")
    NETWORK_BUFFERS_PER_CHANNEL = ConfigOption(
        "taskmanager.network.memory.buffers-per-channel", int_in(1, 1024),
        "Credits a consumer grants each input channel.")
    TASK_CANCELLATION_INTERVAL = ConfigOption(
        "task.cancellation.interval", positive_duration_ms,
        "How often a TaskManager interrupts a cancelling task again until it stops.")
    TASK_CANCELLATION_TIMEOUT = ConfigOption(
        "task.cancellation.timeout", parse_duration_ms,
        "A cancelling task not stopped after this long is a fatal error of its TaskManager, which restarts "
        "(0: never).")


class SecurityOptions:
    """Encryption of the cluster's own connections."""
    SSL_INTERNAL_ENABLED = ConfigOption(
        "security.ssl.internal.enabled", boolean,
        "Encrypt and mutually authenticate every ZeroMQ socket between cluster processes and clients with "
        "CurveZMQ, keys derived from the cluster secret (Flink's switch for TLS on internal connections); "
        "every process of the cluster must set the same value.")


class CoreOptions:
    """Defaults of every job and process."""
    DEFAULT_PARALLELISM = ConfigOption(
        "parallelism.default", int_in(1, 32768), "Parallelism of operators that set none.")
    TMP_DIRS = ConfigOption(
        "io.tmp.dirs", str_or_empty, "Working directory of TaskManagers (RocksDB); empty: the system's.")


class PipelineOptions:
    """A job as the program builds it."""
    NAME = ConfigOption("pipeline.name", str_or_empty, "The job's name (empty: the one the program gives).")
    MAX_PARALLELISM = ConfigOption("pipeline.max-parallelism", int_in(1, 32768), "Number of key groups.")
    # Flink's nearest key is pekko.framesize (the largest RPC message); ours names what it
    # limits, because the job graph (pickled user functions) is what users make too large.
    JOB_GRAPH_MAX_SIZE = ConfigOption(
        "pipeline.jobgraph.max-size", size_in(1 << 10, MAX_JOB_GRAPH_BYTES),
        "Largest job graph (pickled user functions included) a client sends and the JobManager accepts; "
        "cluster-wide.")
    AUTO_WATERMARK_INTERVAL = ConfigOption(
        "pipeline.auto-watermark-interval", parse_duration_ms,
        "How often sources emit watermarks (0: after every batch they read, deterministic).")


class LoggingOptions:
    """The log files of the cluster's processes (no Flink key: Flink leaves it to log4j)."""
    FILE_MAX_SIZE = ConfigOption(
        "log.file.max-size", size_in(1 << 10),
        "Size at which a JobManager or TaskManager log file is rolled over.")
    FILE_MAX_BACKUPS = ConfigOption(
        "log.file.max-backups", int_in(1, 1000),
        "Rolled-over log files kept per process (<name>.log.1 ... .N).")


class HeartbeatManagerOptions:
    """Heartbeats between TaskManagers and the JobManager."""
    HEARTBEAT_INTERVAL = ConfigOption(
        "heartbeat.interval", parse_duration_ms, "TaskManager heartbeat interval.")
    HEARTBEAT_TIMEOUT = ConfigOption(
        "heartbeat.timeout", parse_duration_ms, "A TaskManager silent this long is lost.")


class ClusterOptions:
    """How the cluster places slots."""
    EVENLY_SPREAD_OUT_SLOTS = ConfigOption(
        "cluster.evenly-spread-out-slots", boolean,
        "Spread a job's slots over all TaskManagers (false: fill one TaskManager first, as Flink).")


class HighAvailabilityOptions:
    """JobManager high availability through ZooKeeper."""
    HA_MODE = ConfigOption(
        "high-availability.type", one_of("none", "zookeeper"),
        "none: one JobManager, its jobs die with it; zookeeper: JobManagers elect a leader in ZooKeeper and "
        "a standby that wins recovers every running job.")
    HA_ZOOKEEPER_QUORUM = ConfigOption(
        "high-availability.zookeeper.quorum", str_or_empty,
        "ZooKeeper servers, host:port[,host:port...] (required with high-availability.type zookeeper).")
    HA_ZOOKEEPER_ROOT = ConfigOption(
        "high-availability.zookeeper.path.root", non_empty_str,
        "ZooKeeper node under which every cluster keeps its HA data.")
    HA_CLUSTER_ID = ConfigOption(
        "high-availability.cluster-id", non_empty_str,
        "Names this cluster's HA data under the root node: clusters sharing a ZooKeeper differ in it.")
    HA_STORAGE_PATH = ConfigOption(
        "high-availability.storageDir", str_or_empty,
        "Folder for the HA payloads (job graphs) ZooKeeper points to; every JobManager must reach it "
        "(empty: <cluster-dir>/ha).")
    ZOOKEEPER_SESSION_TIMEOUT = ConfigOption(
        "high-availability.zookeeper.client.session-timeout", positive_duration_ms,
        "ZooKeeper session timeout: how long a dead leader still holds leadership.")
    ZOOKEEPER_CONNECTION_TIMEOUT = ConfigOption(
        "high-availability.zookeeper.client.connection-timeout", positive_duration_ms,
        "How long a JobManager or TaskManager waits to connect to ZooKeeper at start.")


class ResourceManagerOptions:
    """Slots and the TaskManagers an active ResourceManager starts."""
    PROVIDER = ConfigOption(
        "resourcemanager.provider", one_of("standalone", "process"),
        "standalone: hand out the slots of the TaskManagers that registered; process: also start "
        "TaskManager processes on this machine when requests wait for slots.")
    MAX_SLOT_NUM = ConfigOption(
        "slotmanager.number-of-slots.max", int_in(1),
        "Most slots in the cluster; an active ResourceManager starts no TaskManager beyond.")
    MIN_SLOT_NUM = ConfigOption(
        "slotmanager.number-of-slots.min", int_in(0),
        "Slots an active ResourceManager keeps started, jobs or not.")
    TASK_MANAGER_TIMEOUT = ConfigOption(
        "resourcemanager.taskmanager-timeout", positive_duration_ms,
        "An active ResourceManager stops a TaskManager it started that held no slot this long.")
    TASK_MANAGER_REGISTRATION_TIMEOUT = ConfigOption(
        "resourcemanager.taskmanager-registration.timeout", positive_duration_ms,
        "A TaskManager an active ResourceManager started and that is not registered after this long is "
        "stopped (and replaced if still needed).")


class RestartStrategyOptions:
    """What a job does after a failure."""
    RESTART_STRATEGY = ConfigOption(
        "restart-strategy.type", one_of("none", "fixed-delay", "exponential-delay"),
        "What a job does after a failure.")
    FIXED_DELAY_ATTEMPTS = ConfigOption(
        "restart-strategy.fixed-delay.attempts", int_in(0), "Restarts before the job fails.")
    FIXED_DELAY_DELAY = ConfigOption(
        "restart-strategy.fixed-delay.delay", parse_duration_ms, "Delay before each restart.")
    EXPONENTIAL_DELAY_INITIAL_BACKOFF = ConfigOption(
        "restart-strategy.exponential-delay.initial-backoff", parse_duration_ms, "First delay.")
    EXPONENTIAL_DELAY_MAX_BACKOFF = ConfigOption(
        "restart-strategy.exponential-delay.max-backoff", parse_duration_ms, "Largest delay.")
    EXPONENTIAL_DELAY_BACKOFF_MULTIPLIER = ConfigOption(
        "restart-strategy.exponential-delay.backoff-multiplier", number_at_least(1.0),
        "Delay growth per restart.")
    EXPONENTIAL_DELAY_ATTEMPTS = ConfigOption(
        "restart-strategy.exponential-delay.attempts-before-reset-backoff", int_in(0),
        "Restarts before the job fails, counted since the backoff was last reset.")
    EXPONENTIAL_DELAY_RESET_BACKOFF_THRESHOLD = ConfigOption(
        "restart-strategy.exponential-delay.reset-backoff-threshold", parse_duration_ms,
        "A run this long without a failure resets the backoff to its initial value.")
    EXPONENTIAL_DELAY_JITTER = ConfigOption(
        "restart-strategy.exponential-delay.jitter-factor", fraction,
        "Each delay moved by up to this fraction of it, either way, at random.")


class MetricOptions:
    """How often metrics are fetched."""
    METRIC_FETCHER_UPDATE_INTERVAL = ConfigOption(
        "metrics.fetcher.update-interval", parse_duration_ms,
        "How often TaskManagers report task metrics (and heartbeat).")


class SparkOptions:
    """The SparkSession of each TaskManager and how tasks hand batches to it (no Flink keys)."""
    STARTUP = ConfigOption(
        "taskmanager.spark.startup", one_of("eager", "lazy"),
        "eager: start the SparkSession when the TaskManager starts; lazy: on the first Spark task.")
    MASTER = ConfigOption(
        "taskmanager.spark.master", spark_master,
        "Spark master of each TaskManager's session: local[N], or a cluster (spark://HOST:PORT, "
        "k8s://https://HOST:PORT, yarn) whose executors run the per-batch plans.")
    DRIVER_MEMORY = ConfigOption(
        "taskmanager.spark.driver-memory", non_empty_str, "JVM heap of each TaskManager's SparkSession.")
    EXECUTOR_CORES = ConfigOption(
        "taskmanager.spark.executor-cores", int_in(0),
        "spark.executor.cores of each TaskManager's Spark application on a cluster (0: Spark's default).")
    EXECUTOR_MEMORY = ConfigOption(
        "taskmanager.spark.executor-memory", spark_memory,
        "spark.executor.memory of each TaskManager's Spark application on a cluster (empty: Spark's "
        "default).")
    CORES_MAX = ConfigOption(
        "taskmanager.spark.cores-max", int_in(0),
        "spark.cores.max: most executor cores one TaskManager's application takes from a standalone cluster "
        "(0: Spark's default, every free core, which leaves none for the next TaskManager).")
    CONF = ConfigOption(
        "taskmanager.spark.conf", spark_properties,
        "Spark's own settings of each TaskManager's session, by Spark's names (a map, or one key each: "
        "taskmanager.spark.conf.spark.executor.instances).")
    MAX_BATCH_ROWS = ConfigOption(
        "execution.spark.max-batch-rows", int_in(1),
        "Most rows one Spark job of a task takes (the input that waits while Spark is busy).")
    MAX_BATCH_SIZE = ConfigOption(
        "execution.spark.max-batch-size", size_in(1),
        "Most bytes one Spark job of a task takes (never more than a sixteenth of "
        "taskmanager.spark.driver-memory, which bounds a TaskManager's jobs together).")
    LOCAL_BATCH_ROWS = ConfigOption(
        "execution.spark.local-batch-rows", int_in(0),
        "Batches of a .sql chain of projections and filters up to this many rows run in the TaskManager's "
        "Spark driver, without a Spark job (0: every batch is a Spark job).")
    MAX_CONCURRENT_BATCHES = ConfigOption(
        "execution.spark.max-concurrent-batches", int_in(1, 8),
        "Spark jobs of one task in flight at once (results keep their order).")
    FUSE_SUBTASKS = ConfigOption(
        "execution.spark.fuse-subtasks", boolean,
        "One Spark job for the waiting batches of a chain's subtasks that share a TaskManager, when the "
        "chain's plan keeps each input partition's rows apart (filters, projections).")
    ARROW_PROJECTIONS = ConfigOption(
        "execution.spark.arrow-projections", boolean,
        "A .sql chain of projections and filters whose expressions Arrow's kernels compute as Spark does "
        "runs by Arrow, without the Spark JVM, once Spark's answer to a batch equalled Arrow's "
        "(cluster.spark.arrow_eval).")


class CheckpointingOptions:
    """Checkpoints and savepoints: when, where, how many."""
    INTERVAL = ConfigOption(
        "execution.checkpointing.interval", parse_duration_ms,
        "Time between checkpoints (0: checkpointing off).")
    MODE = ConfigOption(
        "execution.checkpointing.mode", constant_of("EXACTLY_ONCE", "AT_LEAST_ONCE"),
        "EXACTLY_ONCE aligns barriers; AT_LEAST_ONCE does not.")
    TIMEOUT = ConfigOption(
        "execution.checkpointing.timeout", parse_duration_ms, "A checkpoint not done by then is aborted.")
    MIN_PAUSE = ConfigOption(
        "execution.checkpointing.min-pause", parse_duration_ms,
        "Least time between the end of one checkpoint and the start of the next.")
    MAX_CONCURRENT_CHECKPOINTS = ConfigOption(
        "execution.checkpointing.max-concurrent-checkpoints", int_in(1), "Checkpoints pending at once.")
    CHECKPOINTS_DIRECTORY = ConfigOption(
        "execution.checkpointing.dir", str_or_empty,
        "Where checkpoints go (empty: <cluster dir>/checkpoints).")
    SAVEPOINT_DIRECTORY = ConfigOption(
        "state.savepoints.dir", str_or_empty, "Default savepoint folder (empty: <cluster dir>/savepoints).")
    ALLOWED_SAVEPOINT_DIRECTORIES = ConfigOption(
        "state.savepoints.allowed-dirs", str_list,
        "Folders besides state.savepoints.dir (and below) that REST may write savepoints to.")
    MAX_RETAINED_CHECKPOINTS = ConfigOption(
        "state.checkpoints.num-retained", int_in(1), "Completed checkpoints kept.")


class StateBackendOptions:
    """Where keyed state lives."""
    STATE_BACKEND = ConfigOption(
        "state.backend.type", one_of("hashmap", "heap", "rocksdb"), "Keyed state backend.")


class StateRecoveryOptions:
    """What a job starts from."""
    SAVEPOINT_PATH = ConfigOption(
        "execution.savepoint.path", str_or_empty, "Savepoint (or checkpoint) a job starts from.")
    SAVEPOINT_IGNORE_UNCLAIMED_STATE = ConfigOption(
        "execution.savepoint.ignore-unclaimed-state", boolean,
        "Start from a savepoint even if some of its state fits no operator of the job (an operator removed, "
        "or of another kind under the same uid): that state is left out (Flink's -n).")


class ExecutionOptions:
    """How records are batched between tasks."""
    BUFFER_TIMEOUT = ConfigOption(
        "execution.buffer-timeout", parse_duration_ms,
        "Longest a partly filled batch waits before it is sent.")
    BATCH_SIZE = ConfigOption("execution.batch-size", int_in(1), "Rows at which a batch is sent at once.")


class TableOptions:
    """How SQL over a stream keeps its state (Flink's ExecutionConfigOptions of the Table API)."""
    STATE_TTL = ConfigOption(
        "table.exec.state.ttl", parse_duration_ms,
        "How long a regular join of streams keeps a row after it arrived (0: for ever).")


def _by_key(*holders: type) -> dict[str, ConfigOption[Any]]:
    options: dict[str, ConfigOption[Any]] = {}
    for holder in holders:
        for option in vars(holder).values():
            if isinstance(option, ConfigOption):
                if option.key in options:
                    raise TypeError(f"two options for the key {option.key!r}")
                options[option.key] = option
    return options


# The order is the one "did you mean" hints look in (heartbeat.timeout before slot.request.timeout).
OPTIONS: dict[str, ConfigOption[Any]] = _by_key(
    HeartbeatManagerOptions, JobManagerOptions, RestOptions, TaskManagerOptions, SecurityOptions, CoreOptions,
    PipelineOptions, LoggingOptions, ClusterOptions, HighAvailabilityOptions, ResourceManagerOptions,
    RestartStrategyOptions, MetricOptions, SparkOptions, CheckpointingOptions, StateBackendOptions,
    StateRecoveryOptions, ExecutionOptions, TableOptions)
