"""What a notebook adds to the client, registered with it: the client never imports the notebook.

The client package (kernel_runtime.client) works the same in a script, the CLI and a kernel; what
only a notebook has is added here: a job submitted from a kernel names the cells its code comes
from (cells.with_notebook_cells, a JobClient graph hook), and a JobHandle shown in a cell's output
is the live dashboard with the job named for the lab extension (JobHandle.display).
``install()`` runs when kernel_runtime.notebook is imported, which kernel_runtime itself does,
so every process that uses the client has them, as before the split (once: it is idempotent).
"""
from __future__ import annotations

from typing import Any

from kernel_runtime.client.job_client import JobClient
from kernel_runtime.client.job_handle import JobHandle
from kernel_runtime.notebook import lab_registry
from kernel_runtime.notebook.cells import with_notebook_cells
from kernel_runtime.notebook.widgets import in_kernel


class NotebookDisplay:
    """A handle's dashboard (loaded with ipywidgets and Bokeh on first use) and rich display."""

    def dashboard(self, handle: JobHandle, **options) -> Any:
        from kernel_runtime.notebook.widgets.dashboard import Dashboard
        return Dashboard(handle, **options)

    def mimebundle(self, handle: JobHandle, include, exclude) -> dict:
        """The dashboard's bundle in a kernel (nothing elsewhere), and the job for the lab: its
        "Cancel this cell's job" finds the job by these."""
        bundle = handle.dashboard()._repr_mimebundle_(include, exclude) if in_kernel() else {}
        return (bundle or {}) | {lab_registry.JOB_MIME_TYPE: {
            "job_id": handle.job_id, "name": handle.name,
            "cluster_id": lab_registry.cluster_id(handle.client.cluster.cluster_dir)}}


def install() -> None:
    """Register the notebook's additions with the client (at import: the importing thread)."""
    if with_notebook_cells not in JobClient.graph_hooks:
        JobClient.graph_hooks.append(with_notebook_cells)
    if JobHandle.display is None:
        JobHandle.display = NotebookDisplay()
