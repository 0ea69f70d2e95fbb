"""Network faults between the processes of a real cluster (Jepsen-style, with Debian's iproute2 and
nftables):
a TaskManager on a second "host" (a network namespace joined by a veth pair, tests/e2e/test_hosts.py)
and one beside the JobManager, a checkpointed keyed job whose exchange crosses the veth, and on
the veth, while the job runs:

* ``loss``: 30 % of the second host's packets dropped, both ways, for a while;
* ``delay``: 200 ms more on each data channel between the hosts, both ways, for a while (this
  kernel has no netem: a proxy in the namespace relays the channels, tests/delay_proxy.py);
* ``partition-heals``: the veth down for longer than the heartbeat timeout, then up again;
* ``cut-from-jobmanager``: the second host cut from the JobManager's ports only (nftables rules
  that drop them), while its data channels to the other TaskManager stay up; then healed;
* ``cut-jobmanager-to-taskmanager``: one way only, the JobManager's packets to the second host
  dropped, until its TaskManager gives the JobManager up while the ResourceManager still hears
  it (what random loss made of the loss case in 2 of 6 runs: the job RUNNING without progress).

After each, the committed output (the transactional Parquet sink) equals pandas' row for row:
nothing lost, nothing twice. Each test runs a job on each state backend side by side and injects
its fault 3 times (tests/faults.py's in_rounds), each at a random moment from a seed the test id names.
"""
from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import rest, wait_for
from tests.delay_proxy import MARK
from tests.faults import Stopwatch, check_exactly_once, completed_checkpoints, in_rounds, seed
from tests.e2e.test_exactly_once import committed, expected, run_job
from tests.e2e.test_hosts import namespaces_unavailable, second_host, start_on_two_hosts, stop_everything

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(bool(namespaces_unavailable()), reason=namespaces_unavailable() or "-")]

HEARTBEAT_TIMEOUT_S = 1.5
ROOT = Path(__file__).resolve().parents[2]


def nft(ns: str, *rules: str) -> None:
    """nftables commands in the second host's namespace (its traffic only, whatever the host's)."""
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input="\n".join(rules), check=True,
                   capture_output=True, text=True)


def drop(ns: str, incoming: str = "", outgoing: str = "") -> None:
    """Drop the second host's packets that match, in a table of the test's own (``undrop`` heals)."""
    rules = ["add table inet slfault"]
    for chain, hook, match in (("in", "input", incoming), ("out", "output", outgoing)):
        if match:
            rules += [f"add chain inet slfault {chain} {{ type filter hook {hook} priority 0 ; }}",
                      f"add rule inet slfault {chain} {match} drop"]
    nft(ns, *rules)


def logged(cluster_dir, text: str) -> int:
    """How often the logs of a process directory say ``text``."""
    return sum(p.read_text(errors="replace").count(text) for p in cluster_dir.glob("log/*.log"))


def undrop(ns: str) -> None:
    nft(ns, "delete table inet slfault")


class Fault:
    """begin, hold (until the fault has done what it does), end; prepare runs before the jobs start."""

    def __init__(self, net):
        self.net = net

    def prepare(self, local, pids: list[int]) -> None:
        pass


class Loss(Fault):
    """30 % of the second host's packets dropped, both ways (nftables' random numbers), for a
    while."""

    def begin(self) -> None:
        drop(self.net.ns, incoming="numgen random mod 100 < 30", outgoing="numgen random mod 100 < 30")

    def hold(self) -> None:
        time.sleep(4.0)  # the fault's length: the job goes on through it, or restarts

    def end(self) -> None:
        undrop(self.net.ns)


