"""``%%stream`` and ``%stream_cluster``: the notebook's job client.

Thin on purpose: parse the arguments (magic_args), run the cell body on a fresh ``env``, submit
through the JobClient, return the JobHandle (whose display is the live dashboard). Without
``--cluster`` a cell runs on this kernel's embedded cluster, on free ports of 127.0.0.1, stopped
when the kernel exits. It starts in the background at ``%load_ext`` (its TaskManagers start their
SparkSessions at once), so the first cell finds it up and Spark warm or warming.

Errors are reported where the user made them: a cell body's traceback starts at the cell, and
the API's "file:line" call sites read "In [5], line 3" (line 1 is the ``%%stream`` line), as
do the places of a job's failures (kernel_runtime.notebook.cells).
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from traitlets import Bool, Dict, Float, Int

from cluster.checkpoint.storage import local_path, read_metadata
from cluster.conf import OPTIONS, ConfigError
from cluster.graph.execution_graph import JobState
from cluster.graph.job_graph import GraphValidationError, JobGraph, OperatorSpec
from cluster.checkpoint.savepoint_fit import SavepointFit, saved_operator, savepoint_fit
from cluster.protocol.endpoint import RpcError

from kernel_runtime.notebook import lab_registry
from kernel_runtime.deploy import processes
from kernel_runtime.api import StreamEnvironment
from kernel_runtime.notebook.cells import CellSites, running_cell
from kernel_runtime.client.job_client import JobClient, JobHandle
from kernel_runtime.deploy.local import ClusterInfo, ClusterNotRunning, LocalCluster, default_cluster_dir
from kernel_runtime.notebook.magic_arguments import (ClusterAddress, parse_cluster_args, parse_export_args, parse_stream_args, stream, stream_cluster, stream_export)
from kernel_runtime.client.results import ResultMode

# Errors a user makes or meets in normal use: shown as one message, without a traceback.
EXPECTED_ERRORS = (GraphValidationError, ConfigError, ClusterNotRunning, RpcError, TimeoutError, ValueError)


class StreamCellError(Exception):
    """What a %%stream cell reports: an expected error as one message, or the user's own
    exception with the traceback cut to start at the cell."""

    def __init__(self, message: str, traceback_lines: Optional[list[str]] = None):
        super().__init__(message)
        self.traceback_lines = traceback_lines

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return self.traceback_lines or [str(self)]


def _expected(exc: BaseException, cell_sites: CellSites) -> StreamCellError:
    return StreamCellError(f"{type(exc).__name__}: {cell_sites.rewrite(str(exc))}")


class StreamSession:
    """This kernel's clusters: the embedded one (started at %load_ext or on first use, stopped at
    exit) and the running clusters cells attached to with --cluster, each with one JobClient."""

    def __init__(self, config: dict, taskmanagers: int, slots: int):
        self.config, self.taskmanagers, self.slots = config, taskmanagers, slots
        self.embedded: Optional[LocalCluster] = None
        self._clients: dict[str, JobClient] = {}  # cluster directory -> client
        self.current: Optional[ClusterInfo] = None  # the cluster of the latest cell
        self._starting: Optional[threading.Thread] = None  # the start begun at %load_ext
        self._pending: Optional[LocalCluster] = None  # the cluster that thread is starting
        self.untouched = False  # started (or starting) in the background, and no cell has used it yet
        atexit.register(self.stop)

    # ------------------------------------------------------------------ the embedded cluster
    def start_in_background(self) -> None:
        """Start the embedded cluster without waiting (at %load_ext): a JobManager and
        TaskManagers take seconds to start, their SparkSessions tens of seconds, all of which the
        user would otherwise wait for at the first cell. ``start()`` waits for it."""
        if self.embedded is not None or self._starting is not None:
            return
        self.untouched = True
        self._starting = threading.Thread(target=self._start_quietly, name="streamlab-cluster-start", daemon=True)
        self._starting.start()

    def _start_quietly(self) -> None:
        try:
            self._start(self.taskmanagers, self.slots)
        except BaseException:
            pass  # start() starts it again in the foreground, where its error reaches the user

    def wait_for_background_start(self, timeout: Optional[float] = None) -> None:
        starting = self._starting
        if starting is not None:
            starting.join(timeout)
            if not starting.is_alive():
                self._starting = None

    def start(self, taskmanagers: Optional[int] = None, slots: Optional[int] = None) -> LocalCluster:
        self.wait_for_background_start()
        if self.untouched and ((taskmanagers or self.taskmanagers, slots or self.slots)
                               != (self.taskmanagers, self.slots)):
            self.stop()  # %stream_cluster start of another size, before any job ran on it
        self.untouched = False
        return self._start(taskmanagers, slots)

    def _start(self, taskmanagers: Optional[int], slots: Optional[int]) -> LocalCluster:
        if self.embedded is not None:
            jobmanager = self.embedded.jobmanager
            if jobmanager is not None and jobmanager.poll() is None:
                return self.embedded
            self.stop()  # its JobManager died (killed, out of memory): start a new cluster
        directory = Path(tempfile.mkdtemp(prefix="streamlab-notebook-"))
        cluster = LocalCluster(directory, taskmanagers=taskmanagers or self.taskmanagers,
                               slots=slots or self.slots, config=self.config, embedded=True)
        self._pending = cluster
        try:
            cluster.start()
        except BaseException:
            cluster.stop(timeout=4)
            shutil.rmtree(directory, ignore_errors=True)
            raise
        finally:
            self._pending = None
        _start_watchdog(directory)
        self.embedded = cluster
        lab_registry.register(directory)  # the lab's Streams panel shows it from now on
        return cluster

    def stop(self) -> bool:
        """Stop the embedded cluster (quickly: a kernel restart waits for this)."""
        if self._starting is not None:  # still starting in the background: end that start
            pending = self._pending
            if pending is not None:
                pending.stop(timeout=4)  # its start() fails on this, at once
            self.wait_for_background_start(timeout=30)
        self.untouched = False
        cluster, self.embedded = self.embedded, None
        if cluster is None:
            return False
        client = self._clients.pop(str(cluster.cluster_dir), None)
        if client is not None:
            client.close()
        if self.current is not None and self.current.cluster_dir == cluster.cluster_dir:
            self.current = None
        lab_registry.unregister(cluster.cluster_dir)
        cluster.stop(timeout=4)
        shutil.rmtree(cluster.cluster_dir, ignore_errors=True)
        return True

    # ------------------------------------------------------------------ clients
    def client(self, address: Optional[str] = None) -> JobClient:
        info = self._resolve(address) if address else self.start().info
        client = self._clients.get(str(info.cluster_dir))
        if client is None or client.cluster != info:  # a restarted cluster has new ports and secret
            if client is not None:
                client.close()
            client = self._clients[str(info.cluster_dir)] = JobClient(info)
        self.current = info
        lab_registry.register(info.cluster_dir)
        return client

    def _resolve(self, address: str) -> ClusterInfo:
        where = ClusterAddress.parse(address)
        if where.directory is not None:
            return ClusterInfo.load(Path(where.directory).expanduser())
        rpc_address = where.rpc_address
        if rpc_address is None:
            raise ValueError(f"cluster address {address!r} names neither a directory nor a host:port")
        # Messages are signed with the cluster's secret, which lives in its directory: find the
        # directory of the cluster that listens there.
        known = [default_cluster_dir()] + ([self.embedded.cluster_dir] if self.embedded else [])
        for directory in known:
            try:
                info = ClusterInfo.load(directory)
            except ClusterNotRunning:
                continue
            if _same_address(info.rpc_address, rpc_address):
                return info
        raise ClusterNotRunning(
            f"no running cluster known at {where.rpc_address} (looked in {', '.join(map(str, known))}); "
            "a client needs the cluster's secret, which is in its directory: use --cluster DIR")


@dataclass(frozen=True)
class Upgrade:
    """A job of the cell's name stopped with a savepoint, for the edited pipeline to start from."""

    name: str
    old_job_id: str
    location: str

    def graph(self, graph: JobGraph, allow_non_restored_state: bool) -> JobGraph:
        return dataclasses.replace(graph, config={**graph.config, "execution.savepoint.path": self.location,
                                                  "execution.savepoint.ignore-unclaimed-state": allow_non_restored_state})

    def failure(self, exc: BaseException) -> str:
        return (f"The upgrade of job {self.name!r} failed: {type(exc).__name__}: {exc}\n"
                f"The old job ({self.old_job_id}) is stopped and its state is in the savepoint {self.location}: "
                "re-run this cell with --allow-non-restored-state to start from it without the state that fits "
                "no operator, or with --restart to start from nothing.")

    def report(self, graph: JobGraph) -> list[str]:
        """What the cell prints: the savepoint, and which operators kept their state and which
        started empty (from the savepoint's metadata, if this machine sees it)."""
        lines = [f"Upgraded job {self.name!r}: job {self.old_job_id} stopped with savepoint {self.location}; "
                 f"job {graph.job_id} starts from it."]
        try:
            fit = savepoint_fit(read_metadata(Path(local_path(self.location))), graph)
        except (OSError, ValueError) as exc:  # a cluster whose storage this kernel does not see
            return lines + [f"  (which operators kept their state is not known here: {exc})"]
        return lines + upgrade_lines(fit)


