"""What the magics show in the notebook: errors where the user made them, the cluster's status, the
job's live dashboard.

An error a user makes or meets in normal use (a bad pipeline, a cluster that is not running) reads
as one message; the user's own exception keeps its traceback, cut to start at the cell. Both go
through IPython's ``_render_traceback_``, so the kernel prints no traceback of the magic itself.
"""
from __future__ import annotations

from typing import Optional

from cluster.conf import ConfigError
from cluster.graph.job_graph import GraphValidationError
from cluster.protocol.endpoint import RpcError

from kernel_runtime.client.cluster_info import ClusterNotRunning
from kernel_runtime.client.job_client import JobClient
from kernel_runtime.client.job_handle import JobHandle
from kernel_runtime.notebook.cells import CellSites

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


def expected_error(exc: BaseException, cell_sites: CellSites) -> StreamCellError:
    return StreamCellError(f"{type(exc).__name__}: {cell_sites.rewrite(str(exc))}")


def show_dashboard(handle: JobHandle, poll_interval: float, rows: int) -> None:
    from kernel_runtime.notebook.widgets import in_kernel
    if in_kernel():  # start the feed now: the first picture is ready when the output shows
        handle.dashboard(poll_interval=poll_interval, rows=rows)


def print_status(client: JobClient) -> None:
    """``%stream_cluster start`` and ``status``: the cluster's addresses, TaskManagers, slots and jobs."""
    overview = client.cluster_overview()
    o = overview.overview
    print(f"JobManager {client.cluster.rpc_address}  REST {client.cluster.rest_address}")
    print(f"{o['taskmanagers']} TaskManagers, {o['slots-available']} of {o['slots-total']} slots free, "
          f"{o['jobs-running']} jobs running")
    for tm in sorted(overview.taskmanagers, key=lambda t: t["id"]):
        print(f"  TaskManager {tm['id']}: {tm['freeSlots']} of {tm['slotsNumber']} slots free")
    for job in client.list_jobs():
        print(f"  job {job['jid']} {job['name']!r}: {job['state']}")
