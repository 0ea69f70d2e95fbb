"""streamlab's client side: the pipeline API, the JobClient, the CLI (and the notebook magic)."""
from .api import DataStream, GraphValidationError, KeyedStream, StreamEnvironment
from .client import JobCancelledError, JobClient, JobExecutionError, JobExecutionResult, JobHandle
from .local_cluster import ClusterInfo, LocalCluster

__version__ = "0.1.0"
__all__ = ["StreamEnvironment", "DataStream", "KeyedStream", "GraphValidationError", "JobClient",
           "JobHandle", "JobExecutionResult", "JobExecutionError", "JobCancelledError", "LocalCluster",
           "ClusterInfo"]
