"""Starting the cluster's processes: ``python -m cluster.jobmanager|cluster.taskmanager``.

One place for the command line, environment and log files of a cluster process, used by the
local launcher (``streamlab cluster start``, embedded clusters), the standalone ``streamlab
jobmanager|taskmanager start`` commands and the active ResourceManager, which starts TaskManagers
itself. A process logs into ``<cluster-dir>/log/<name>.log`` (rolling); its stdout/stderr (a Spark
JVM, a print sink, a crash before logging starts) go to ``<name>.out``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

# where a JobManager in application mode leaves its application's end for the command that started it
RESULT_FILE = "application.json"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def log_path(cluster_dir: Path, name: str, suffix: str = ".log") -> Path:
    return Path(cluster_dir) / "log" / f"{name}{suffix}"


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(module: str, name: str, cluster_dir: Path, *args: str, owned: bool = False) -> subprocess.Popen:
    """Start ``python -m module --cluster-dir DIR --log-file ... *args`` in a session of its own
    (a Ctrl-C in the launching terminal does not reach it; the launcher stops it). ``owned``: it
    stops when this process ends, however it ends (cluster.common.lifecycle)."""
    if owned:
        args = (*args, "--owner-pid", str(os.getpid()),
                *(("--parent-death-signal",) if threading.current_thread() is threading.main_thread() else ()))
    log_path(cluster_dir, name).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    out_file = os.fdopen(os.open(log_path(cluster_dir, name, ".out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                         "ab")
    try:
        # what the cluster writes (savepoints, checkpoints, state) is its user's alone
        return subprocess.Popen([sys.executable, "-m", module, "--cluster-dir", str(cluster_dir),
                                 "--log-file", str(log_path(cluster_dir, name)), *args],
                                stdout=out_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=_environment(), start_new_session=True, umask=0o077)
    finally:
        out_file.close()


def exec_foreground(module: str, cluster_dir: Path, *args: str) -> None:
    """Become ``python -m module --cluster-dir DIR *args``, logging to stderr: in a container the
    process is the pod's main one (it gets the SIGTERM) and ``kubectl logs`` shows its log."""
    os.umask(0o077)
    os.execve(sys.executable, [sys.executable, "-m", module, "--cluster-dir", str(cluster_dir), *args],
              _environment())


def add_owner_arguments(parser) -> None:
    """The arguments ``spawn(..., owned=True)`` gives a process (an argparse parser's)."""
    parser.add_argument("--owner-pid", type=int, help="stop when this process (the one that started it) ends")
    parser.add_argument("--parent-death-signal", action="store_true",
                        help="with --owner-pid: ask Linux for SIGTERM when the owner's spawning thread ends")


def exit_report(proc: subprocess.Popen, cluster_dir: Path, name: str, lines: int = 15) -> str:
    """Why a process that exited did: its exit code and the tails of its log and output."""
    tails = []
    for path in (log_path(cluster_dir, name), log_path(cluster_dir, name, ".out")):
        if path.exists():
            tails += [f"--- {path.name}", *path.read_text(errors="replace").splitlines()[-lines:]]
    return f"the {name} process exited with code {proc.returncode}:\n" + "\n".join(tails)
