"""The lab extension's server API (labext/streamlab_labext) against real clusters, through a real
Jupyter server process with a token, as the Streams panel calls it.

One Jupyter server per module, configured with ``--StreamlabLab.cluster_dirs=`` the session
cluster and a cluster whose JobManager is down; a third cluster runs outside the allowed ones. A
real kernel started by the server runs ``%load_ext kernel_runtime`` and a %%stream cell, and its
embedded cluster shows up as the kernel's.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest
from jupyter_client import BlockingKernelClient

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.deploy.ha import free_port
from kernel_runtime.notebook.lab_registry import JOB_MIME_TYPE, cluster_id
from kernel_runtime.notebook.widgets.metrics import load_color
from kernel_runtime.deploy.local import PROJECT_ROOT, stop_cluster

from ..conftest import rest, running_keyed_count, start_cluster, wait_for

TOKEN = uuid.uuid4().hex
LAZY_SPARK = {"taskmanager.spark.startup": "lazy"}  # these clusters run no Spark: no JVM per TaskManager
KERNEL_CONFIG = """c.StreamMagics.taskmanagers = 1
c.StreamMagics.slots = 2
c.StreamMagics.cluster_config = {"taskmanager.spark.startup": "lazy"}
"""
CELL = """%%stream --name lab-kernel-job
env.from_generator(rate=200, batch_size=20).key_by("seq").count().collect()
"""


class Server:
    """A `jupyter server` process with streamlab's server extension."""

    def __init__(self, root: Path, cluster_dirs: list[Path]):
        self.root, self.port = root, free_port()
        self.runtime_dir = root.parent / "runtime"
        ipython_dir = root.parent / "ipython"
        (ipython_dir / "profile_default").mkdir(parents=True)
        (ipython_dir / "profile_default" / "ipython_kernel_config.py").write_text(KERNEL_CONFIG)
        config = root.parent / "jupyter_server_config.json"
        config.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {"streamlab_labext": True}}}))
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(self.runtime_dir), IPYTHONDIR=str(ipython_dir),
                   PYTHONPATH=os.pathsep.join([str(PROJECT_ROOT), str(PROJECT_ROOT / "labext"),
                                               os.environ.get("PYTHONPATH", "")]))
        self.log = open(root.parent / "jupyter-server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--config={config}", f"--ServerApp.token={TOKEN}",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             "--allow-root", "--no-browser", f"--ServerApp.root_dir={root}",
             *(f"--StreamlabLab.cluster_dirs={d}" for d in cluster_dirs)],  # a list: the option repeated
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=root)
        wait_for(self.answers, 60, "the Jupyter server up")

    def answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"jupyter server exited: {self.log_text()}")
        try:
            return self.call("api/status")[0] == 200
        except OSError:
            return False

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def call(self, path: str, method: str = "GET", body: dict | None = None, timeout: float = 150):
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/{path}", data=data, method=method,
                                         headers={"Authorization": f"token {TOKEN}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def api(self, path: str, method: str = "GET", body: dict | None = None):
        return self.call(f"streamlab/api/{path}", method, body)

    def clusters(self) -> dict[str, dict]:
        status, body = self.api("clusters")
        assert status == 200, body
        return {c["id"]: c for c in body["clusters"]}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _start(directory: Path, into: dict, name: str) -> None:
    into[name] = start_cluster(directory, taskmanagers=1, slots=1, **LAZY_SPARK)


@pytest.fixture(scope="module")
def others(tmp_path_factory):
    """A cluster outside the allowed ones (running) and one whose JobManager is down (killed)."""
    started: dict = {}
    threads = [threading.Thread(target=_start, args=(tmp_path_factory.mktemp(name), started, name))
               for name in ("outside", "down")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(started) == {"outside", "down"}, "a cluster did not start"
    started["down"].jobmanager.kill()
    started["down"].jobmanager.wait(10)
    yield started
    stopping = [threading.Thread(target=local.stop) for local in started.values()]
    for t in stopping:
        t.start()
    for t in stopping:
        t.join()


@pytest.fixture(scope="module")
def server(tmp_path_factory, cluster, others, running_job):
    root = tmp_path_factory.mktemp("lab") / "root"
    root.mkdir()
    started = Server(root, [cluster.cluster_dir, others["down"].cluster_dir])
    yield started
    started.stop()


@pytest.fixture(scope="module")
def running_job(cluster):
    with running_keyed_count(cluster, "lab panel job", rate=1_000, batch_size=50) as handle:
        yield handle


def test_clusters_lists_the_cluster_its_taskmanagers_slots_and_a_running_job(server, cluster, running_job):
    cid = cluster_id(cluster.cluster_dir)

    def job_in(entry: dict) -> dict:
        return next(j for j in entry["jobs"] if j["id"] == running_job.job_id)
    entry = server.clusters()[cid]
    assert entry["error"] is None and entry["source"] == "setting" and entry["kernel_id"] is None
    assert entry["name"] == cluster.cluster_dir.name
    assert len(entry["taskmanagers"]) == 2 and entry["slots_total"] == 4
    # parallelism 2 in one slot-sharing group: 2 slots, each naming the job
    held = [s for tm in entry["taskmanagers"] for s in tm["slots"] if s["job_id"] == running_job.job_id]
    assert len(held) == 2 and {s["job_name"] for s in held} == {"lab panel job"}
    assert entry["slots_used"] == sum(tm["slots_used"] for tm in entry["taskmanagers"]) == 2
    assert all(len(tm["slots"]) == tm["slots_total"] == 2 for tm in entry["taskmanagers"])
    first = job_in(entry)
    assert first["name"] == "lab panel job" and first["state"] == "RUNNING"
    assert first["backpressure"] in ("ok", "low", "high") and first["start_time"] > 0
    # the records grow between two refreshes (the list is cached for 1 s)
    second = wait_for(lambda: (j := job_in(server.clusters()[cid]))["records_in"] > first["records_in"] and j,
                      10, "records in growing")
    assert second["records_out"] > 0 and second["duration_ms"] > first["duration_ms"]
    # no address, token or secret of a cluster reaches the page
    text = json.dumps(server.api("clusters")[1])
    assert cluster.info.rest_token not in text and cluster.info.rest_address not in text
    assert str(cluster.cluster_dir) not in text


def test_the_list_is_cached_for_a_second(server, cluster, running_job):
    # requests in a row: some answered from the cache, and a new list never sooner than a second
    # after the last (by the server's own stamps; a slow request only spreads them further)
    stamps = [server.api("clusters")[1]["refreshed"] for _ in range(10)]
    distinct = sorted(set(stamps))
    assert len(distinct) < len(stamps), f"no request was answered from the cache: {stamps}"
    assert all(later - earlier >= 1000 for earlier, later in zip(distinct, distinct[1:])), distinct
    wait_for(lambda: server.api("clusters")[1]["refreshed"] > stamps[-1], 10, "a refresh after the second")


def test_job_detail(server, cluster, running_job):
    cid = cluster_id(cluster.cluster_dir)
    status, detail = server.api(f"clusters/{cid}/jobs/{running_job.job_id}")
    assert status == 200, detail
    assert detail["job"]["id"] == running_job.job_id and detail["job"]["state"] == "RUNNING"
    vertices = {v["id"]: v for v in detail["vertices"]}
    assert len(vertices) == 2 and all(v["parallelism"] == 2 for v in vertices.values())
    assert all(v["backpressure"] in ("ok", "low", "high") for v in vertices.values())
    # coloured as the dashboard's job graph colours a running vertex, from its busy and back-pressured shares
    assert all(v["status"] == "RUNNING" and 0 <= v["busy"] <= 1 and 0 <= v["backpressured"] <= 1
               and v["color"] == load_color(v["busy"], v["backpressured"]) for v in vertices.values()), vertices
    # what the view offers to pick for keyed state; this job asked for no checkpoints (the view says so)
    assert detail["keyed_operators"] == ["count"] and detail["checkpoint_interval_ms"] == 0, detail
    (edge,) = detail["edges"]
    assert edge["source"] in vertices and edge["target"] in vertices and edge["ship_strategy"] == "HASH"
    assert detail["exceptions"] == [] and isinstance(detail["checkpoints"], list)
    assert server.api(f"clusters/{cid}/jobs/{'0' * 32}")[0] == 404


def test_keyed_state_of_a_running_job(server, cluster, running_job):
    path = f"clusters/{cluster_id(cluster.cluster_dir)}/jobs/{running_job.job_id}/state"
    status, state = server.api(f"{path}?operator=count&fresh=true&limit=5")
    assert status == 200, state
    # every generated seq is its own key, counted once up to the checkpoint
    assert state["operator"] == "count" and state["checkpoint_id"] >= 1 and state["key_columns"] == ["seq"]
    assert state["columns"] == ["seq", "count"] and len(state["rows"]) == 5 < state["rows_total"]
    assert all(count == 1 for _, count in state["rows"])
    assert running_job.status == "RUNNING"
    assert server.api(path)[0] == 400
    status, body = server.api(f"{path}?operator=no-such-operator")
    assert status == 409 and "count" in body["message"], body


def test_savepoint_returns_a_location_that_exists(server, cluster, running_job):
    cid = cluster_id(cluster.cluster_dir)
    target = cluster.cluster_dir / "savepoints" / "lab"
    status, body = server.api(f"clusters/{cid}/jobs/{running_job.job_id}/savepoint", "POST",
                              {"target_directory": str(target)})
    assert status == 200, body
    location = body["location"].removeprefix("file:")
    assert location.startswith(str(target)) and (Path(location) / "_metadata").is_file()
    assert running_job.status == "RUNNING"
    detail = server.api(f"clusters/{cid}/jobs/{running_job.job_id}")[1]
    assert any(c["is_savepoint"] and c["status"] == "COMPLETED" for c in detail["checkpoints"])
    # the JobManager's refusal reaches the panel as its message
    status, body = server.api(f"clusters/{cid}/jobs/{running_job.job_id}/savepoint", "POST",
                              {"target_directory": "/definitely/outside"})
    assert status == 400 and "state.savepoints.allowed-dirs" in body["message"]
    assert server.api(f"clusters/{cid}/jobs/{running_job.job_id}/savepoint", "POST", {"target": "x"})[0] == 400


def test_cancel_ends_the_job_and_stop_takes_a_savepoint(server, cluster, running_job):
    cid = cluster_id(cluster.cluster_dir)
    client = JobClient(cluster.info)
    try:
        handles = []
        for name in ("lab cancel", "lab stop"):
            env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
            env.from_generator(rate=200, batch_size=20).print()
            handles.append(env.execute_async(name, client=client))
        for h in handles:
            wait_for(lambda: all(v["status"] == "RUNNING" for v in rest(cluster, f"/jobs/{h.job_id}")[1]["vertices"]),
                     30, "every task running")
        to_cancel, to_stop = handles
        assert server.api(f"clusters/{cid}/jobs/{to_cancel.job_id}/cancel", "POST") == (200, {"ok": True})
        wait_for(lambda: to_cancel.status == "CANCELED", 20, "job cancelled")
        status, body = server.api(f"clusters/{cid}/jobs/{to_stop.job_id}/stop", "POST", {})
        assert status == 200, body
        assert (Path(body["location"].removeprefix("file:")) / "_metadata").is_file()
        wait_for(lambda: to_stop.status == "FINISHED", 20, "job stopped")
        def states() -> dict[str, str]:
            # a refresh that met a busy JobManager is an error entry without jobs: the next one lists them
            return {j["id"]: j["state"] for j in server.clusters()[cid]["jobs"]}
        wait_for(lambda: (s := states()).get(to_cancel.job_id) == "CANCELED" and s.get(to_stop.job_id) == "FINISHED",
                 15, "the ended jobs in the list, CANCELED and FINISHED")
        assert running_job.status == "RUNNING"
    finally:
        client.close()


def test_a_cluster_outside_the_allowed_ones_is_refused(server, others):
    outside = others["outside"]
    oid = cluster_id(outside.cluster_dir)
    # a registry file for a kernel this server does not run does not make a directory allowed
    registry = server.runtime_dir / "streamlab"
    registry.mkdir(parents=True, exist_ok=True)
    forged = uuid.uuid4().hex
    (registry / f"kernel-{forged}.json").write_text(json.dumps(
        {"kernel_id": forged, "cluster_dir": str(outside.cluster_dir), "pid": os.getpid()}))
    client = JobClient(outside.info)
    try:
        env = StreamEnvironment(parallelism=1, cluster=outside.cluster_dir)
        env.from_generator(rate=100, batch_size=10).print()
        handle = env.execute_async("outside", client=client)
        wait_for(lambda: handle.status == "RUNNING", 20, "job running")
        assert oid not in server.clusters()
        for path, method in ((f"clusters/{oid}/jobs/{handle.job_id}", "GET"),
                             (f"clusters/{oid}/jobs/{handle.job_id}/cancel", "POST"),
                             (f"clusters/{oid}/jobs/{handle.job_id}/savepoint", "POST")):
            status, body = server.api(path, method)
            assert status == 403, (path, body)
            assert "StreamlabLab.cluster_dirs" in body["message"]
        assert handle.status == "RUNNING"
        handle.cancel()
        wait_for(lambda: handle.status == "CANCELED", 20, "job cancelled")
    finally:
        client.close()


def test_a_jobmanager_that_is_down_gives_an_error_entry(server, cluster, others):
    down = others["down"]
    status, body = server.api("clusters")
    assert status == 200
    entries = {c["id"]: c for c in body["clusters"]}
    entry = entries[cluster_id(down.cluster_dir)]
    assert entry["error"].startswith("JobManager not reachable") and "not running" in entry["error"]
    assert entry["jobs"] == [] and entry["taskmanagers"] == [] and entry["slots_total"] == 0
    assert entries[cluster_id(cluster.cluster_dir)]["error"] is None  # the others are answered


def answers_kernel_info(client: BlockingKernelClient) -> bool:
    client.kernel_info()
    try:
        client.get_shell_msg(timeout=2)
        return True
    except queue.Empty:
        return False


def test_a_kernels_embedded_cluster_shows_up_as_the_kernels(server):
    status, kernel = server.call("api/kernels", "POST", {"name": "python3"})
    assert status == 201, kernel
    kernel_id = kernel["id"]
    client = BlockingKernelClient(connection_file=str(server.runtime_dir / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    cluster_dir = None
    try:
        # (not wait_for_ready: a client without the kernel's manager takes a heartbeat that is not
        # beating yet for a dead kernel)
        wait_for(lambda: answers_kernel_info(client), 60, "the kernel up")
        outputs: list[dict] = []
        for code in ("%load_ext kernel_runtime", CELL):
            reply = client.execute_interactive(code, timeout=90, output_hook=lambda msg: outputs.append(msg))
            assert reply["content"]["status"] == "ok", reply["content"]
        lab = next(m["content"]["data"][JOB_MIME_TYPE] for m in outputs
                   if m["msg_type"] == "execute_result" and JOB_MIME_TYPE in m["content"]["data"])
        assert lab["name"] == "lab-kernel-job" and len(lab["job_id"]) == 32

        def kernel_entry():
            return next((c for c in server.clusters().values() if c["kernel_id"] == kernel_id), None)
        entry = wait_for(lambda: (e := kernel_entry()) and any(j["records_in"] > 0 for j in e["jobs"]) and e,
                         30, "the kernel's cluster with its job counting")
        assert entry["source"] == "kernel" and entry["id"] == lab["cluster_id"] and entry["error"] is None
        assert [j["id"] for j in entry["jobs"]] == [lab["job_id"]]
        assert entry["slots_total"] == 2 and len(entry["taskmanagers"]) == 1
        cluster_dir = json.loads((server.runtime_dir / "streamlab" / f"kernel-{kernel_id}.json").read_text())["cluster_dir"]
        # the status bar's route
        status, body = server.api(f"kernels/{kernel_id}/cluster")
        assert status == 200 and body["cluster"]["id"] == entry["id"]
        assert server.api(f"kernels/{uuid.uuid4()}/cluster") == (200, {"cluster": None})

        # %stream_cluster stop removes the registry file: the cluster leaves the list
        reply = client.execute_interactive("%stream_cluster stop", timeout=60, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok"
        assert not (server.runtime_dir / "streamlab" / f"kernel-{kernel_id}.json").exists()
        wait_for(lambda: kernel_entry() is None, 5, "the stopped cluster gone from the list")
    finally:
        client.stop_channels()
        server.call(f"api/kernels/{kernel_id}", "DELETE")
        if cluster_dir is not None:
            stop_cluster(Path(cluster_dir))


def test_export_writes_a_package(server):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext kernel_runtime"),
                nbformat.v4.new_code_cell("%%stream --name counts\n"
                                          "env.from_generator(count=100).key_by('seq').count().collect()")]
    (server.root / "work").mkdir()
    nbformat.write(nb, str(server.root / "work" / "lab.ipynb"))
    status, body = server.api("export", "POST", {"path": "work/lab.ipynb", "cell": "counts", "output": "work/pkg"})
    assert status == 200, body
    assert body == {"packages": ["work/pkg"], "files": [sorted(p.name for p in (server.root / "work" / "pkg").iterdir())],
                    "notebook": "work/lab.ipynb"}
    assert {"job.py", "config.yaml", "requirements.txt"} <= set(body["files"][0])
    assert "from_generator(count=100)" in (server.root / "work" / "pkg" / "job.py").read_text()
    # without an output: a job's package is named after the job, beside its notebook
    status, body = server.api("export", "POST", {"path": "work/lab.ipynb", "cell": "counts", "output": None})
    assert status == 200 and body["packages"] == ["work/counts"], body
    status, body = server.api("export", "POST", {"path": "work/lab.ipynb", "cell": None, "output": None})
    assert status == 200 and body["packages"] == ["work/lab/counts"], body
    assert (server.root / "work" / "lab" / "counts" / "job.py").is_file()
    # errors: outside the root, no such cell, no such notebook
    assert server.api("export", "POST", {"path": "work/lab.ipynb", "cell": None, "output": "../../x"})[0] == 403
    status, body = server.api("export", "POST", {"path": "work/lab.ipynb", "cell": "nope", "output": None})
    assert status == 400 and "'counts'" in body["message"]
    assert server.api("export", "POST", {"path": "work/none.ipynb", "cell": None, "output": None})[0] == 404


def test_routes_need_the_token(server):
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/streamlab/api/clusters")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
