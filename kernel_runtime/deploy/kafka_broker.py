"""A single-node Apache Kafka broker in KRaft mode (no ZooKeeper), for the tests, the notebooks
and ``streamlab kafka start``: Kafka's own jars from Maven Central, fetched once into a cache.

    python -m kernel_runtime.deploy.kafka_broker fetch     # what `make kafka-jars` runs

The jars come from ``kafka/pom.xml`` through ``mvn dependency:copy-dependencies`` into
``$STREAMLAB_KAFKA_HOME/libs`` (default ``$XDG_CACHE_HOME/streamlab/kafka-<version>/libs``, that is
``~/.cache/streamlab/...``); Maven's ~/.m2 is a cache too. A broker's directory holds its
``server.properties``, its storage (formatted by Kafka's StorageTool), its logs and
``broker.json`` (pid and port). docs/kafka.md says what matters in them and why.
"""
from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Optional

from kernel_runtime.deploy.ha import free_port

log = logging.getLogger(__name__)

POM = Path(__file__).parent / "kafka" / "pom.xml"
KAFKA_VERSION = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text()).group(1)  # type: ignore[union-attr]
START_TIMEOUT_S = 120.0
BROKER_FILE = "broker.json"  # the pid file: pid and port of the broker a directory holds

# A one-node cluster that starts fast and runs transactions: every internal topic has one replica
# and one partition (their defaults, 3 replicas and 50 partitions, cannot be met or are slow to
# create), a consumer group starts without waiting for more members, topics are made on purpose.
# A static quorum (controller.quorum.voters) needs no --standalone format and no voter changes.
SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data}
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
num.network.threads=2
num.io.threads=4
"""

# the broker logs to broker.log in its directory, warnings and up (INFO is a line per partition)
LOG4J2 = """\
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""

# C1 only and the serial collector: the broker is up in seconds and small; a test's load is light
JVM_OPTIONS = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


class KafkaSetupError(RuntimeError):
    pass


def streamlab_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamlab"


def kafka_home() -> Path:
    """Where the jars go: $STREAMLAB_KAFKA_HOME, or the cache's kafka-<version>."""
    given = os.environ.get("STREAMLAB_KAFKA_HOME")
    return Path(given) if given else streamlab_cache() / f"kafka-{KAFKA_VERSION}"


def default_broker_dir() -> Path:
    """The directory of ``streamlab kafka start`` when none is given."""
    return streamlab_cache() / "kafka-broker"


def ensure_kafka_jars() -> Path:
    """The folder of the broker's jars, fetched from Maven Central on the first call (and again
    when kafka/pom.xml changed). Processes that call it at once (pytest-xdist workers) fetch once:
    the others wait on a lock and find the stamp."""
    home = kafka_home()
    libs, stamp = home / "libs", home / ".fetched"
    if stamp.exists() and stamp.read_text() == POM.read_text():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == POM.read_text():
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaSetupError(f"Maven (mvn) is needed to fetch Apache Kafka {KAFKA_VERSION}'s jars into "
                                  f"{libs}: install Maven (make system-deps, or Debian's maven package)")
        stamp.unlink(missing_ok=True)
        shutil.rmtree(libs, ignore_errors=True)  # a version's jars never mix with another's
        done = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
                               f"-DoutputDirectory={libs}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise KafkaSetupError(f"fetching Apache Kafka {KAFKA_VERSION}'s jars with Maven ({POM}) failed:\n"
                                  f"{(done.stdout + done.stderr)[-3000:]}")
        stamp.write_text(POM.read_text())
    return libs