def upgrade_lines(fit: SavepointFit) -> list[str]:
    def names(specs: list[OperatorSpec]) -> str:
        return ", ".join(repr(o.name) for o in specs) or "none"
    lines = [f"  kept their state: {names(fit.kept)}", f"  started empty: {names(fit.empty)}"]
    left_out = [saved_operator(uid, e) for uid, e in sorted(fit.unclaimed.items())]
    left_out += [saved_operator(spec.uid, e) + f" ({e['kind']}, now {spec.kind})" for spec, e in fit.changed]
    if left_out:
        lines.append("  state left out (--allow-non-restored-state): " + ", ".join(left_out))
    return lines


def _wait_ended(client: JobClient, job_id: str, timeout: float = 60.0) -> None:
    """Until the job is over (its slots are free for the job that replaces it)."""
    deadline = time.monotonic() + timeout
    while client.job_status(job_id).state not in JobState.GLOBALLY_TERMINAL:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not end within {timeout:g} s of being stopped")
        time.sleep(0.1)


def _start_watchdog(directory: Path) -> None:
    # A kernel killed outright (SIGKILL, out of memory) runs no atexit handler, and the cluster's
    # processes live in sessions of their own: this small process stops them when the kernel is gone.
    subprocess.Popen([sys.executable, "-I", processes.__file__, str(os.getpid()), str(directory)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def _same_address(a: str, b: str) -> bool:
    def norm(addr: str) -> str:
        return addr.replace("tcp://", "").replace("localhost:", "127.0.0.1:")
    return norm(a) == norm(b)


def default_cluster_config() -> dict:
    """The embedded cluster's defaults: metrics reported more often than on a production
    cluster, so the dashboard moves smoothly. Spark starts with each TaskManager, as on any
    cluster (taskmanager.spark.startup: eager): a notebook that runs Spark finds it warm, and
    one that never does pays a JVM per TaskManager, started one after the other, in the background
    (``%config StreamMagics.cluster_config = {"taskmanager.spark.startup": "lazy"}`` saves it)."""
    wanted = {"heartbeat.interval": "500 ms", "metrics.fetcher.update-interval": "500 ms"}
    return {k: v for k, v in wanted.items() if k in OPTIONS}


@magics_class
class StreamMagics(Magics):
    taskmanagers = Int(2, help="TaskManagers of the embedded cluster.").tag(config=True)
    slots = Int(2, help="Slots per TaskManager of the embedded cluster.").tag(config=True)
    cluster_config = Dict(help="Configuration (Flink's keys) of the embedded cluster, over the "
                               "notebook defaults.").tag(config=True)
    poll_interval = Float(0.3, help="Seconds between a dashboard's last refreshes once its job ended (before, "
                                    "the job's events bring every update).").tag(config=True)
    display_rows = Int(10, help="Result rows the dashboard shows (the newest).").tag(config=True)
    start_at_load = Bool(True, help="Start the embedded cluster in the background at %load_ext, so that the "
                                    "first cell finds it (and Spark) up.").tag(config=True)

    def __init__(self, shell):
        super().__init__(shell)
        self._session: Optional[StreamSession] = None
        # the handles of the jobs this kernel's cells submitted, by job name (the latest of a name)
        self.jobs: dict[str, JobHandle] = {}
        # (cluster directory, job name) -> an upgrade whose new job was refused: its old job is
        # stopped and its state is in the savepoint, which the cell's next run starts from
        self._stopped: dict[tuple[str, str], Upgrade] = {}

    @property
    def ipython(self) -> InteractiveShell:
        if self.shell is None:
            raise RuntimeError("the %%stream magics are used outside an IPython shell")
        return self.shell

    @property
    def session(self) -> StreamSession:
        config = default_cluster_config() | dict(self.cluster_config)
        if self._session is not None and self._session.untouched and (
                (self._session.config, self._session.taskmanagers, self._session.slots)
                != (config, self.taskmanagers, self.slots)):
            # %config after %load_ext, before any cell used the cluster started at load: honour it
            self._session.stop()
            self._session = None
        if self._session is None:
            self._session = StreamSession(config, self.taskmanagers, self.slots)
        return self._session

    # ------------------------------------------------------------------ %%stream
    @cell_magic
    def stream(self, line: str, cell: str) -> JobHandle:
        args = parse_stream_args(line)
        sites = CellSites(self.ipython)
        try:
            env = StreamEnvironment(parallelism=args.parallelism, config=args.job_config())
        except GraphValidationError as exc:
            raise _expected(exc, sites) from None
        self._run_body(line, cell, env)
        sites = CellSites(self.ipython)
        name = args.name or f"cell {running_cell(self.ipython)}"
        upgrade: Optional[Upgrade] = None
        try:
            graph = env.get_job_graph(name)
            result_mode = ResultMode(args.mode, args.max_rows)
            client = self.session.client(args.cluster)
            if args.name:  # only a name the user gave says "this is that job, edited"
                upgrade = self._replace_running(client, name, args.restart)
            if upgrade is not None:
                graph = upgrade.graph(graph, args.allow_non_restored_state)
            handle = client.submit(graph, detached=args.detached, result_mode=result_mode)
        except EXPECTED_ERRORS as exc:
            if upgrade is not None:  # kept, so that a re-run with --allow-non-restored-state finds it
                self._stopped[(str(client.cluster.cluster_dir), name)] = upgrade
                raise StreamCellError(upgrade.failure(exc)) from None
            raise _expected(exc, sites) from None
        if upgrade is not None:
            handle.upgraded_from = upgrade.location
            print("\n".join(upgrade.report(graph)))
        if args.output:
            self.ipython.user_ns[args.output] = handle
        self.jobs[name] = handle
        if args.detached:
            print(f"Job has been submitted with JobID {handle.job_id}")
        from kernel_runtime.notebook.widgets import in_kernel
        if in_kernel():  # start the feed now: the first picture is ready when the output shows
            handle.dashboard(poll_interval=self.poll_interval, rows=self.display_rows)
        return handle

    def _replace_running(self, client: JobClient, name: str, restart: bool) -> Optional[Upgrade]:
        """The running job of this name on the client's cluster, if any, stopped with a savepoint
        (the upgrade to submit) or, with ``restart``, cancelled (None: start from nothing). The
        savepoint of an upgrade that failed is taken up again by the next run of the cell."""
        running = [j for j in client.list_jobs()
                   if j["name"] == name and j["state"] not in JobState.GLOBALLY_TERMINAL]
        if len(running) > 1:
            raise ValueError(f"{len(running)} jobs named {name!r} run on the cluster ("
                             + ", ".join(j["jid"] for j in running) + "): cancel all but one to upgrade it")
        # a job of the name that runs now is newer than the savepoint of a refused upgrade
        pending = self._stopped.pop((str(client.cluster.cluster_dir), name), None)
        if restart:
            for job in running:
                client.cancel(job["jid"])
                _wait_ended(client, job["jid"])
                print(f"Cancelled job {name!r} ({job['jid']}): this one starts from nothing (--restart).")
            return None
        if not running:
            return pending
        job_id = running[0]["jid"]
        try:
            location = client.trigger_savepoint(job_id, stop=True)
        except (RpcError, TimeoutError) as exc:
            raise RpcError(f"cannot upgrade job {name!r} ({job_id}): stopping it with a savepoint failed: {exc}. "
                           "It runs on; --restart replaces it without its state") from None
        _wait_ended(client, job_id)
        return Upgrade(name, job_id, location)

    def _run_body(self, line: str, cell: str, env: StreamEnvironment) -> str:
        """Run the cell body with ``env`` in the user's namespace; returns the body's file name."""
        shell = self.ipython
        # a blank first line stands for the %%stream line, so line numbers are the cell's own
        source = "\n" + shell.transform_cell(cell)
        filename = shell.compile.cache(source, running_cell(shell), raw_code=f"%%stream {line}\n{cell}")
        sites = CellSites(shell)
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise StreamCellError(f"SyntaxError: {exc.msg} ({sites.name(filename)}, line {exc.lineno})") from None
        shell.user_ns["env"] = env
        try:
            exec(code, shell.user_ns)
        except GraphValidationError as exc:
            raise _expected(exc, sites) from None
        except Exception as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != filename:
                tb = tb.tb_next
            lines = shell.InteractiveTB.structured_traceback(type(exc), exc, tb or exc.__traceback__)
            raise StreamCellError(sites.rewrite(f"{type(exc).__name__}: {exc}"), lines) from exc
        return filename

    # ------------------------------------------------------------------ %stream_export
    @line_magic
    def stream_export(self, line: str) -> None:
        from kernel_runtime.export.package import ExportError, export_notebook
        args = parse_export_args(line)
        notebook = args.notebook or self._notebook_path()
        if notebook is None:
            raise StreamCellError("%stream_export: this kernel does not know its notebook's path; "
                                  "give it with --notebook PATH")
        notebook = Path(notebook)
        try:
            written = export_notebook(notebook, Path(args.output) if args.output else notebook.with_suffix(""),
                                      args.cell)
        except ExportError as exc:
            raise StreamCellError(f"ExportError: {exc}") from None
        print(f"Exported from {notebook} as saved on disk:")
        for package, directory in written:
            print(f"  {package.cell.label} -> {directory}")

    def _notebook_path(self) -> Optional[str]:
        # Jupyter names a notebook's kernel session after the notebook's path (relative to the
        # server's root, which is the kernel's working directory when it started): ipykernel puts
        # it in __session__, jupyter_server in JPY_SESSION_NAME
        # (a notebook's kernel starts in the notebook's folder: the name alone finds it there)
        for candidate in (self.ipython.user_ns.get("__session__"), os.environ.get("JPY_SESSION_NAME")):
            if not candidate or not str(candidate).endswith(".ipynb"):
                continue
            for path in (Path(candidate), Path.cwd() / Path(candidate).name):
                if path.is_file():
                    return str(path)
        return None

    # ------------------------------------------------------------------ %stream_cluster
    @line_magic
    def stream_cluster(self, line: str) -> None:
        args = parse_cluster_args(line)
        session = self.session
        try:
            if args.action == "start":
                session.wait_for_background_start()
                cluster = session.embedded
                # one started at %load_ext is the cluster asked for (start() resizes it if need be)
                if cluster is not None and not session.untouched:
                    print("The embedded cluster is already running (%stream_cluster stop, then start to resize it).")
                else:
                    cluster = session.start(args.taskmanagers, args.slots)
                session.current = cluster.info
                self._print_status(session.client())
            elif args.action == "stop":
                print("Embedded cluster stopped." if session.stop() else "No embedded cluster is running.")
            else:
                session.wait_for_background_start()
                info = session.current or (session.embedded.info if session.embedded is not None else None)
                if info is None:
                    print("No cluster yet: %stream_cluster start, or the first %%stream cell, starts one.")
                else:
                    self._print_status(session.client(str(info.cluster_dir)))
        except EXPECTED_ERRORS as exc:
            raise StreamCellError(f"{type(exc).__name__}: {exc}") from None

    @staticmethod
    def _print_status(client: JobClient) -> None:
        overview = client.cluster_overview()
        o = overview.overview
        print(f"JobManager {client.cluster.rpc_address}  REST {client.cluster.rest_address}")
        print(f"{o['taskmanagers']} TaskManagers, {o['slots-available']} of {o['slots-total']} slots free, "
              f"{o['jobs-running']} jobs running")
        for tm in sorted(overview.taskmanagers, key=lambda t: t["id"]):
            print(f"  TaskManager {tm['id']}: {tm['freeSlots']} of {tm['slotsNumber']} slots free")
        for job in client.list_jobs():
            print(f"  job {job['jid']} {job['name']!r}: {job['state']}")


StreamMagics.stream.__doc__ = stream.__doc__
StreamMagics.stream_cluster.__doc__ = stream_cluster.__doc__
StreamMagics.stream_export.__doc__ = stream_export.__doc__


def load_ipython_extension(shell) -> None:
    magics = StreamMagics(shell)
    shell.register_magics(magics)
    shell.configurables.append(magics)  # so %config StreamMagics.<option> = ... reaches it
    from kernel_runtime.notebook.widgets import bokeh_resources
    bokeh_resources.display_loader()
    if magics.start_at_load:
        magics.session.start_in_background()


def unload_ipython_extension(shell) -> None:
    for magics in [c for c in shell.configurables if isinstance(c, StreamMagics)]:
        if magics._session is not None:
            magics._session.stop()
        shell.configurables.remove(magics)
