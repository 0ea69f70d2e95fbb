"""A leader JobManager that loses its ZooKeeper session while it lives: frozen (SIGSTOP) past the
session and then resumed, or cut from ZooKeeper by nftables while its TaskManagers still reach it.
The standby leads meanwhile. No two leaders may act: the old one must step down (exit 70,
"leadership revoked"), and the committed output of a job on each state backend, side by side,
stays exactly once through 3 such faults (a new standby before each), each at a random moment
(tests/faults.py prints the seed).

The order is read from the JobManagers' own logs (one clock): no act of a leader (a checkpoint
completed, a job deployed or recovered) in the old leader's log at or after the moment the new
one logged "leadership granted". And from ZooKeeper's own history (zookeeper_history.py): every
write of a leader in the HA store was made by the session that held the leader node then."""
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
from tests.faults import ROUNDS, Stopwatch, check_exactly_once, seed
from tests.e2e.test_exactly_once import committed, expected, run_job

from .conftest import ha_cluster, shown_and_stopped
from .test_zookeeper_ha import answered, leader_pid, status_at_leader
from .zookeeper_history import leader_writes

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


BACKENDS = ("hashmap", "rocksdb")  # a job of each, side by side, through every fault
RATE = 1_500  # rows/s per job: long enough for the rounds


def completed(ha, job_id: str) -> int:
    return (answered(ha, f"/jobs/{job_id}/checkpoints") or {"counts": {"completed": 0}})["counts"]["completed"]


def running(ha, job_id: str) -> bool:
    return (job := answered(ha, f"/jobs/{job_id}")) is not None and job["state"] == "RUNNING"


@pytest.mark.parametrize("fault", [Frozen, CutFromZooKeeper], ids=["Frozen", "CutFromZooKeeper"])
def test_a_leader_that_lost_its_session_steps_down_and_no_two_leaders_act(zookeeper, tmp_path, fault):
    seed(f"{fault.__name__}-leader")
    # a cluster id (its directory's name) of the test's own: its history in the shared ZooKeeper
    with shown_and_stopped(ha_cluster(tmp_path / f"leader-{fault.__name__.lower()}", zookeeper.quorum)) as ha:
        leader = ha.start_jobmanager()
        ha.info = ha.leader()
        ha.start_taskmanager()
        ha.start_taskmanager()
        wait_for(lambda: rest(ha, "/overview")[1]["taskmanagers"] == 2, 60, "two TaskManagers")
        outs = {backend: str(tmp_path / f"out-{backend}") for backend in BACKENDS}
        jobs = {backend: run_job(ha, backend, out, rate=RATE) for backend, out in outs.items()}
        job_ids = [handle.job_id for _, handle in jobs.values()]
        watches = []
        try:
            for round_ in range(1, ROUNDS + 1):
                standby = ha.start_jobmanager()
                done = [completed(ha, j) for j in job_ids]
                wait_for(lambda: all(running(ha, j) and completed(ha, j) > n for j, n in zip(job_ids, done)), 60,
                         f"both jobs running with a new checkpoint before fault {round_}")
                time.sleep(random.uniform(0.2, 1.0))  # a random moment of processing
                pid = leader_pid(ha)
                old = ha.process_of(pid)[1]
                injected = fault(pid, int(zookeeper.quorum.rsplit(":", 1)[1]))
                injected.begin()
                watches.append(Stopwatch())
                try:
                    ha.info = ha.leader(60, not_pid=pid)  # the standby leads
                    wait_for(lambda: all(running(ha, j) for j in job_ids), 60, "the jobs running under the new leader")
                    watches[-1].recovered()
                    injected.hold()
                finally:
                    injected.end()
                assert old.wait(60) == 70, "the old leader did not step down"
                no_act_after_the_grant(ha.cluster_dir / "log", leader, standby)
                leader = standby
            for job_id in job_ids:
                wait_for(lambda: status_at_leader(ha, job_id).state in ("FINISHED", "FAILED", "CANCELED"), 180,
                         "the jobs to end")
                assert status_at_leader(ha, job_id).state == "FINISHED"
        finally:
            for client, _ in jobs.values():
                client.close()
        # ZooKeeper's own history: every write of a leader made by the leader of its moment
        writes, wrong = leader_writes(zookeeper.directory / "data", f"/flink/{ha.cluster_dir.name}")
        assert len({w.session for w in writes}) == ROUNDS + 1, writes  # each leader's writes were seen
        assert not wrong, "two JobManagers acted as leader at once:\n" + "\n".join(wrong)
        for backend, out in outs.items():
            check_exactly_once(f"{fault.name} ({backend})", committed(out), expected(), watches)


def no_act_after_the_grant(logs: Path, old: str, new: str) -> None:
    """The old leader stepped down, and its log holds no act of a leader at or after the moment
    the new one's log says it was granted leadership."""
    old_log, new_log = logs / f"{old}.log", logs / f"{new}.log"
    assert _stamped(old_log, ("Completed checkpoint",)), "the act looked for below is not what it logs"
    assert _stamped(old_log, ("leadership revoked",)), old_log.read_text(errors="replace")[-2000:]
    (granted, _), = _stamped(new_log, ("leadership granted",))
    acts = [line for at, line in _stamped(old_log, LEADER_ACTS) if at >= granted]
    assert not acts, f"the old leader acted after the new one was granted leadership at {granted}:\n" + "\n".join(acts)
