"""The arguments of ``%%stream``, ``%stream_cluster`` and ``%stream_export``: declared with IPython's
magic_arguments (so ``%%stream?`` shows them), parsed and checked here, handed on as plain
frozen dataclasses. Every mistake is a UsageError that names the argument and what was wrong.

They live in export, not beside the magics in kernel_runtime.notebook, because two readers share
this one grammar: the magics, as a cell runs, and the export, which reads the ``%%stream`` and
``%stream_cluster`` lines of a notebook saved on disk. The notebook's ``%stream_export`` imports the
export, so the export is the lower of the two and may not import the notebook.
"""
from __future__ import annotations

import keyword
import re
import shlex
from dataclasses import dataclass
from typing import Optional, overload

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from cluster.conf import parse_duration_ms

from kernel_runtime.client.results import DEFAULT_MAX_ROWS, MODES

CHECKPOINT_INTERVAL_KEY = "execution.checkpointing.interval"
_ADDRESS = re.compile(r"^(?:tcp://)?(?P<host>[A-Za-z0-9.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")


@dataclass(frozen=True)
class StreamArgs:
    name: Optional[str]
    parallelism: Optional[int]
    checkpoint_interval: Optional[str]
    detached: bool
    cluster: Optional[str]
    output: Optional[str]
    mode: Optional[str]
    max_rows: int
    restart: bool = False  # a running job of this --name: cancel it and start afresh, not upgrade it
    allow_non_restored_state: bool = False  # an upgrade may leave out state that fits no operator
    dry_run: bool = False  # say what an upgrade would do with each operator's state; run nothing

    def job_config(self) -> dict:
        """Per-cell overrides of the job configuration (Flink's keys)."""
        if self.checkpoint_interval is None:
            return {}
        return {CHECKPOINT_INTERVAL_KEY: self.checkpoint_interval}


@dataclass(frozen=True)
class ClusterArgs:
    action: str
    taskmanagers: Optional[int]
    slots: Optional[int]


@dataclass(frozen=True)
class ClusterAddress:
    """Where ``--cluster`` points: a JobManager's HOST:PORT, or a cluster directory."""

    rpc_address: Optional[str] = None
    directory: Optional[str] = None

    @classmethod
    def parse(cls, value: str) -> "ClusterAddress":
        match = _ADDRESS.match(value.strip())
        if match and "/" not in value.replace("tcp://", ""):
            port = int(match["port"])
            if not 0 < port < 65536:
                raise UsageError(f"--cluster {value}: port {port} is not between 1 and 65535")
            return cls(rpc_address=f"tcp://{match['host']}:{port}")
        return cls(directory=value)


@magic_arguments("%stream")
@argument("-n", "--name", help="The job's name (default: the cell's number).")
@argument("-p", "--parallelism", type=int, help="Default parallelism of the job's operators.")
@argument("--checkpoint-interval", metavar="T",
          help=f'Checkpoint every T ("10 s", "500 ms"): the job\'s {CHECKPOINT_INTERVAL_KEY}.')
@argument("-d", "--detached", action="store_true",
          help="Submit and return: no rows come back to this kernel.")
@argument("-c", "--cluster", metavar="ADDRESS",
          help="Submit to a running cluster, by its JobManager's HOST:PORT or its directory, "
               "instead of the notebook's embedded one.")
@argument("-o", "--output", metavar="VAR", help="Also bind the job handle to this variable.")
@argument("-m", "--mode", choices=MODES, metavar="MODE",
          help="How rows are kept: append (last --max-rows), update (one row per key), single "
               "(the newest row). Default: update after a keyed aggregation, else append "
               "(also after .changelog()).")
@argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, metavar="N",
          help=f"Rows (or keys, in update mode) the kernel keeps (default {DEFAULT_MAX_ROWS:,}).")
@argument("--restart", action="store_true",
          help="If a job of this --name runs: cancel it and start from nothing (by default the cell "
               "upgrades it: stop with a savepoint, start the edited pipeline from it).")
@argument("--allow-non-restored-state", action="store_true",
          help="Upgrade even if some of the savepoint's state fits no operator of the edited pipeline "
               "(one removed, or of another kind under the same uid): start without it (Flink's -n).")
@argument("--dry-run", action="store_true",
          help="With the --name of a running job: a table of what upgrading it to this cell would do with "
               "each operator's state (restored, started empty, dropped, refused), from a savepoint taken "
               "while it runs. Nothing is stopped or submitted.")
def stream(line, cell=None):
    """Run the cell's pipeline as a streaming job and return its handle.

    The cell is Python that builds a pipeline on ``env`` (a StreamEnvironment) and ends it with
    a sink, e.g. ``env.from_generator(f).key_by("user").count().collect()``.

    Re-running a cell whose --name is a job running on the cluster upgrades that job: it stops
    with a savepoint and the edited pipeline starts from it, each operator finding the state of
    the operator of the same uid (``.uid("...")`` pins one across edits).
    """


