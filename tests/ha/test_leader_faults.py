"""A leader JobManager that loses its ZooKeeper session while it lives: frozen (SIGSTOP) past the
session and then resumed, or cut from ZooKeeper by nftables while its TaskManagers still reach it.
The standby leads meanwhile. No two leaders may act: the old one must step down (exit 70,
"leadership revoked"), and the job's committed output stays exactly once. At a random moment
(tests/faults.py prints the seed).

The order is read from the JobManagers' own logs (one clock): no act of a leader (a checkpoint
completed, a job deployed or recovered) in the old leader's log at or after the moment the new
one logged "leadership granted"."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from tests.conftest import rest, wait_for
from tests.faults import Stopwatch, check_exactly_once, seed
from tests.e2e.test_exactly_once import committed, expected, run_job

from .conftest import ha_cluster, shown_and_stopped
from .test_zookeeper_ha import answered, leader_pid, status_at_leader

pytestmark = pytest.mark.slow

SESSION_S = 2.0  # the HA test clusters' ZooKeeper session (kernel_runtime/deploy/ha.py)
LEADER_ACTS = ("Completed checkpoint", "deployed, attempt", "recovered")  # job_master.py's, dispatcher.py's lines


class Frozen:
    """SIGSTOP past the session's end, SIGCONT once the new leader runs the job."""
    name = "leader frozen past its session"

    def __init__(self, pid: int, zookeeper_port: int):
        self.pid = pid

    def begin(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def hold(self) -> None:
        time.sleep(SESSION_S)  # frozen well past the session's end

    def end(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


class CutFromZooKeeper(Frozen):
    """The leader's connections to ZooKeeper dropped both ways (nftables), its TaskManagers not."""
    name = "leader cut from ZooKeeper"

    def __init__(self, pid: int, zookeeper_port: int):
        super().__init__(pid, zookeeper_port)
        self.table = f"slzk{pid}"
        ports = [c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                 if c.raddr and c.raddr.port == zookeeper_port]
        assert ports, "the leader holds no connection to ZooKeeper"
        self.rules = [f"add rule ip {self.table} out tcp sport {p} tcp dport {zookeeper_port} drop" for p in ports] + \
                     [f"add rule ip {self.table} out tcp sport {zookeeper_port} tcp dport {p} drop" for p in ports]

    def begin(self) -> None:
        self._nft(f"add table ip {self.table}",
                  f"add chain ip {self.table} out {{ type filter hook output priority 0 ; }}", *self.rules)

    def hold(self) -> None:
        pass  # the leader steps down by itself

    def end(self) -> None:
        self._nft(f"delete table ip {self.table}")

    @staticmethod
    def _nft(*commands: str) -> None:
        subprocess.run(["nft", "-f", "-"], input="\n".join(commands), check=True, capture_output=True, text=True)


def _stamped(log: Path, needles: tuple[str, ...]) -> list[tuple[datetime, str]]:
    """The log's lines holding one of ``needles``, with their times (process_logging.FORMAT)."""
    return [(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f"), line)
            for line in log.read_text(errors="replace").splitlines() if any(n in line for n in needles)]


CASES = [(Frozen, "hashmap"), (Frozen, "rocksdb"), (CutFromZooKeeper, "hashmap")]


@pytest.mark.parametrize("fault,backend", CASES, ids=[f"{f.__name__}-{b}" for f, b in CASES])
def test_a_leader_that_lost_its_session_steps_down_and_no_two_leaders_act(zookeeper, tmp_path, fault, backend):
    seed(f"{fault.__name__}-leader-{backend}")
    with shown_and_stopped(ha_cluster(tmp_path / "ha-leader-fault", zookeeper.quorum)) as ha:
        first = ha.start_jobmanager()
        ha.info = ha.leader()
        second = ha.start_jobmanager()  # the standby
        ha.start_taskmanager()
        ha.start_taskmanager()
        wait_for(lambda: rest(ha, "/overview")[1]["taskmanagers"] == 2, 60, "two TaskManagers")
        out = str(tmp_path / "out")
        client, handle = run_job(ha, backend, out)
        try:
            wait_for(lambda: (answered(ha, f"/jobs/{handle.job_id}/checkpoints") or {"counts": {"completed": 0}})[
                "counts"]["completed"] >= 1, 60, "a completed checkpoint under the first leader")
            time.sleep(random.uniform(0.2, 1.0))  # a random moment of processing
            pid = leader_pid(ha)
            old = ha.process_of(pid)[1]
            injected = fault(pid, int(zookeeper.quorum.rsplit(":", 1)[1]))
            injected.begin()
            watch = Stopwatch()
            try:
                ha.info = ha.leader(60, not_pid=pid)  # the standby leads
                wait_for(lambda: (job := answered(ha, f"/jobs/{handle.job_id}")) is not None
                         and job["state"] == "RUNNING", 60, "the job running under the new leader")
                watch.recovered()
                injected.hold()
            finally:
                injected.end()
            assert old.wait(60) == 70, "the old leader did not step down"
            old_log, new_log = (ha.cluster_dir / "log" / f"{name}.log" for name in (first, second))
            assert _stamped(old_log, ("Completed checkpoint",)), "the act looked for below is not what it logs"
            assert _stamped(old_log, ("leadership revoked",)), old_log.read_text(errors="replace")[-2000:]
            (granted, _), = _stamped(new_log, ("leadership granted",))
            acts = [line for at, line in _stamped(old_log, LEADER_ACTS) if at >= granted]
            assert not acts, f"the old leader acted after the new one was granted leadership at {granted}:\n" + \
                "\n".join(acts)
            wait_for(lambda: status_at_leader(ha, handle.job_id).state in ("FINISHED", "FAILED", "CANCELED"), 180,
                     "the job to end")
            assert status_at_leader(ha, handle.job_id).state == "FINISHED"
        finally:
            client.close()
        check_exactly_once(f"{fault.name} ({backend})", committed(out), expected(), watch)
