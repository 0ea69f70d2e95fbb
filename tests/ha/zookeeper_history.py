"""ZooKeeper's own history of an HA cluster: the server's transaction log (every write, in zxid
order, with the session that made it), read by ZooKeeper's TxnLogToolkit from Debian's jars. It
tells which JobManager acted as leader when, independently of the JobManagers' logs: the leader
is the session that created ``<root>/leader`` last, until that session closes (or expires), and
every write of a leader (a job graph, a checkpoint pointer or counter, an attempt number) must come
from it."""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

JARS = ["/usr/share/java/zookeeper.jar", "/usr/share/java/zookeeper-jute.jar", "/usr/share/java/slf4j-api.jar"]
TOOLKIT = "org.apache.zookeeper.server.persistence.TxnLogToolkit"
# "11/27/26, 5:02:42 AM UTC session 0x1000... cxid 0x20 zxid 0x1a setData /flink/x/attempt/j,1,1"
TXN = re.compile(r"^\d+/\d+/\d+, .*? session (0x[0-9a-f]+) cxid \S+ zxid (0x[0-9a-f]+) (\w+) ?(.*)$")
# a transaction's operations, each "<op>:" then its record's fields as they are serialised: the
# path's length in 4 bytes, the path, then the op's other fields (a length or a version: 4 bytes
# that begin with a NUL here), ";" between two; a refused one is logged as "multi error:...;error:..."
MULTI_OP = re.compile(r"(\w+):[\s\S]{4}(/[^\x00;]*)")
LEADER_WRITES = ("jobgraphs", "checkpoints", "checkpoint-counter", "attempt")


@dataclass(frozen=True)
class Txn:
    zxid: int
    session: str
    op: str  # createSession, closeSession, create, setData, delete, ...
    path: str  # "" for the session ops


def transactions(data_dir: Path) -> list[Txn]:
    """Every transaction in the server's logs (``dataDir``), in zxid order."""
    txns = []
    for log in (data_dir / "version-2").glob("log.*"):
        dump = subprocess.run(["java", "-cp", ":".join(JARS), TOOLKIT, "-d", str(log)], capture_output=True,
                              text=True, check=True).stdout
        for m in filter(None, map(TXN.match, dump.splitlines())):
            zxid, session, op, rest = int(m[2], 16), m[1], m[3], m[4]
            if op == "multi":  # each operation of a transaction as a write of its own, in order
                txns += [Txn(zxid, session, sub, path) for sub, path in MULTI_OP.findall(rest)]
            else:
                txns.append(Txn(zxid, session, op, re.split(r"[,\s]", rest, maxsplit=1)[0]))
    return sorted(txns, key=lambda t: t.zxid)  # stable: a transaction's operations stay in order


def leader_writes(data_dir: Path, root: str) -> tuple[list[Txn], list[str]]:
    """The writes of a leader under ``root``, and those made by a session that was not the leader's
    at that moment (described); the second list is empty when no two leaders acted."""
    leader, writes, wrong = None, [], []
    for txn in transactions(data_dir):
        if txn.op == "create" and txn.path == f"{root}/leader":
            leader = txn.session
        elif txn.op == "closeSession" and txn.session == leader:
            leader = None
        elif any(txn.path.startswith(f"{root}/{node}/") for node in LEADER_WRITES):
            writes.append(txn)
            if txn.session != leader:
                wrong.append(f"zxid {txn.zxid:#x}: {txn.op} {txn.path} by session {txn.session}, "
                             f"while the leader was {leader or 'no one'}")
    return writes, wrong
