"""High availability with ZooKeeper: Flink's HighAvailabilityServices for ``high-availability.type:
zookeeper``.

Under ``<high-availability.zookeeper.path.root>/<high-availability.cluster-id>`` in ZooKeeper:

* ``leaderlatch/latch-NNNNNNNNNN``: one ephemeral sequential node per JobManager; the lowest one
  is the leader (the latch recipe: each candidate watches the children, no herd on a lock);
* ``leader``: the leader's addresses (rpc, events, REST) as JSON, ephemeral: it goes with the
  leader's session, so a reader never follows a dead leader for longer than its session timeout;
* ``jobgraphs/<job id>``: the path of the job's pickled submission in ``high-availability.storageDir``
  (ZooKeeper holds pointers, not megabytes of pickled functions);
* ``checkpoints/<job id>``: the latest completed checkpoint of the job ``{"id": .., "directory": ..}``,
  written after its ``_metadata`` and before any sink is told to commit, so a new leader never
  restores a checkpoint older than what the sinks committed;
* ``checkpoint-counter/<job id>``: the highest checkpoint id the job triggered, so a new leader
  never reuses the id (and folder) of a checkpoint that was in flight when the old one died;
* ``attempt/<job id>``: the last attempt number deployed, written before its tasks are sent: a
  new leader deploys the next one, never the number whose tasks (and data channels, named by it)
  may still be cancelling on the TaskManagers.

The leadership decisions are ``Leadership``'s (cluster.ha.leadership), a pure class tested without a server; the
ZooKeeper I/O is ``ZooKeeperHaServices``'s. Losing the session (SUSPENDED or LOST) revokes
leadership at once: a leader that cannot prove it still holds the latch must not commit anything.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from cluster.conf.options import HighAvailabilityOptions
# (Granted, JoinElection, Revoked are also read from here, where they were first defined)
from cluster.ha.leadership import LATCH_PREFIX, Granted, JoinElection, Leadership, Revoked  # noqa: F401
log = logging.getLogger(__name__)


class HaConfigError(ValueError):
    pass


class NotLeader(RuntimeError):
    """A leader's write refused by ZooKeeper: this JobManager's latch node is gone, so another
    one leads by now (or will): nothing it writes may count."""


def ha_enabled(conf) -> bool:
    return conf.get(HighAvailabilityOptions.HA_MODE) == "zookeeper"


def cluster_root(conf) -> str:
    root = "/" + conf.get(HighAvailabilityOptions.HA_ZOOKEEPER_ROOT).strip("/")
    cluster_id = conf.get(HighAvailabilityOptions.HA_CLUSTER_ID).strip("/")
    if not cluster_id:
        raise HaConfigError("high-availability.cluster-id: must not be empty")
    return f"{root}/{cluster_id}"


def storage_dir(conf, cluster_dir: Optional[Path]) -> Path:
    configured = conf["high-availability.storageDir"]
    if configured:
        return Path(configured.removeprefix("file://"))
    if cluster_dir is None:
        raise HaConfigError("high-availability.storageDir: required (no cluster directory to default to)")
    return Path(cluster_dir) / "ha"


class QuietZooKeeperLog(logging.LoggerAdapter):
    """kazoo's log for a client process (a notebook, the CLI): every line at DEBUG. A client has no
    log file, so Python prints warnings to its stderr, and a ZooKeeper that stalls made kazoo's
    reconnection lines fill a cell; what a client needs to know, that no leader answers, its own
    calls say."""

    def log(self, level, msg, *args, **kwargs):
        kwargs.pop("stacklevel", None)
        super().log(logging.DEBUG, msg, *args, **kwargs)


def make_client(conf, quiet: bool = False):
    quorum = conf.get(HighAvailabilityOptions.HA_ZOOKEEPER_QUORUM)
    if not quorum:
        raise HaConfigError("high-availability.zookeeper.quorum: required when high-availability.type is "
                            "zookeeper (host:port[,host:port...])")
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry
    timeout_s = conf.get(HighAvailabilityOptions.ZOOKEEPER_SESSION_TIMEOUT) / 1000
    logger = QuietZooKeeperLog(logging.getLogger("streamlab.zookeeper"), {}) if quiet else None
    return KazooClient(hosts=quorum, timeout=timeout_s, logger=logger,
                       connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
                       command_retry=KazooRetry(max_tries=3, delay=0.1, max_delay=1.0))


def _connect(client, conf) -> None:
    client.start(timeout=conf.get(HighAvailabilityOptions.ZOOKEEPER_CONNECTION_TIMEOUT) / 1000)


class ZooKeeperHaServices:
    """One JobManager's view of the HA state. Every method but the callbacks blocks on ZooKeeper:
    call it from a thread that may wait (the storage executor, startup), never the loop."""

    def __init__(self, conf, cluster_dir: Optional[Path]):
        self.conf = conf
        self.root = cluster_root(conf)
        self.storage = storage_dir(conf, cluster_dir) / conf.get(HighAvailabilityOptions.HA_CLUSTER_ID).strip("/")
        self.client = make_client(conf)
        self.leadership = Leadership()
        self._lock = threading.Lock()  # kazoo calls back on its own threads
        self._granted = threading.Event()
        self._on_revoked: Callable[[str], None] = lambda reason: None

    # ------------------------------------------------------------------ leader election
    def start(self) -> None:
        _connect(self.client, self.conf)
        self.client.add_listener(lambda state: self._decide(lambda: self.leadership.session_state(str(state))))
        for sub in ("leaderlatch", "jobgraphs", "checkpoints", "checkpoint-counter", "attempt"):
            self.client.ensure_path(f"{self.root}/{sub}")
        self.storage.mkdir(mode=0o700, parents=True, exist_ok=True)

    def contend(self, on_revoked: Callable[[str], None]) -> None:
        """Join the election; ``wait_for_leadership`` returns once this JobManager leads."""
        self._on_revoked = on_revoked
        self._join()
        self.client.ChildrenWatch(f"{self.root}/leaderlatch",
                                  lambda children: self._decide(lambda: self.leadership.children_changed(children)))

    def _join(self) -> None:
        node = self.client.create(f"{self.root}/leaderlatch/{LATCH_PREFIX}", ephemeral=True, sequence=True)
        with self._lock:
            self.leadership.latch_created(node)
        # the children may have changed before the node existed: decide on what is there now
        children = self.client.get_children(f"{self.root}/leaderlatch")
        self._decide(lambda: self.leadership.children_changed(children))

    def _rejoin(self) -> None:
        try:
            self._join()
        except Exception as exc:  # the connection went again: the next CONNECTED asks once more
            log.warning("joining the election again failed: %s", exc)
            with self._lock:
                self.leadership.joining, self.leadership.lost = False, True

    def _decide(self, decision: Callable[[], list]) -> None:
        with self._lock:
            instructions = decision()
        for i in instructions:
            if isinstance(i, Granted):
                self._granted.set()
            elif isinstance(i, Revoked):
                self._on_revoked(i.reason)
            elif isinstance(i, JoinElection):
                log.warning("%s", i.reason)
                # kazoo's state listeners must not block: the create runs on a thread of its handler
                self.client.handler.spawn(self._rejoin)

    def wait_for_leadership(self, timeout: Optional[float] = None) -> bool:
        return self._granted.wait(timeout)

    def publish_leader(self, info: dict) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError
        path, data = f"{self.root}/leader", json.dumps(info).encode()
        for last_try in (False, True):
            # the last leader's node lives on until its session expires: replaced in the same transaction
            # (it may expire between the look and the transaction: then once more)
            there = self.client.exists(path) is not None
            try:
                self._fenced(lambda tx: (tx.delete(path) if there else None, tx.create(path, data, ephemeral=True)))
                return
            except (NodeExistsError, NoNodeError):
                if last_try:
                    raise

    # ------------------------------------------------------------------ fenced writes
    def _fenced(self, ops: Callable[[Any], object]) -> None:
        """The leader's writes ``ops(transaction)`` in one ZooKeeper transaction that first checks
        that this JobManager's latch node still exists (Flink's ZooKeeperStateHandleStore checks
        its leader latch's node the same way). A leader deposed while it was cut off from
        ZooKeeper (a long pause, a partition) learns of it only when its session's end reaches
        it: until then, its revocation has not run, and only this check keeps its writes (a
        checkpoint pointer, a job graph, an attempt number) from overwriting the new leader's.
        Raises NotLeader then, and nothing of the transaction is applied."""
        self._raise_failure(self._transaction(ops).commit())

    def _fenced_async(self, ops: Callable[[Any], object]) -> None:
        """``_fenced`` without waiting for ZooKeeper's answer: a refusal is only logged."""
        try:
            tx = self._transaction(ops)
        except NotLeader as exc:
            log.warning("a leader's write was not sent: %s", exc)
            return

        def answered(result) -> None:
            try:
                self._raise_failure(result.get())
            except Exception as exc:
                log.warning("a leader's write was not applied: %s", exc)
        tx.commit_async().rawlink(answered)

    def _transaction(self, ops: Callable[[Any], object]):
        """A transaction of ``ops`` after the check of this JobManager's latch node (NotLeader
        at once when it has none)."""
        tx = self.client.transaction()
        tx.check(self._latch_path(), -1)  # -1: any version; the node must exist
        ops(tx)
        return tx

    def _latch_path(self) -> str:
        node = self.leadership.own_node
        if node is None:
            raise NotLeader("this JobManager has no latch node (its session expired): it does not lead")
        return f"{self.root}/leaderlatch/{node}"

    @staticmethod
    def _raise_failure(results: list) -> None:
        from kazoo.exceptions import NoNodeError, RolledBackError
        if results and isinstance(results[0], NoNodeError):
            raise NotLeader("ZooKeeper refused the write: this JobManager's latch node is gone, another leads")
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise result

    # ------------------------------------------------------------------ job graphs
    def put_job_graph(self, job_id: str, submission: dict) -> None:
        path = self.storage / f"jobgraph-{job_id}"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(submission))
        tmp.replace(path)  # a reader never sees half a file
        missing = [sub for sub in ("checkpoint-counter", "attempt") if not self.client.exists(f"{self.root}/{sub}/{job_id}")]

        def ops(tx) -> None:
            for sub in missing:
                tx.create(f"{self.root}/{sub}/{job_id}", b"0")
            self._set(tx, f"{self.root}/jobgraphs/{job_id}", str(path).encode())
        self._fenced(ops)

    def remove_job(self, job_id: str) -> None:
        """A job that reached a globally terminal state is not recovered by the next leader."""
        present = [f"{self.root}/{sub}/{job_id}" for sub in ("jobgraphs", "checkpoints", "checkpoint-counter", "attempt")
                   if self.client.exists(f"{self.root}/{sub}/{job_id}")]
        self._fenced(lambda tx: [tx.delete(node) for node in present])
        (self.storage / f"jobgraph-{job_id}").unlink(missing_ok=True)

    def job_graphs(self) -> dict[str, dict]:
        out = {}
        for job_id in sorted(self.client.get_children(f"{self.root}/jobgraphs")):
            location, _ = self.client.get(f"{self.root}/jobgraphs/{job_id}")
            out[job_id] = pickle.loads(Path(location.decode()).read_bytes())
        return out

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_completed(self, job_id: str, checkpoint_id: int, directory: str) -> None:
        pointer = json.dumps({"id": checkpoint_id, "directory": directory}).encode()
        self._fenced(lambda tx: self._set(tx, f"{self.root}/checkpoints/{job_id}", pointer))

    def latest_checkpoint(self, job_id: str) -> Optional[tuple[int, str]]:
        path = f"{self.root}/checkpoints/{job_id}"
        if not self.client.exists(path):
            return None
        pointer = json.loads(self.client.get(path)[0])
        return pointer["id"], pointer["directory"]

    def checkpoint_triggered(self, job_id: str, checkpoint_id: int) -> None:
        """Non-blocking (kazoo's async set): the trigger must not wait for ZooKeeper."""
        # the node exists: put_job_graph made it
        self._fenced_async(lambda tx: tx.set_data(f"{self.root}/checkpoint-counter/{job_id}",
                                                  str(checkpoint_id).encode()))

    def attempt_deployed(self, job_id: str, attempt: int) -> None:
        """Blocking, on the loop, and only at a deployment: the number must be in ZooKeeper before
        any task of it runs (a leader that cannot reach ZooKeeper is revoked anyway)."""
        self._fenced(lambda tx: tx.set_data(f"{self.root}/attempt/{job_id}", str(attempt).encode()))

    def last_attempt(self, job_id: str) -> int:
        path = f"{self.root}/attempt/{job_id}"
        return int(self.client.get(path)[0]) if self.client.exists(path) else 0

    def checkpoint_counter(self, job_id: str) -> int:
        path = f"{self.root}/checkpoint-counter/{job_id}"
        return int(self.client.get(path)[0]) if self.client.exists(path) else 0

    def _set(self, tx, path: str, data: bytes) -> None:
        """Set or create ``path`` in the transaction ``tx`` (its parent exists: ``start`` made it)."""
        if self.client.exists(path):
            tx.set_data(path, data)
        else:
            tx.create(path, data)

    def close(self) -> None:
        close_client(self.client)