def random_cluster_id() -> str:
    """A KRaft cluster id as Kafka's Uuid.randomUuid() prints it: 16 bytes, URL-safe base64, no padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _java(libs: Path, log_config: Path, *args: str) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise KafkaSetupError("java is needed to run the Kafka broker: install Java 17+ (make system-deps)")
    return [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={log_config}", "-cp", f"{libs}/*", *args]


class KafkaBroker:
    """One broker (and its KRaft controller) in ``directory``, on free ports of 127.0.0.1.

    ``start()`` returns once the broker answers a metadata request; ``stop()`` ends it (SIGTERM,
    then SIGKILL if it lingers). ``from_dir`` finds one that another process started there.
    Thread use: any one thread."""

    def __init__(self, directory: os.PathLike | str):
        self.directory = Path(directory).resolve()
        self.process: Optional[subprocess.Popen] = None
        self.port: Optional[int] = None
        self.started_in: Optional[float] = None  # seconds from launching the JVM to the first answer
        self._pid: Optional[int] = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise KafkaSetupError(f"the Kafka broker in {self.directory} has not started")
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.directory / "broker.log"

    @property
    def properties_file(self) -> Path:
        return self.directory / "server.properties"

    def start(self, timeout: float = START_TIMEOUT_S) -> "KafkaBroker":
        """Format fresh storage and start the broker; a failure raises with the tail of its log."""
        if self.running():
            raise KafkaSetupError(f"the Kafka broker in {self.directory} is already running (pid {self.pid()})")
        libs = ensure_kafka_jars()
        self.directory.mkdir(parents=True, exist_ok=True)
        data = self.directory / "data"
        shutil.rmtree(data, ignore_errors=True)  # each start is a new cluster: no stale ids or topics
        for stale in ("broker.log", "broker.out", BROKER_FILE):
            (self.directory / stale).unlink(missing_ok=True)
        self.port, controller = free_port(), free_port()
        log_config = self.directory / "log4j2.properties"
        self.properties_file.write_text(SERVER_PROPERTIES.format(port=self.port, controller=controller, data=data))
        log_config.write_text(LOG4J2.format(log=self.log_file))
        formatted = subprocess.run(_java(libs, log_config, "kafka.tools.StorageTool", "format",
                                         # one argument: an id may begin with "-" (1 in 64),
                                         # which argparse would take for an option
                                         f"--cluster-id={random_cluster_id()}", "--config", str(self.properties_file)),
                                   capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if formatted.returncode != 0:
            raise KafkaSetupError(f"Kafka's StorageTool could not format {data} ({self.properties_file}):\n"
                                  f"{formatted.stdout}{formatted.stderr}")
        self._launch(libs, timeout)
        return self

    def restart(self, timeout: float = START_TIMEOUT_S) -> "KafkaBroker":
        """Stop the broker cleanly and start it again on the same port and storage: its topics,
        records, committed offsets and transactions' outcomes survive (a broker's restart, as in
        an upgrade or a crash without data loss, for the fault benchmarks)."""
        if self.port is None:
            raise KafkaSetupError(f"the Kafka broker in {self.directory} has not started")
        self.stop()
        self._launch(ensure_kafka_jars(), timeout)
        return self

    def _launch(self, libs: Path, timeout: float) -> None:
        """Run the broker of the properties file written by ``start`` and wait until it answers."""
        launched = time.monotonic()
        with open(self.directory / "broker.out", "ab") as out:
            # a session of its own: a terminal's Ctrl-C in the CLI that started it does not reach it
            self.process = subprocess.Popen(_java(libs, self.directory / "log4j2.properties", "kafka.Kafka",
                                                  str(self.properties_file)),
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        (self.directory / BROKER_FILE).write_text(json.dumps({"pid": self.process.pid, "port": self.port}))
        self._wait_ready(timeout)
        self.started_in = time.monotonic() - launched
        log.info("Kafka broker %s answers at %s (pid %d, %.1f s after launch)", KAFKA_VERSION, self.bootstrap,
                 self.process.pid, self.started_in)

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        # log_level 0: while the port is closed librdkafka would print a refusal a try; its reconnect
        # backoff would grow to 10 s between tries, and so the start seen late
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0,
                             "reconnect.backoff.max.ms": 200})
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                (self.directory / BROKER_FILE).unlink(missing_ok=True)
                raise KafkaSetupError(f"the Kafka broker in {self.directory} exited with {self.process.returncode} "
                                      f"while starting:\n{self.tail()}")
            if self.answers(admin):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise KafkaSetupError(f"the Kafka broker in {self.directory} did not answer at {self.bootstrap} "
                                      f"within {timeout:g} s:\n{self.tail()}")
            time.sleep(0.2)

    def answers(self, admin=None) -> bool:
        """Whether a broker answers a metadata request at the bootstrap address now."""
        if admin is None:
            from confluent_kafka.admin import AdminClient
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        try:
            return bool(admin.list_topics(timeout=2).brokers)
        except Exception:  # not listening yet: librdkafka says so in several ways (KafkaException, timeouts)
            return False

    def tail(self, chars: int = 3000) -> str:
        """The end of the broker's stdout and log, for an error message."""
        parts = []
        for name in ("broker.out", "broker.log"):
            path = self.directory / name
            if path.exists() and path.stat().st_size:
                parts.append(f"--- {path} (tail) ---\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts) or f"(no output in {self.directory})"

    @classmethod
    def from_dir(cls, directory: os.PathLike | str) -> "KafkaBroker":
        """The broker that ``start`` left in ``directory`` (for ``streamlab kafka stop``); it may
        have ended since: ``running()`` says."""
        broker = cls(directory)
        try:
            facts = json.loads((broker.directory / BROKER_FILE).read_text())
        except FileNotFoundError:
            raise KafkaSetupError(f"no Kafka broker was started in {broker.directory} "
                                  f"(no {BROKER_FILE} there)") from None
        except json.JSONDecodeError as exc:
            raise KafkaSetupError(f"{broker.directory / BROKER_FILE} is not a broker's pid file: {exc}") from None
        broker.port, broker._pid = facts["port"], facts["pid"]
        return broker

    def pid(self) -> Optional[int]:
        return self.process.pid if self.process is not None else self._pid

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        pid = self._pid
        if pid is None:
            return False
        try:  # a pid of the file's may have been reused since: only this directory's kafka.Kafka counts
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return b"kafka.Kafka" in cmdline and str(self.properties_file).encode() in cmdline

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a clean shutdown closes the controller's log), SIGKILL after ``timeout`` s."""
        pid = self.pid()
        if pid is not None and self.running():
            os.kill(pid, signal.SIGTERM)
            if not self._wait_gone(timeout):
                log.warning("the Kafka broker %d in %s ignored SIGTERM for %g s: killing it", pid, self.directory, timeout)
                os.killpg(pid, signal.SIGKILL)
                self._wait_gone(10)
        (self.directory / BROKER_FILE).unlink(missing_ok=True)

    def _wait_gone(self, timeout: float) -> bool:
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python -m kernel_runtime.deploy.kafka_broker fetch")
    try:
        print(f"Apache Kafka {KAFKA_VERSION} jars in {ensure_kafka_jars()}")
    except KafkaSetupError as exc:
        sys.exit(str(exc))
