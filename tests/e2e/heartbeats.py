"""A positive event for negative checks: a later heartbeat.

The JobManager stamps each TaskManager's last heartbeat (GET /taskmanagers, Flink's
``timeSinceLastHeartbeat``: the epoch ms it was received). A heartbeat received after a moment
proves the JobManager's loop and the TaskManager both ran past it: whatever either would have
done by then (declare the other lost, fire a timer) has been done."""
from __future__ import annotations

import time

from tests.conftest import rest, wait_for


def heartbeat_stamps(cluster) -> dict[str, int]:
    return {t["id"]: t["timeSinceLastHeartbeat"] for t in rest(cluster, "/taskmanagers")[1]["taskmanagers"]}


def wait_for_heartbeats(cluster, ids, after: float, timeout: float = 30) -> None:
    """Until every TaskManager of ``ids`` has had a heartbeat received at or after ``after``
    (``time.time()`` seconds); fails at once if one of them is no longer registered."""
    ids = set(ids)

    def heard() -> bool:
        stamps = heartbeat_stamps(cluster)
        assert ids <= set(stamps), f"TaskManager(s) {sorted(ids - set(stamps))} no longer registered: {sorted(stamps)}"
        return all(stamps[i] >= after * 1000 for i in ids)
    wait_for(heard, timeout, f"a heartbeat from {sorted(ids)} after {time.strftime('%H:%M:%S', time.localtime(after))}")
