"""``%%stream``, ``%%stream_sql``, ``%stream_cluster`` and ``%stream_export``: the notebook's job client.

Thin on purpose: parse the arguments (kernel_runtime.export.magic_arguments), run the cell body on a
fresh ``env``, submit through the JobClient of the session's cluster (kernel_runtime.notebook.session),
return the JobHandle (whose display is the live dashboard). A named cell run again upgrades its
job (kernel_runtime.notebook.upgrade).

Errors are reported where the user made them (kernel_runtime.notebook.display): a cell body's
traceback starts at the cell, and the API's "file:line" call sites read "In [5], line 3" (line 1 is
the ``%%stream`` line), as do the places of a job's failures (kernel_runtime.notebook.cells).
"""
from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path
from typing import Optional

import pandas as pd
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from traitlets import Bool, Dict, Float, Int

from cluster.checkpoint.savepoint_fit import PREVIEW_COLUMNS
from cluster.graph.job_graph import GraphValidationError

from kernel_runtime.api import StreamEnvironment
from kernel_runtime.client.job_handle import JobHandle
from kernel_runtime.client.results import ResultMode
from kernel_runtime.export.magic_arguments import (parse_cluster_args, parse_export_args, parse_stream_args,
                                                   parse_stream_sql_args, stream, stream_cluster, stream_export,
                                                   stream_sql)
from kernel_runtime.notebook.cells import CellSites, running_cell
from kernel_runtime.notebook.display import (EXPECTED_ERRORS, StreamCellError, expected_error, print_status,
                                             show_dashboard)
from kernel_runtime.notebook.session import StreamSession, default_cluster_config
from kernel_runtime.notebook.upgrade import JobUpgrades, Upgrade


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
        self.upgrades = JobUpgrades()

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
    def stream(self, line: str, cell: str) -> "JobHandle | pd.DataFrame":
        args = parse_stream_args(line)
        sites = CellSites(self.ipython)
        try:
            env = StreamEnvironment(parallelism=args.parallelism, config=args.job_config())
        except GraphValidationError as exc:
            raise expected_error(exc, sites) from None
        self._run_body(line, cell, env)
        return self._submit(args, env)

    @cell_magic
    def stream_sql(self, line: str, cell: str) -> "JobHandle | pd.DataFrame | None":
        args, explain = parse_stream_sql_args(line)
        shell = self.ipython
        # the query as the cell's code, so that its site reads "In [5], line 2" (line 1: the %%stream_sql line)
        filename = shell.compile.cache("\n" + cell, running_cell(shell), raw_code=f"%%stream_sql {line}\n{cell}")
        sites = CellSites(shell)
        name = args.name or "sql"  # the query's operator and its sink
        try:
            env = StreamEnvironment(parallelism=args.parallelism, config=args.job_config())
            result = env.sql_query(cell, name=name, site=f"{os.path.basename(filename)}:2")
        except GraphValidationError as exc:
            raise expected_error(exc, sites) from None
        if explain:
            print(result.explain())
            return None
        result.collect(name)
        return self._submit(args, env)

    def _submit(self, args, env: StreamEnvironment) -> "JobHandle | pd.DataFrame":
        """Submit the pipeline a cell built on ``env`` (an upgrade if a job of its --name runs) and
        show its dashboard; with --dry-run, the upgrade's preview (a pandas DataFrame) instead."""
        sites = CellSites(self.ipython)
        name = args.name or f"cell {running_cell(self.ipython)}"
        upgrade: Optional[Upgrade] = None
        if args.dry_run:
            try:
                rows, verdict = self.upgrades.preview(self.session.client(args.cluster), name,
                                                      env.get_job_graph(name), args.allow_non_restored_state)
            except EXPECTED_ERRORS as exc:
                raise expected_error(exc, sites) from None
            print(f"Dry run, nothing stopped or submitted. {verdict}")
            preview = pd.DataFrame(rows, columns=PREVIEW_COLUMNS)
            if args.output:
                self.ipython.user_ns[args.output] = preview
            return preview
        try:
            graph = env.get_job_graph(name)
            result_mode = ResultMode(args.mode, args.max_rows)
            client = self.session.client(args.cluster)
            if args.name:  # only a name the user gave says "this is that job, edited"
                upgrade = self.upgrades.replace_running(client, name, args.restart, graph,
                                                        args.allow_non_restored_state)
            if upgrade is not None:
                graph = upgrade.graph(graph, args.allow_non_restored_state)
            handle = client.submit(graph, detached=args.detached, result_mode=result_mode)
        except EXPECTED_ERRORS as exc:
            if upgrade is not None:  # kept, so that a re-run with --allow-non-restored-state finds it
                self.upgrades.keep_refused(client, name, upgrade)
                raise StreamCellError(upgrade.failure(exc)) from None
            raise expected_error(exc, sites) from None
        if upgrade is not None:
            handle.upgraded_from = upgrade.location
            print("\n".join(upgrade.report(graph)))
        if args.output:
            self.ipython.user_ns[args.output] = handle
        self.jobs[name] = handle
        if args.detached:
            print(f"Job has been submitted with JobID {handle.job_id}")
        show_dashboard(handle, self.poll_interval, self.display_rows)
        return handle

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
            raise expected_error(exc, sites) from None
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
        from kernel_runtime.export.package import export_notebook
        from kernel_runtime.export.slicing import ExportError
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
                print_status(session.client())
            elif args.action == "stop":
                print("Embedded cluster stopped." if session.stop() else "No embedded cluster is running.")
            else:
                session.wait_for_background_start()
                info = session.current or (session.embedded.info if session.embedded is not None else None)
                if info is None:
                    print("No cluster yet: %stream_cluster start, or the first %%stream cell, starts one.")
                else:
                    print_status(session.client(str(info.cluster_dir)))
        except EXPECTED_ERRORS as exc:
            raise StreamCellError(f"{type(exc).__name__}: {exc}") from None


