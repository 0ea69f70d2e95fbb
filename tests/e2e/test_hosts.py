"""A cluster across two "hosts": a TaskManager in a network namespace of its own, joined to the
JobManager over a veth pair with CurveZMQ (security.ssl.internal.enabled). A keyed job whose
exchange crosses the two hosts equals pandas; a TaskManager with another cluster's keys is refused
and the JobManager logs it; the bytes on the veth (captured with a packet socket, as tcpdump
would) hold no row in clear, and the same check finds the rows when encryption is off."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import sys
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from cluster.protocol.auth import create_secret
from kernel_runtime import StreamEnvironment
from kernel_runtime.client.cluster_info import ClusterInfo

ROOT = Path(__file__).resolve().parents[2]
STREAMLAB = [sys.executable, "-m", "kernel_runtime.cli.main"]
N = 20_000
MARKER = "quokka-row-"  # in every key: what a reader of the wire would see of the rows
ETH_P_ALL = 0x0003


def namespaces_unavailable() -> str:
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make a network namespace"
    probe = f"slprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


pytestmark = [pytest.mark.slow,  # a second host in a network namespace, a job across it (~25 s)
              pytest.mark.skipif(bool(namespaces_unavailable()), reason=namespaces_unavailable() or "-")]


def ip(*args: str, ns: str = "") -> None:
    command = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    subprocess.run(command, check=True, capture_output=True, text=True)


@contextmanager
def second_host():
    """A namespace joined to this one by a veth pair on a /24 of its own; removed on exit."""
    tag = uuid.uuid4().hex[:6]
    ns, host_if, ns_if = f"slns{tag}", f"slh{tag}", f"sln{tag}"
    subnet = f"10.231.{int(tag, 16) % 250 + 1}"
    host_ip, ns_ip = f"{subnet}.1", f"{subnet}.2"
    try:
        ip("netns", "add", ns)
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", f"{host_ip}/24", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("addr", "add", f"{ns_ip}/24", "dev", ns_if, ns=ns)
        ip("link", "set", ns_if, "up", ns=ns)
        ip("link", "set", "lo", "up", ns=ns)
        yield ns, host_if, host_ip, ns_ip
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes its veth end, and so the pair
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)


class Capture:
    """Every frame crossing an interface, as tcpdump -i would see it."""

    def __init__(self, interface: str):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((interface, 0))
        self.sock.settimeout(0.2)
        self.data = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.data += self.sock.recv(65536)
            except socket.timeout:
                pass

    def stop(self) -> bytes:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()
        return bytes(self.data)


def sh(*args: str, ns: str = "", check: bool = True) -> subprocess.CompletedProcess:
    command = [*STREAMLAB, *args]
    if ns:
        command = ["ip", "netns", "exec", ns, *command]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def events(seq):
    return pd.DataFrame({"user": [f"{MARKER}{k}" for k in (seq * 7919) % 13],
                         "amount": (seq % 11).astype("int64")})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("encrypted", [True, False], ids=["curve", "plaintext"])
def test_a_taskmanager_on_another_host(tmp_path, encrypted):
    jm_dir, tm_dir, ns_dir, intruder_dir = (tmp_path / d for d in ("jm", "tm", "ns-tm", "intruder"))
    common = ["-D", "heartbeat.interval=200 ms", "-D", "heartbeat.timeout=3 s",
              "-D", f"security.ssl.internal.enabled={str(encrypted).lower()}", "-D", "taskmanager.spark.startup=lazy"]
    pids: list[int] = []
    with second_host() as (ns, host_if, host_ip, ns_ip):
        try:
            info = start_on_two_hosts(jm_dir, tm_dir, ns_dir, ns, host_ip, ns_ip, common, pids)
            host_port = info.rpc_address.removeprefix("tcp://")
            assert host_port.startswith(f"{host_ip}:") and info.events_address.startswith(f"tcp://{host_ip}:")
            secret = str(jm_dir / "secret")

            if encrypted:
                create_secret(tmp_path / "other-secret")
                refusing_since = time.monotonic()
                refused = sh("taskmanager", "start", "--jobmanager", host_port, "--cluster-dir", str(intruder_dir),
                             "--secret-file", str(tmp_path / "other-secret"), "-D", f"taskmanager.host={ns_ip}",
                             *common, "--timeout", "6", ns=ns, check=False)
                pids += recorded_taskmanagers(intruder_dir)
                assert refused.returncode != 0 and "did not register" in refused.stderr, refused.stderr
                jm_log = (jm_dir / "log" / "jobmanager.log").read_text()
                assert f"CurveZMQ: dropped refused connection from a peer of {info.rpc_address}: the handshake failed" in jm_log, \
                    jm_log[-3000:]
                # DropLog logs the first 5 of a kind per 10 s window, then counts: the retries (5 a
                # second) must not each make a line. Its windows start when it was made, not at the
                # first refusal, so the refusals may straddle one more window than they last.
                intervals = 2 + int((time.monotonic() - refusing_since) // 10)
                lines = [line for line in jm_log.splitlines() if "dropped refused connection" in line]
                assert len(lines) <= 5 * intervals, "its retries flood the log:\n" + "\n".join(l[-140:] for l in lines)
                # refused before a single frame: the signature check never saw one
                assert "wrong cluster secret" not in jm_log
                sh("taskmanager", "stop", "--cluster-dir", str(intruder_dir))

            capture = Capture(host_if)
            try:
                env = StreamEnvironment(parallelism=2, cluster=jm_dir)
                (env.from_generator(events, count=N, batch_size=1_000)
                 .key_by("user").aggregate(total=("amount", "sum"), parallelism=2).collect("sums"))
                got = env.execute("keyed sum across hosts").to_pandas()
            finally:
                wire = capture.stop()
            got = got.sort_values("user").reset_index(drop=True)
            expected = (events(np.arange(N, dtype=np.int64)).groupby("user", as_index=False)
                        .agg(total=("amount", "sum")))
            pd.testing.assert_frame_equal(got[["user", "total"]], expected, check_dtype=False)

            # rows are pre-aggregated per batch before the exchange: tens of kB, not the whole input
            assert len(wire) > 10_000, f"only {len(wire)} bytes crossed the veth: the exchange did not"
            if encrypted:
                assert b"CURVE" in wire and MARKER.encode() not in wire
            else:  # the same check finds the rows when they go in clear: it can fail
                assert b"NULL" in wire and MARKER.encode() in wire
        finally:
            stop_everything([intruder_dir, ns_dir, tm_dir], jm_dir, pids)


def start_on_two_hosts(jm_dir: Path, tm_dir: Path, ns_dir: Path, ns: str, host_ip: str, ns_ip: str,
                       common: list[str], pids: list[int], jobmanager: tuple[str, ...] = ()) -> ClusterInfo:
    """A JobManager and a TaskManager on this host, a TaskManager in namespace ``ns`` (only the veth
    reaches the JobManager from there); their pids appended to ``pids``."""
    sh("jobmanager", "start", "--cluster-dir", str(jm_dir), "-D", f"jobmanager.rpc.address={host_ip}",
       "-D", "jobmanager.rpc.port=0", "-D", "rest.port=0", *jobmanager, *common)
    info = ClusterInfo.load(jm_dir)
    pids.append(info_pid(jm_dir))
    host_port = info.rpc_address.removeprefix("tcp://")
    secret = str(jm_dir / "secret")
    sh("taskmanager", "start", "--jobmanager", host_port, "--cluster-dir", str(tm_dir), "--secret-file", secret,
       "-D", f"taskmanager.host={host_ip}", *common)
    sh("taskmanager", "start", "--jobmanager", host_port, "--cluster-dir", str(ns_dir), "--secret-file", secret,
       "-D", f"taskmanager.host={ns_ip}", *common, ns=ns)
    pids += [p for d in (tm_dir, ns_dir) for p in recorded_taskmanagers(d)]
    return info


def stop_everything(taskmanager_dirs: list[Path], jm_dir: Path, pids: list[int]) -> None:
    """Stop the TaskManagers started from these directories, then the JobManager; kill what is left."""
    for directory in taskmanager_dirs:
        if directory.exists():
            sh("taskmanager", "stop", "--cluster-dir", str(directory), check=False)
    if jm_dir.exists():
        sh("jobmanager", "stop", "--cluster-dir", str(jm_dir), check=False)
    for pid in pids:
        if pid and psutil.pid_exists(pid):
            psutil.Process(pid).kill()


def info_pid(directory: Path) -> int:
    return json.loads((directory / "jobmanager.json").read_text())["pid"]


def recorded_taskmanagers(directory: Path) -> list[int]:
    path = directory / "cluster.json"
    return json.loads(path.read_text())["taskmanagers"] if path.exists() else []