class LeaderRetriever:
    """Follows the leader's addresses in ZooKeeper (TaskManagers, clients): ``on_change(info)``
    for every leader published; ``leader(timeout)`` for the current one.

    The node is read with asynchronous calls, never a blocking one on kazoo's callback thread (as
    kazoo's DataWatch recipe does): with ZooKeeper gone, that get waited for ever, and kazoo's exit
    handler, which joins the thread, held the process at exit (a script or test that ended
    without closing its client, after the server had stopped)."""

    def __init__(self, conf, on_change: Callable[[dict], None] = lambda info: None, quiet: bool = False):
        self.root = cluster_root(conf)
        self.path = f"{self.root}/leader"
        self.client = make_client(conf, quiet)
        _connect(self.client, conf)
        self._current: Optional[dict] = None
        self._known = threading.Condition()
        self.on_change = on_change
        # a new session has no watches: read again (and watch) at every (re)connection
        self.client.add_listener(lambda state: self._read() if str(state) == "CONNECTED" else None)
        self._read()

    def _read(self, event=None) -> None:
        """Ask for the node and watch it (any thread; kazoo's watch events call it too)."""
        self.client.get_async(self.path, watch=self._read).rawlink(self._got)

    def _got(self, result) -> None:
        from kazoo.exceptions import NoNodeError
        try:
            data, _ = result.get(block=False)
        except NoNodeError:  # no leader now (the last one's session ended): keep following the last one
            self.client.exists_async(self.path, watch=self._read).rawlink(self._created)
            return
        except Exception:  # connection lost or closed: the next CONNECTED reads again
            return
        if data:
            self._changed(json.loads(data))

    def _created(self, result) -> None:
        try:
            exists = result.get(block=False) is not None
        except Exception:
            return
        if exists:  # published between the get and the exists: its watch will not fire
            self._read()

    def _changed(self, info: dict) -> None:
        with self._known:
            changed, self._current = info != self._current, info
            self._known.notify_all()
        if changed:
            self.on_change(info)

    def leader(self, timeout: float = 30.0) -> dict:
        with self._known:
            if not self._known.wait_for(lambda: self._current is not None, timeout):
                raise TimeoutError(f"no leading JobManager published in ZooKeeper under {self.root} "
                                   f"within {timeout:g} s")
            assert self._current is not None
            return self._current

    def close(self) -> None:
        close_client(self.client)


def close_client(client) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # a session already gone: nothing to release
        pass


def exit_on_revocation(reason: str) -> None:
    """A leader that lost its session stops at once: its JobMasters, its REST and its sockets go
    with the process, so nothing it still holds can commit a checkpoint beside the new leader.
    (Flink keeps the process as a standby; a supervisor or ``streamlab cluster`` restarts ours.)"""
    log.critical("leadership revoked: %s; stopping this JobManager", reason)
    logging.shutdown()
    os._exit(EXIT_LEADERSHIP_REVOKED)


EXIT_LEADERSHIP_REVOKED = 70
