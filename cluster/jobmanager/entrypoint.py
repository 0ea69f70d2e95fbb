"""The JobManager process: one control socket, one loop thread, three kinds of components.

Dispatcher, ResourceManager and JobMasters are separate classes with separate handler tables;
this entry point binds the socket, merges their tables into the endpoint's (a message type
belongs to exactly one component), starts the REST server and publishes the bound addresses in
``<cluster-dir>/jobmanager.json`` for launchers and clients. A standby (HA) binds no control
socket until it leads; its REST endpoint answers for the leader meanwhile (rest_forward.py), at
the address in ``<cluster-dir>/jobmanager-standby-<pid>.json``.
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import psutil

from cluster.conf import Configuration
from cluster.common.launch import add_owner_arguments
from cluster.common.lifecycle import HARD_EXIT_AFTER_S, POLL_S, StopRequest, exit_within, follow_owner
from cluster.common.process_logging import configure_process_logging
from cluster.protocol.auth import load_secret, rest_token
from cluster.protocol import messages as m
from cluster.protocol.curve import cluster_codec
from cluster.protocol.endpoint import RpcEndpoint

from cluster.jobmanager.application import Application
from cluster.jobmanager.dispatcher import Dispatcher
from cluster.jobmanager.events import JobEventPublisher
from cluster.ha.services import LeaderRetriever, ZooKeeperHaServices, exit_on_revocation, ha_enabled
from cluster.jobmanager.resourcemanager.resource_manager import ResourceManager, task_manager_provider
from cluster.jobmanager.rest.server import RestServer, bind_rest_sockets
from cluster.jobmanager.rest.forwarding import RestForwarder
from cluster.conf.options import JobManagerOptions

log = logging.getLogger("streamlab.jobmanager")


class JobManager:
    def __init__(self, conf: Configuration, secret: bytes, cluster_dir: Path,
                 rest_sockets: Optional[list[socket.socket]] = None):
        for key, folder in (("execution.checkpointing.dir", "checkpoints"), ("state.savepoints.dir", "savepoints")):
            if not conf[key]:  # Flink has no default folder; a local cluster keeps them in its own
                conf.update({key: str(cluster_dir / folder)}, "the cluster directory")
        self.conf = conf
        self.endpoint = RpcEndpoint("jobmanager", cluster_codec(conf, secret))
        bind_host = conf.get(JobManagerOptions.BIND_HOST) or conf.get(JobManagerOptions.ADDRESS)
        bound = self.endpoint.bind_router(f"tcp://{bind_host}:{conf['jobmanager.rpc.port']}")
        # what jobmanager.json and clients get: the advertised name, not a 0.0.0.0 bind
        self.rpc_address = f"tcp://{conf['jobmanager.rpc.address']}:{bound.rsplit(':', 1)[1]}"
        self.cluster_dir = cluster_dir
        self.resource_manager = ResourceManager(self.endpoint, conf,
                                                provider=task_manager_provider(conf, cluster_dir, self.rpc_address))
        # one thread for every blocking disk operation (_metadata, restore reads, disposal): it
        # reports back to the loop, which never waits for a disk; one thread keeps them in order
        self.storage_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="storage")
        self.dispatcher = Dispatcher(self.endpoint, self.resource_manager, conf, self.stop, self.storage_executor)
        self.events = JobEventPublisher.bind(self.endpoint, self.dispatcher, conf)
        self.handled: collections.Counter = collections.Counter()  # control messages per op
        components: tuple[Any, ...] = (self.dispatcher, self.resource_manager, self.events, self)
        for component in components:
            clash = set(component.handlers) & set(self.endpoint.handlers)
            if clash:
                raise RuntimeError(f"message types handled twice: {clash}")
            handlers: dict[type[m.Message], Callable] = component.handlers
            self.endpoint.handlers.update({t: self._counted(t.op, h) for t, h in handlers.items()})
        self.rest = RestServer(self.dispatcher, conf, rest_token(secret), rest_sockets)
        self.rest_address = f"http://{conf['rest.address']}:{self.rest.port}"
        self.stopped = threading.Event()  # stop() began
        self.terminated = threading.Event()  # stop() ended: the process may exit

    @property
    def handlers(self) -> dict:
        return {m.RequestControlStats: lambda msg, peer: m.ControlStats(dict(self.handled))}

    def _counted(self, op: str, handler):
        def handle(msg, peer):
            self.handled[op] += 1
            return handler(msg, peer)
        return handle

    def start(self) -> None:
        self.endpoint.start()
        self.rest.start()
        log.info("JobManager at %s, events at %s, REST at %s", self.rpc_address, self.events.address,
                 self.rest_address)

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.rest.stop()
        self.endpoint.stop()
        self.events.close()
        self.storage_executor.shutdown(wait=False, cancel_futures=True)
        self.resource_manager.stop_started_task_managers()
        self.terminated.set()


def write_json(path: Path, info: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(path)  # readers never see half a file


LEADER_FIRST_S = 5.0
STANDBY_FILES = "jobmanager-standby-*.json"


def sweep_standby_files(cluster_dir: Path) -> list[Path]:
    """Remove the standby files of JobManagers that are gone (a SIGKILLed standby cannot remove
    its own): each would name a REST address nobody serves. A file is kept while its pid is a
    live JobManager process (a reused pid is not). Returns the removed paths."""
    removed = []
    for path in sorted(cluster_dir.glob(STANDBY_FILES)):
        try:
            pid = json.loads(path.read_text())["pid"]
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and "cluster.jobmanager" in proc.cmdline():
                continue
        except (ValueError, KeyError, TypeError, OSError, psutil.Error):
            pass  # unreadable, or its process gone: stale either way
        path.unlink(missing_ok=True)
        removed.append(path)
    if removed:
        log.info("removed the files of standby JobManagers that are gone: %s", ", ".join(p.name for p in removed))
    return removed


def stand_by(conf: Configuration, ha: ZooKeeperHaServices, standby_file: Path,
             stop: StopRequest) -> Optional[list[socket.socket]]:
    """Wait for leadership, serving REST for the leader meanwhile (Flink: every JobManager's REST
    endpoint answers). Its address is in ``standby_file`` while it stands by. Returns the REST
    sockets for the leader's own RestServer (None: the standby found no free port and served none)."""
    retriever: Optional[LeaderRetriever] = LeaderRetriever(conf)
    assert retriever is not None
    # JobManagers started together: the winner binds its REST port only after it won, so a
    # standby binds once a leader has published (the leader's port is taken by then), or not at
    # all if it wins first; with no leader for LEADER_FIRST_S (ZooKeeper names none) it binds
    deadline = time.monotonic() + LEADER_FIRST_S
    while _leader_rest(retriever) is None and time.monotonic() < deadline:
        if ha.wait_for_leadership(0.1):
            retriever.close()
            return None
    try:
        sockets = bind_rest_sockets(conf)
    except OSError as exc:
        # a fixed rest.port the leader holds: the standby serves no REST, as before rest.bind-port
        log.warning("standby JobManager serves no REST: %s", exc)
        sockets = None
    forwarder: Optional[RestForwarder] = None
    if sockets is None:
        retriever.close()
        retriever = None
    else:
        forwarder = RestForwarder(conf, partial(_leader_rest, retriever), ha.root, sockets)
        forwarder.start()
        write_json(standby_file, {"rest": f"http://{conf['rest.address']}:{forwarder.port}", "pid": os.getpid()})

    log.info("standby JobManager: waiting for leadership in ZooKeeper under %s%s", ha.root,
             f"; REST answers for the leader at port {forwarder.port}" if forwarder is not None else "")
    while not ha.wait_for_leadership(POLL_S):
        if stop.reason is not None:
            log.info("standby JobManager stopping: %s", stop.reason)
            standby_file.unlink(missing_ok=True)
            logging.shutdown()
            os._exit(0)  # its REST forwarder's and ZooKeeper client's threads do not hold it
    if forwarder is None or retriever is None:
        return None
    handed_over = forwarder.hand_over_sockets()
    retriever.close()
    standby_file.unlink(missing_ok=True)
    return handed_over