StreamMagics.stream.__doc__ = stream.__doc__
StreamMagics.stream_sql.__doc__ = stream_sql.__doc__
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
        from kernel_runtime.api.sql import analysis
        # the planner's session, up by the time a cell's .sql needs it: a wrong column is then
        # refused in the cell at once, instead of by the job's first task seconds later
        analysis.warm_up_after = magics.session.wait_for_spark
        analysis.warm_up()
        import_dashboard_when_spark_is_up(shell, magics.session)


DASHBOARD_MODULE = "kernel_runtime.notebook.widgets.dashboard"


def import_dashboard_when_spark_is_up(shell, session: StreamSession) -> None:
    """The dashboard's modules (Bokeh, ipywidgets: a second of imports) imported on the kernel's
    own thread, between cells, once the cluster's Spark is up: the first cell's dashboard is then
    shown at once, and its job's TaskManager has the cores meanwhile (bench/first_spark_cell.py,
    Spark warm: the first row 0.9-1.0 s after the cell began, 1.0-1.4 s with the imports in the cell).
    Not on a thread of its own: two threads importing Bokeh's modules can deadlock on their locks."""
    loop = getattr(getattr(shell, "kernel", None), "io_loop", None)
    if loop is None:
        return  # not a kernel (IPython in a terminal): the first dashboard imports them

    def when_up() -> None:
        try:
            session.wait_for_spark()
        except Exception:
            return  # no cluster: nothing to hurry for
        loop.add_callback(importlib.import_module, DASHBOARD_MODULE)
    threading.Thread(target=when_up, name="streamlab-dashboard-import", daemon=True).start()


def unload_ipython_extension(shell) -> None:
    for magics in [c for c in shell.configurables if isinstance(c, StreamMagics)]:
        if magics._session is not None:
            magics._session.stop()
        shell.configurables.remove(magics)
