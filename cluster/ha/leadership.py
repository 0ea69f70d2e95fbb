"""Who leads, decided from the latch children a JobManager sees and its ZooKeeper session's state:
a pure class, events in, instructions out (cluster.ha.services does the ZooKeeper I/O)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

LATCH_PREFIX = "latch-"


@dataclass(frozen=True)
class Granted:
    pass


@dataclass(frozen=True)
class Revoked:
    reason: str


@dataclass(frozen=True)
class JoinElection:
    """Create a latch node (again): a standby whose session expired lost its node with it."""

    reason: str


class Leadership:
    """Whether this contender leads, from the latch children it sees and its session's state.

    A leader revokes on SUSPENDED already (the session may live, but it cannot know whether a
    standby leads by now), and leadership is granted once per contender: after a revocation the
    process stops (``exit_on_revocation``). A standby merely waits through SUSPENDED; when its
    session is LOST (its latch node went with it) it joins the election again once the client
    has a new session, so a ZooKeeper outage never leaves a cluster without standbys. One
    ``JoinElection`` at a time: another is asked for only after ``latch_created``.

    Not thread-safe: the caller serialises the calls (kazoo calls back on several threads).
    """

    def __init__(self) -> None:
        self.own_node: Optional[str] = None
        self.leading = False
        self.ended = False
        self.joining = True  # the first latch node is being created (contend)
        self.lost = False  # the session expired: join again once connected

    def latch_created(self, node: str) -> None:
        self.own_node, self.joining = node.rsplit("/", 1)[-1], False

    def children_changed(self, children: list[str]) -> list:
        if self.own_node is None or self.ended:
            return []
        latches = sorted(c for c in children if c.startswith(LATCH_PREFIX))
        if self.own_node not in latches:
            if self.leading:
                return self._end("our latch node is gone (the session expired)")
            return self._rejoin("our latch node is gone")
        if latches[0] == self.own_node and not self.leading:
            self.leading = True
            return [Granted()]
        return []

    def session_state(self, state: str) -> list:
        """kazoo's KazooState: SUSPENDED (connection lost, session may live), LOST (expired), CONNECTED."""
        if self.ended:
            return []
        if self.leading and state in ("SUSPENDED", "LOST"):
            return self._end(f"the ZooKeeper session is {state}")
        if state == "LOST":
            self.own_node, self.lost = None, True  # the node went with the session
        elif state == "CONNECTED" and self.lost:
            self.lost = False
            return self._rejoin("the ZooKeeper session was LOST")
        return []

    def _rejoin(self, reason: str) -> list:
        if self.joining:
            return []
        self.own_node, self.joining = None, True
        return [JoinElection(f"standby: {reason}; joining the election again")]

    def _end(self, reason: str) -> list:
        self.ended = True
        self.leading = False
        return [Revoked(reason)]