def _leader_rest(retriever: LeaderRetriever) -> Optional[str]:
    """The leader's REST address as last published, without waiting (None: none published yet)."""
    try:
        return retriever.leader(timeout=0)["rest"]
    except TimeoutError:
        return None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.jobmanager")
    parser.add_argument("--cluster-dir", required=True, type=Path)
    parser.add_argument("--log-file", type=Path, help="rolling log file (default: stderr)")
    parser.add_argument("--application", type=Path, metavar="SCRIPT",
                        help="application mode: run this job script's main() here, then shut the cluster down")
    parser.add_argument("--application-arg", action="append", default=[], metavar="ARG",
                        help="an argument of the application's main() (repeat for several)")
    add_owner_arguments(parser)
    args = parser.parse_args(argv)
    follow_owner(args.owner_pid, args.parent_death_signal)
    if args.application is not None and not args.application.is_file():
        parser.error(f"--application {args.application}: no such job script")
    conf = Configuration.from_file(args.cluster_dir / "config.yaml")
    configure_process_logging(args.log_file, conf)
    stop = StopRequest(args.owner_pid)
    stop.install()
    ha = None
    rest_sockets = None
    if ha_enabled(conf):
        ha = ZooKeeperHaServices(conf, args.cluster_dir.resolve())
        ha.start()
        standby_file = args.cluster_dir / f"jobmanager-standby-{os.getpid()}.json"

        def leave(reason: str) -> None:
            standby_file.unlink(missing_ok=True)
            exit_on_revocation(reason)
        sweep_standby_files(args.cluster_dir)
        ha.contend(on_revoked=leave)
        if not ha.wait_for_leadership(0):
            rest_sockets = stand_by(conf, ha, standby_file, stop)
        log.info("leadership granted")
        sweep_standby_files(args.cluster_dir)  # a failover: the standbys that died meanwhile
    jm = JobManager(conf, load_secret(args.cluster_dir / "secret"), args.cluster_dir.resolve(), rest_sockets)
    jm.dispatcher.ha = ha
    jm.start()
    info = {"rpc": jm.rpc_address, "events": jm.events.address, "rest": jm.rest_address, "pid": os.getpid()}
    if ha is not None:
        ha.publish_leader(info)
        jm.endpoint.call_soon(jm.dispatcher.recover_jobs)
    write_json(args.cluster_dir / "jobmanager.json", info)
    application = Application(jm, args.application, args.application_arg) if args.application else None
    if application is not None:
        application.start()
    reason = stop.wait(jm.terminated)
    if reason is not None:
        log.info("JobManager stopping: %s", reason)
        exit_within(HARD_EXIT_AFTER_S, "the JobManager")
        jm.stop()
        jm.terminated.wait()
    log.info("JobManager stopped")
    if application is not None:
        code = application.final_exit_code()
        logging.shutdown()
        # os._exit: the application's threads (a main() that never returned, its clients) must
        # not hold the process, nor interpreter shutdown hang on them
        os._exit(code)
