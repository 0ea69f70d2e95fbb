"""A client process has no log file, so Python prints warnings to its stderr: kazoo's reconnection
lines must not reach a notebook's cell or the CLI's terminal while ZooKeeper does not answer (the
JobManager's and TaskManager's kazoo lines go on to their log files)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

PROBE = """
import sys
from cluster.conf import Configuration
from cluster.ha.services import LeaderRetriever
conf = Configuration({"high-availability.type": "zookeeper", "high-availability.zookeeper.quorum": sys.argv[1],
                      "high-availability.zookeeper.client.connection-timeout": "1500 ms"}, "probe")
try:
    LeaderRetriever(conf, quiet=sys.argv[2] == "quiet")
except Exception as exc:
    print("refused:", type(exc).__name__)
"""


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: every connection is refused at once
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["quiet", "server"])
def test_kazoo_lines_stay_off_a_clients_stderr(mode):
    quorum = f"127.0.0.1:{_closed_port()}"
    done = subprocess.run([sys.executable, "-c", PROBE, quorum, mode], capture_output=True, text=True, timeout=60)
    assert "refused:" in done.stdout, (done.stdout, done.stderr)
    if mode == "quiet":
        assert done.stderr == "", done.stderr
    else:  # a server process's kazoo (its log goes to a file there): the lines the client no longer shows
        assert "Connection" in done.stderr or "connect" in done.stderr, done.stderr
