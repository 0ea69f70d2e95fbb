"""Clients of a high-availability cluster follow its leading JobManager.

A cluster whose configuration says ``high-availability.type: zookeeper`` publishes its leader's
addresses in ZooKeeper (cluster/ha/services.py). One ``LeaderWatch`` per cluster and process
follows them there for every JobClient and event subscription of that process, which re-point
their sockets when the leader changes: a notebook's open job handle, a script waiting for its job
and a long CLI command carry on under the new leader without being restarted.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from cluster.conf import Configuration
from cluster.ha.services import LeaderRetriever, cluster_root, ha_enabled
from cluster.conf.options import HighAvailabilityOptions

log = logging.getLogger(__name__)

Listener = Callable[[dict], None]


class LeaderWatch:
    """The leader of one HA cluster as ZooKeeper names it. Listeners are called on a ZooKeeper
    thread, with the leader's published addresses (``rpc``, ``events``, ``rest``, ``pid``), and
    must not block. Any thread may subscribe or unsubscribe; the ZooKeeper connection closes with
    the last subscriber."""

    _shared: dict[tuple[str, str], "LeaderWatch"] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def of(cls, conf: Configuration) -> Optional["LeaderWatch"]:
        """The process's watch of this cluster (made on first use), or None without HA."""
        if not ha_enabled(conf):
            return None
        key = (conf.get(HighAvailabilityOptions.HA_ZOOKEEPER_QUORUM), cluster_root(conf))
        with cls._shared_lock:
            watch = cls._shared.get(key)
            if watch is None:
                watch = cls._shared[key] = cls(conf, key)
            watch._users += 1
            return watch

    def __init__(self, conf: Configuration, key: tuple[str, str]):
        self._key = key
        self._users = 0
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        try:
            self._retriever = LeaderRetriever(conf, on_change=self._changed, quiet=True)
        except Exception as exc:  # kazoo's timeout says nothing of where it looked
            raise ConnectionError(f"ZooKeeper at {key[0]} (high-availability.zookeeper.quorum) did not "
                                  f"answer: {exc}") from None

    def leader(self, timeout: float = 30.0) -> dict:
        return self._retriever.leader(timeout)

    def subscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def release(self, listener: Optional[Listener] = None) -> None:
        """The user is done: stop calling ``listener``; the last user closes the connection."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)
        with LeaderWatch._shared_lock:
            self._users -= 1
            if self._users > 0:
                return
            if LeaderWatch._shared.get(self._key) is self:
                del LeaderWatch._shared[self._key]
        self._retriever.close()

    def _changed(self, info: dict) -> None:
        log.info("the leading JobManager is %s (pid %s)", info.get("rpc"), info.get("pid"))
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(info)
            except Exception:  # one broken follower must not keep the others on the old leader
                log.exception("a follower of the leading JobManager failed")