class Delay(Fault):
    """200 ms more on every data channel between the two hosts, both ways, for a while; the
    control plane (the JobManager's ports) untouched. netem is missing here, so a proxy in the
    namespace (tests/delay_proxy.py) relays the channels, redirected to it by nftables before the
    jobs start, and delays what it relays while the fault lasts."""

    def prepare(self, local, pids: list[int]) -> None:
        by_host = {tm["path"].removeprefix("tcp://").rsplit(":", 1)[0]: tm["dataPort"]
                   for tm in rest(local, "/taskmanagers")[1]["taskmanagers"]}
        self.log = self.net.ns_dir.parent / "delay-proxy.log"
        self.proxy = subprocess.Popen(["ip", "netns", "exec", self.net.ns, sys.executable, "-m", "tests.delay_proxy",
                                       "--port", "0", "--delay-ms", "200"], cwd=ROOT,
                                      stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        pids.append(self.proxy.pid)
        port = wait_for(lambda: re.search(r"listening on (\d+)", self.log.read_text()), 30, "the delay proxy")[1]
        host_ip, ns_ip = self.net.host_ip, self.net.ns_ip
        nft(self.net.ns, "add table ip sldelay",
            "add chain ip sldelay out { type nat hook output priority -100 ; }",
            "add chain ip sldelay pre { type nat hook prerouting priority -100 ; }",
            f"add rule ip sldelay out ip daddr {host_ip} tcp dport {by_host[host_ip]} meta mark != {MARK} "
            f"redirect to :{port}",
            f"add rule ip sldelay pre ip saddr {host_ip} tcp dport {by_host[ns_ip]} redirect to :{port}")

    def begin(self) -> None:
        # the channels run through the proxy: one from each host's TaskManager to the other's
        assert self.log.read_text().count("connection to") >= 2, self.log.read_text()
        self.proxy.send_signal(signal.SIGUSR1)

    def hold(self) -> None:
        # a checkpoint of every job, triggered after the delay began (the one in flight may not
        # be: so two), completes through the delayed channels (barriers and data late)
        done = [self.net.checkpoints(h) for h in self.net.handles]
        wait_for(lambda: all(self.net.checkpoints(h) >= n + 2 for h, n in zip(self.net.handles, done)), 60,
                 "a checkpoint of every job completed with the channels delayed")

    def end(self) -> None:
        ends = len(re.findall(r"delay off: (\d+) chunks", self.log.read_text()))
        self.proxy.send_signal(signal.SIGUSR2)
        delayed = wait_for(lambda: re.findall(r"delay off: (\d+) chunks", self.log.read_text())[ends:], 30,
                           "the delay proxy's count")
        assert int(delayed[0]) > 0, "the fault delayed nothing"


class PartitionHeals(Fault):
    def begin(self) -> None:
        self.declared = self._declared_lost()
        self.cut()

    def cut(self) -> None:
        subprocess.run(["ip", "link", "set", self.net.host_if, "down"], check=True)

    def _declared_lost(self) -> int:
        return logged(self.net.jm_dir, "lost: no heartbeat")

    def hold(self) -> None:
        # until the JobManager has declared the other host's TaskManager lost (its jobs restart)
        wait_for(lambda: self._declared_lost() > self.declared, 60, "the other host's TaskManager declared lost")
        time.sleep(HEARTBEAT_TIMEOUT_S)  # and a while longer cut off

    def end(self) -> None:
        subprocess.run(["ip", "link", "set", self.net.host_if, "up"], check=True)


class CutFromJobManager(PartitionHeals):
    """The JobManager's ports dropped, both ways; the data channels to the other TaskManager pass."""

    def cut(self) -> None:
        ports = ", ".join(str(p) for p in self.net.jobmanager_ports)
        drop(self.net.ns, incoming=f"tcp sport {{ {ports} }}", outgoing=f"tcp dport {{ {ports} }}")

    def end(self) -> None:
        undrop(self.net.ns)


class CutJobManagerToTaskManager(CutFromJobManager):
    """One way only: what the JobManager sends the second host is dropped, what the second host
    sends gets through. Its TaskManager hears no heartbeat answer and cancels its tasks, while the
    ResourceManager still hears its heartbeats and then its registration again, so it never times
    it out. The JobManager's bare TCP acknowledgements pass (a packet of 60 bytes or less: IP and
    TCP headers with timestamps), or TCP would stop sending the other way as well."""

    def cut(self) -> None:
        ports = ", ".join(str(p) for p in self.net.jobmanager_ports)
        drop(self.net.ns, incoming=f"tcp sport {{ {ports} }} ip length > 60")

    def begin(self) -> None:
        self.gave_up = self._gave_up()
        self.cut()

    def _gave_up(self) -> int:
        return logged(self.net.ns_dir, "JobManager lost")

    def hold(self) -> None:
        wait_for(lambda: self._gave_up() > self.gave_up, 60, "the second host's TaskManager to give its JobManager up")
        time.sleep(HEARTBEAT_TIMEOUT_S)  # its registration again, unanswered, for a while


FAULTS = {"loss": Loss, "delay": Delay, "partition-heals": PartitionHeals, "cut-from-jobmanager": CutFromJobManager,
          "cut-jobmanager-to-taskmanager": CutJobManagerToTaskManager}
BACKENDS = ("hashmap", "rocksdb")  # a job of each, side by side: both run through every fault
RATE = 1_500  # rows/s per job: long enough for the rounds (each waits for a checkpoint after the last)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_network_fault_loses_nothing_and_doubles_nothing(tmp_path, fault):
    seed(fault)
    jm_dir, tm_dir, ns_dir = (tmp_path / d for d in ("jm", "tm", "ns-tm"))
    common = ["-D", "heartbeat.interval=200 ms", "-D", f"heartbeat.timeout={HEARTBEAT_TIMEOUT_S} s",
              "-D", "taskmanager.spark.startup=lazy", "-D", "taskmanager.numberOfTaskSlots=2"]
    pids: list[int] = []
    with second_host() as (ns, host_if, host_ip, ns_ip):
        try:
            # spread: each TaskManager runs one subtask of each job's task, so the exchanges cross the veth
            info = start_on_two_hosts(jm_dir, tm_dir, ns_dir, ns, host_ip, ns_ip, common, pids,
                                      jobmanager=("-D", "cluster.evenly-spread-out-slots=true"))
            local = SimpleNamespace(cluster_dir=jm_dir, info=info)
            wait_for(lambda: rest(local, "/overview")[1]["taskmanagers"] == 2, 60, "both TaskManagers registered")

            ports = [int(a.rsplit(":", 1)[1]) for a in (info.rpc_address, info.events_address)]
            # the pair's other end, in the namespace (second_host names the two slh<tag> and sln<tag>)
            net = SimpleNamespace(ns=ns, host_if=host_if, ns_if="sln" + host_if[3:], host_ip=host_ip, ns_ip=ns_ip,
                                  jobmanager_ports=ports, ns_dir=ns_dir, jm_dir=jm_dir)
            injected = FAULTS[fault](net)
            injected.prepare(local, pids)

            outs = {backend: str(tmp_path / f"out-{backend}") for backend in BACKENDS}
            jobs = {backend: run_job(local, backend, out, rate=RATE) for backend, out in outs.items()}
            net.handles = [handle for _, handle in jobs.values()]
            handles, client = net.handles, jobs["hashmap"][0]
            net.checkpoints = lambda handle: completed_checkpoints(local, handle)

            def inject(watch: Stopwatch) -> None:
                injected.begin()
                try:
                    injected.hold()
                finally:
                    injected.end()

            try:
                watches = in_rounds(local, client, handles, inject)
                for handle in handles:
                    assert handle.wait(240).state == "FINISHED"
            finally:
                for job_client, _ in jobs.values():
                    job_client.close()
            for backend, out in outs.items():
                check_exactly_once(f"network {fault} ({backend})", committed(out), expected(), watches)
        finally:
            stop_everything([ns_dir, tm_dir], jm_dir, pids)
