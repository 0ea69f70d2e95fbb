"""JobClient: the one way into a cluster, for scripts, the CLI and the notebook magic.

It submits JobGraphs and asks about jobs over the JobManager's control socket; a submitted job
is followed through its JobHandle (kernel_runtime.client.job_handle), whose collect sinks stream
their rows to the client's ResultReceiver. Of an HA cluster the client follows the leading
JobManager (kernel_runtime.client.leader).
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, ClassVar, Optional

from cluster.graph.job_graph import MAX_SIZE_KEY, JobGraph
from cluster.protocol import messages as m
from cluster.protocol.curve import cluster_codec
from cluster.protocol.endpoint import R, RpcError
from cluster.protocol.rpc_client import RpcClient
from cluster.protocol.sockets import local_address_towards

from kernel_runtime.client.cluster_info import ClusterInfo
from kernel_runtime.client.events import ClusterEvents, JobView, JobWatch
from kernel_runtime.client.job_handle import JobHandle
from kernel_runtime.client.result_receiver import ResultReceiver
from kernel_runtime.client.leader import LeaderWatch
from kernel_runtime.client.results import KEEP_ALL, ResultMode

log = logging.getLogger(__name__)



class _Acknowledger:
    """Sends the acknowledgements of collect barriers to the JobManager from a thread of its own,
    so the result socket never waits for an answer."""

    def __init__(self, client: "JobClient"):
        self.client = client
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="result acks", daemon=True)
        self._thread.start()

    def send(self, ack: m.AcknowledgeCollect) -> None:
        self._queue.put(ack)

    def _run(self) -> None:
        while (ack := self._queue.get()) is not None:
            try:
                self.client.request(ack, timeout=5, expect=m.Acknowledge)
            except Exception as exc:  # the job ended or restarted meanwhile: the checkpoint is moot
                log.warning("could not acknowledge checkpoint %s of job %s: %s", ack.checkpoint_id, ack.job_id, exc)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(1)


class JobClient:
    """Any thread may call its methods. Of an HA cluster it follows the leading JobManager
    (kernel_runtime.client.leader): a request that the old leader left unanswered is asked again of the
    new one, except a submission (the old leader may have stored the job, which the new one
    then recovers: asking again would run it twice)."""

    # each may rewrite a graph before it is submitted, on the submitting thread: the notebook
    # names the cells a kernel's job comes from (kernel_runtime.notebook registers it when imported)
    graph_hooks: ClassVar[list[Callable[[JobGraph], JobGraph]]] = []

    def __init__(self, cluster: ClusterInfo, timeout: float = 10.0):
        self.cluster = cluster
        conf = cluster.configuration()
        self.codec = cluster_codec(conf, cluster.secret)
        self.rpc = RpcClient(cluster.rpc_address, self.codec, timeout)
        self.max_job_graph_bytes: int = conf[MAX_SIZE_KEY]
        self._results: Optional[ResultReceiver] = None
        self._leader_lock = threading.Lock()
        self._leader = LeaderWatch.of(conf)
        if self._leader is not None:
            self._leader.subscribe(self._leader_changed)
            self._leader_changed(self._leader.leader(timeout))  # it may have changed since ``cluster`` was read

    def _leader_changed(self, leader: dict) -> None:
        """A ZooKeeper thread (or the constructor): point the control socket at the new leader."""
        with self._leader_lock:
            cluster = self.cluster.with_leader(leader)
            if cluster.rpc_address == self.rpc.address or self.rpc.closed:
                return
            log.warning("following the new leading JobManager at %s", cluster.rpc_address)
            old, self.rpc = self.rpc, RpcClient(cluster.rpc_address, self.codec, self.rpc.timeout)
            self.cluster = cluster
        old.close()  # what waits on the old leader fails now, and is asked again (request)

    def request(self, msg: m.Message, *, expect: type[R], timeout: Optional[float] = None, again: bool = True) -> R:
        """Ask the leading JobManager; if the leader changed before it answered, ask the new one
        (``again``), once."""
        rpc = self.rpc
        try:
            return rpc.request(msg, expect=expect, timeout=timeout)
        except (RpcError, TimeoutError):
            if not again or self.rpc is rpc:
                raise
        return self.rpc.request(msg, expect=expect, timeout=timeout)

    @property
    def results(self) -> ResultReceiver:
        if self._results is None:
            self._acknowledger = _Acknowledger(self)
            self._results = ResultReceiver(self.codec, self._acknowledger.send,
                                           host=local_address_towards(self.cluster.rpc_address))
        return self._results

    def submit(self, job_graph: JobGraph, detached: bool = False,
               result_mode: ResultMode = KEEP_ALL) -> JobHandle:
        """Submit a job. Attached, its collect sinks stream to this client, which keeps their rows
        as ``result_mode`` says (by default all of them, as the stream is: every row of an append
        stream, the table per key of an upsert stream, what a script waiting for a bounded job wants).
        A graph over pipeline.jobgraph.max-size is refused here (JobGraphTooLarge), before anything is sent."""
        for hook in self.graph_hooks:
            job_graph = hook(job_graph)
        job_graph.check_size(self.max_job_graph_bytes)
        sinks = {o.name: o.uid for v in job_graph.vertices for o in v.operators if o.kind == "collect-sink"}
        parallelism = {o.uid: v.parallelism for v in job_graph.vertices for o in v.operators}
        result_address = None
        if sinks and not detached:
            buffers = {uid: (parallelism[uid], result_mode.buffer_for(job_graph, uid, name))
                       for name, uid in sinks.items()}
            self.results.expect(job_graph.job_id, buffers)
            result_address = self.results.address
        reply = self.request(m.SubmitJob(job_graph.to_dict(), result_address), expect=m.JobSubmitted, again=False)
        return JobHandle(self, reply.job_id, job_graph.name, sinks, job_graph, detached)

    def job_status(self, job_id: str) -> m.JobStatus:
        return self.request(m.RequestJobStatus(job_id), expect=m.JobStatus)

    def follow(self, job_id: str, listener: Optional[Callable[[JobView], None]] = None) -> JobWatch:
        """Follow a job's events (through this process's one subscription to the cluster);
        close the watch when done. ``listener(view)`` runs on the events thread and must not block."""
        return ClusterEvents.follow(self.cluster, job_id, listener)

    def control_stats(self) -> dict[str, int]:
        """How many control messages the JobManager handled since it started, per op."""
        return self.request(m.RequestControlStats(), expect=m.ControlStats).handled

    def list_jobs(self) -> list[dict]:
        return self.request(m.ListJobs(), expect=m.JobList).jobs

    def cancel(self, job_id: str) -> None:
        self.request(m.CancelJob(job_id), expect=m.Acknowledge)

    def cluster_overview(self) -> m.ClusterOverview:
        return self.request(m.RequestClusterOverview(), expect=m.ClusterOverview)

    def job_details(self, job_id: str) -> dict:
        """GET /jobs/<jobid> as a dict, plus "subtasks": state, TaskManager, slot and metrics of each."""
        return self.request(m.RequestJobDetails(job_id), expect=m.JobDetails).details

    def trigger_savepoint(self, job_id: str, target_directory: Optional[str] = None, stop: bool = False,
                          timeout: float = 600.0) -> str:
        """Take a savepoint (stop=True: then end the job); returns its location once complete."""
        return self.request(m.TriggerSavepoint(job_id, target_directory, stop), timeout=timeout,
                                expect=m.SavepointCompleted).location

    def dispose_savepoint(self, location: str) -> None:
        self.request(m.DisposeSavepoint(location), expect=m.Acknowledge)

    def shutdown_cluster(self) -> None:
        self.request(m.ShutdownCluster(), expect=m.Acknowledge)

    def close(self) -> None:
        if self._leader is not None:
            self._leader.release(self._leader_changed)
        if self._results is not None:
            self._results.close()
            self._acknowledger.close()
        with self._leader_lock:
            self.rpc.close()