@magic_arguments("%stream_sql")
@argument("--explain", action="store_true",
          help="Print which parts of the query run per batch on Spark and which in keyed state; run nothing.")
def stream_sql(line, cell=None):
    """Run the cell's Spark SQL query over the temporary views as a streaming job; return its handle.

    The cell is one query, e.g. ``SELECT city, count(*) AS n FROM orders GROUP BY city``, over
    views made with ``create_temporary_view("orders", lambda env: env.from_generator(...))``. It
    means what it means in Spark Structured Streaming and Flink SQL (docs/sql.md). The options are
    those of ``%%stream`` (``%%stream?``), and ``--explain``.
    """


def parse_stream_sql_args(line: str) -> tuple[StreamArgs, bool]:
    """``%%stream``'s options and ``--explain``."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"%%stream_sql {line}: {exc}") from None
    explain = "--explain" in words
    return parse_stream_args(shlex.join(w for w in words if w != "--explain")), explain


@magic_arguments("stream_cluster")
@argument("action", choices=("start", "stop", "status"),
          help="start the embedded cluster, stop it, or show the cluster's TaskManagers and jobs.")
@argument("-t", "--taskmanagers", type=int, help="TaskManagers to start (start only).")
@argument("-s", "--slots", type=int, help="Slots per TaskManager (start only).")
def stream_cluster(line):
    """Manage this notebook's embedded cluster (a JobManager and TaskManagers on 127.0.0.1)."""


@magic_arguments("stream_export")
@argument("--cell", metavar="NAME", help="Export only the %%%%stream cell of this --name (into DIR itself).")
@argument("-o", "--output", metavar="DIR",
          help="Where the job packages go (default: a folder named after the notebook, next to it).")
@argument("--notebook", metavar="PATH",
          help="The notebook to export (default: this kernel's notebook, as saved on disk).")
def stream_export(line):
    """Export this notebook's %%stream cells, with the code they need, as job packages (job.py,
    config.yaml, requirements.txt), as `streamlab export` does."""


def _parse(magic, line: str):
    # shell-style splitting (IPython's own keeps the quotes: --name "a b" would be '"a b"')
    try:
        argv = shlex.split(line)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"cannot split the arguments {line!r}: {exc}") from None
    return magic.parser.parse_args(argv)


@overload
def _positive(value: int, option: str) -> int: ...
@overload
def _positive(value: Optional[int], option: str) -> Optional[int]: ...


def _positive(value: Optional[int], option: str) -> Optional[int]:
    if value is not None and value < 1:
        raise UsageError(f"{option} must be a positive integer, got {value}")
    return value


def parse_stream_args(line: str) -> StreamArgs:
    args = _parse(stream, line)
    if args.checkpoint_interval is not None:
        try:
            parse_duration_ms(args.checkpoint_interval)
        except ValueError as exc:
            raise UsageError(f"--checkpoint-interval {args.checkpoint_interval!r}: expected {exc}") from None
    if args.output is not None and (not args.output.isidentifier() or keyword.iskeyword(args.output)):
        raise UsageError(f"-o {args.output!r}: not a Python variable name")
    if args.cluster is not None:
        ClusterAddress.parse(args.cluster)  # reports a bad port now
    if args.restart and args.allow_non_restored_state:
        raise UsageError("--restart starts without any state: --allow-non-restored-state goes with an upgrade")
    if args.dry_run and (args.restart or not args.name or args.detached):
        raise UsageError("--dry-run previews the upgrade of the running job of a --name: give --name, "
                         "without --restart or --detached")
    return StreamArgs(name=args.name, parallelism=_positive(args.parallelism, "--parallelism"),
                      checkpoint_interval=args.checkpoint_interval, detached=args.detached,
                      cluster=args.cluster, output=args.output, mode=args.mode,
                      max_rows=_positive(int(args.max_rows), "--max-rows"),  # it has a default
                      restart=args.restart, allow_non_restored_state=args.allow_non_restored_state,
                      dry_run=args.dry_run)


def parse_export_args(line: str):
    return _parse(stream_export, line)


def parse_cluster_args(line: str) -> ClusterArgs:
    args = _parse(stream_cluster, line)
    if args.action != "start" and (args.taskmanagers is not None or args.slots is not None):
        raise UsageError(f"--taskmanagers and --slots go with 'start', not '{args.action}'")
    return ClusterArgs(args.action, _positive(args.taskmanagers, "--taskmanagers"),
                       _positive(args.slots, "--slots"))
