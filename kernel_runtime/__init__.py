"""streamlab's client side: the pipeline API, the JobClient, the CLI (and the notebook magic)."""
from kernel_runtime.api import (DataStream, GraphValidationError, KeyedStream, StreamEnvironment, create_temporary_view,
                                drop_temporary_view)
from kernel_runtime.client.job_client import JobClient
from kernel_runtime.client.job_handle import JobCancelledError, JobExecutionError, JobExecutionResult, JobHandle
from kernel_runtime.client.cluster_info import ClusterInfo
from kernel_runtime.deploy.local import LocalCluster
from kernel_runtime import notebook  # noqa: F401 (it registers its additions to the client: JobHandle.display)

__version__ = "0.1.0"
__all__ = ["StreamEnvironment", "DataStream", "KeyedStream", "GraphValidationError", "JobClient",
           "JobHandle", "JobExecutionResult", "JobExecutionError", "JobCancelledError", "LocalCluster",
           "ClusterInfo", "create_temporary_view", "drop_temporary_view"]


def load_ipython_extension(shell) -> None:
    """``%load_ext kernel_runtime``: the %%stream and %stream_cluster magics (IPython is imported
    only here, so the package works without it)."""
    from kernel_runtime.notebook.magic import load_ipython_extension as load
    load(shell)


def unload_ipython_extension(shell) -> None:
    from kernel_runtime.notebook.magic import unload_ipython_extension as unload
    unload(shell)
