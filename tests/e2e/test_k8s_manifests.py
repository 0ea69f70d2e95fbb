"""The Kubernetes manifests of cluster/k8s, without a Kubernetes.

Both kustomize bases are rendered with ``kubectl kustomize`` as they are in the checkout, and every
rendered object must pass the Kubernetes API schemas of the newest version ``kubernetes-validate``
knows (strict: an unknown field fails too). The session is then deployed as its kustomization tells a
user to: from an overlay that replaces the base's empty Secret with one made by ``streamlab
jobmanager create-secret``.

Then the containers' commands are run as real local processes, each with what its pod would
give it: the container's command and args, its env (a ``fieldRef: status.podIP`` is the pod's
address, here 127.0.0.1), ``$(VAR)`` expanded as the kubelet does, and each volume mount mapped
to a temp directory holding the ConfigMap's or Secret's data (with the Secret volume's mode) or
nothing (emptyDir). The only substitution in what the manifests say: the JobManager Service's DNS
name becomes 127.0.0.1, since there is no cluster DNS here. The ports are the manifests' fixed
ones (6123, 6124, 8081), so this test waits for them to be free. ``streamlab`` is run as
``python -m kernel_runtime.cli.main`` (the same entry point, from this checkout).
"""
from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import yaml

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.client.cluster_info import ClusterInfo, ClusterNotRunning
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "cluster" / "k8s"
# the machine's, or the one `make system-deps` puts in the venv where Debian has none
KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
STREAMLAB = [sys.executable, "-m", "kernel_runtime.cli.main"]
POD_IP = "127.0.0.1"  # what status.podIP is for a "pod" that is this machine
N = 20_000


def streamlab(*args: str) -> str:
    proc = subprocess.run([*STREAMLAB, *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, f"streamlab {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def kustomize(directory: Path) -> list[dict]:
    proc = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize {directory}: {proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """The bases as the checkout has them, and the session with a secret of its own (an overlay)."""
    out = {base: kustomize(K8S / base) for base in ("session", "application")}
    overlay = tmp_path_factory.mktemp("k8s") / "my-session"
    overlay.mkdir()
    streamlab("jobmanager", "create-secret", str(overlay / "cluster-secret"))
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(K8S / "session", overlay)],
        "secretGenerator": [{"name": "streamlab-secret", "behavior": "replace", "files": ["cluster-secret"]}]}))
    out["my-session"] = kustomize(overlay)
    return out


def one(objects: list[dict], kind: str, component: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (component is None or _component(o) == component)]
    assert len(found) == 1, f"expected one {kind} {component or ''}, found {len(found)}"
    return found[0]


def _component(obj: dict) -> str | None:
    template = obj.get("spec", {}).get("template", {})
    return template.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")


def test_manifests_render_and_pass_the_newest_kubernetes_schemas(rendered):
    import kubernetes_validate
    version = kubernetes_validate.latest_version()
    for base, objects in rendered.items():
        for obj in objects:
            # raises ValidationError naming the field; strict: unknown fields are errors too
            kubernetes_validate.validate(obj, version, strict=True)
    session = rendered["session"]
    assert sorted(o["kind"] for o in session) == ["ConfigMap", "Deployment", "Deployment", "Secret", "Service"]
    assert one(session, "Deployment", "taskmanager")["spec"]["replicas"] == 2
    config_map = one(session, "ConfigMap")
    jm_pod = one(session, "Deployment", "jobmanager")["spec"]["template"]["spec"]
    # the generators' hashed names are what the pods mount
    volumes = {v["name"]: v for v in jm_pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert volumes["secret"]["secret"]["secretName"] == one(session, "Secret")["metadata"]["name"]
    assert sorted(o["kind"] for o in rendered["application"]) == ["Job", "Service"]
    print(f"validated against Kubernetes {version}")


# ---------------------------------------------------------------------- a pod as local processes
class LocalPod:
    """A Deployment's or Job's container run as a local process, with its pod's view of things."""

    def __init__(self, workload: dict, objects: list[dict], directory: Path, dns: dict[str, str]):
        pod = workload["spec"]["template"]["spec"]
        (self.container,) = pod["containers"]
        self.directory = directory
        self.dns = dns
        self.mounts: dict[str, Path] = {}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for mount in self.container.get("volumeMounts", []):
            self.mounts[mount["mountPath"]] = self._volume(volumes[mount["name"]], objects)
        self.proc: subprocess.Popen | None = None

    def _volume(self, volume: dict, objects: list[dict]) -> Path:
        path = self.directory / volume["name"]
        path.mkdir(parents=True)
        if "configMap" in volume:
            (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]]
            for key, text in cm["data"].items():
                (path / key).write_text(self._resolve(text))
        elif "secret" in volume:
            (secret,) = [o for o in objects if o["kind"] == "Secret"
                         and o["metadata"]["name"] == volume["secret"]["secretName"]]
            for key, data in secret["data"].items():
                (path / key).write_bytes(base64.b64decode(data))
                (path / key).chmod(volume["secret"].get("defaultMode", 0o644))
        else:
            assert "emptyDir" in volume, f"volume kind not mapped here: {volume}"
        return path

    def _resolve(self, text: str) -> str:
        for name, address in self.dns.items():  # the one substitution: no cluster DNS here
            text = re.sub(rf"\b{re.escape(name)}\b", address, text)
        return text

    def env(self) -> dict[str, str]:
        env = {}
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            else:
                field = var["valueFrom"]["fieldRef"]["fieldPath"]
                assert field == "status.podIP", f"fieldRef {field} not mapped here"
                env[var["name"]] = POD_IP
        return env

    def argv(self) -> list[str]:
        env = self.env()
        args = []
        for arg in [*self.container["command"], *self.container.get("args", [])]:
            arg = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg)  # the kubelet's expansion
            for mount_path, local in self.mounts.items():
                if arg == mount_path or arg.startswith(mount_path + "/"):
                    arg = str(local) + arg[len(mount_path):]
            args.append(self._resolve(arg))
        assert args[0] == "streamlab", args
        return [*STREAMLAB, *args[1:]]

    def start(self) -> "LocalPod":
        out = open(self.directory / "container.log", "wb")
        self.proc = subprocess.Popen(self.argv(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONPATH=str(ROOT), **self.env()))
        return self

    def mounted(self, mount_path: str) -> Path:
        return self.mounts[mount_path]

    def named_port(self, name: str) -> int:
        (port,) = [p["containerPort"] for p in self.container["ports"] if p["name"] == name]
        return port

    def log_tail(self) -> str:
        return "\n".join((self.directory / "container.log").read_text(errors="replace").splitlines()[-30:])


def _wait_for_free_ports(ports: list[int], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("0.0.0.0", port))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"port {port}, which the manifests fix, stayed in use on this machine "
                                    f"(another cluster on the default ports?) for {timeout:g} s")
                    time.sleep(1)


def _terminate(pods: list[LocalPod]) -> None:
    """SIGTERM, as the kubelet stops a container; then every process of the pods must be gone."""
    procs = []
    for pod in pods:
        if pod.proc is not None and pod.proc.poll() is None:
            try:
                procs += [psutil.Process(pod.proc.pid), *psutil.Process(pod.proc.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
            pod.proc.send_signal(signal.SIGTERM)
    gone, alive = psutil.wait_procs(procs, timeout=30)
    for proc in alive:
        proc.kill()
    assert not alive, f"processes left 30 s after SIGTERM: {alive}"


def events(seq):
    return pd.DataFrame({"user": (seq * 7919) % 13, "amount": (seq % 11).astype("int64")})


@pytest.mark.timeout(420)
def test_the_session_manifests_commands_start_a_working_cluster(rendered, tmp_path):
    objects = rendered["my-session"]
    service = one(objects, "Service")
    dns = {service["metadata"]["name"]: "127.0.0.1"}
    jm_deployment = one(objects, "Deployment", "jobmanager")
    tm_deployment = one(objects, "Deployment", "taskmanager")
    _wait_for_free_ports([p["port"] for p in service["spec"]["ports"]])

    jobmanager = LocalPod(jm_deployment, objects, tmp_path / "jobmanager", dns).start()
    taskmanagers: list[LocalPod] = []
    pods = [jobmanager]
    try:
        cluster_dir = jobmanager.mounted("/var/lib/streamlab")

        def jobmanager_up():
            assert jobmanager.proc.poll() is None, f"JobManager exited:\n{jobmanager.log_tail()}"
            try:
                return ClusterInfo.load(cluster_dir)
            except ClusterNotRunning:
                return None
        info = wait_for(jobmanager_up, 60, "the JobManager's jobmanager.json")
        # advertised at the Service's name (here its stand-in), bound on every interface
        assert info.rpc_address == "tcp://127.0.0.1:6123" and info.events_address == "tcp://127.0.0.1:6124"
        assert info.rest_address == "http://127.0.0.1:8081"
        # what the probes check: the REST port accepts connections
        probes = [jobmanager.container[p]["tcpSocket"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
        for port in {jobmanager.named_port(p) for p in probes}:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

        for i in range(tm_deployment["spec"]["replicas"]):
            pod = LocalPod(tm_deployment, objects, tmp_path / f"taskmanager-{i}", dns).start()
            taskmanagers.append(pod)
            pods.append(pod)
        client = JobClient(info)
        try:
            def registered():
                for pod in taskmanagers:
                    assert pod.proc.poll() is None, f"TaskManager exited:\n{pod.log_tail()}"
                return len(client.cluster_overview().taskmanagers) == len(taskmanagers)
            wait_for(registered, 120, "both TaskManagers to register")
            data_addresses = sorted(tm["path"] for tm in client.cluster_overview().taskmanagers)
            # each advertises its pod IP (from -D taskmanager.host=$(POD_IP)), not its 0.0.0.0 bind
            assert all(a.startswith(f"tcp://{POD_IP}:") for a in data_addresses), data_addresses

            env = StreamEnvironment(parallelism=2, cluster=cluster_dir)
            (env.from_generator(events, count=N, batch_size=1_000)
             .key_by("user").aggregate(total=("amount", "sum"), parallelism=2).collect("sums"))
            result = env.execute("k8s keyed sum")
            got = result.to_pandas().sort_values("user").reset_index(drop=True)
            df = events(np.arange(N, dtype=np.int64))
            expected = df.groupby("user", as_index=False).agg(total=("amount", "sum"))
            pd.testing.assert_frame_equal(got[["user", "total"]], expected, check_dtype=False)
        finally:
            client.close()
    except BaseException:
        for pod in pods:
            print(f"--- {pod.directory.name}\n{pod.log_tail()}")
        raise
    finally:
        _terminate(pods)


@pytest.mark.timeout(420)
def test_the_application_manifest_runs_a_job_package_to_its_end(rendered, tmp_path):
    """The Job's command on a job package at the image's path: `streamlab run-application` (the
    application-mode part of issue 11) runs it and exits 0 once the job FINISHED; the package's
    main() checks its own result against pandas and raises otherwise (a non-zero exit)."""
    objects = rendered["application"]
    job = one(objects, "Job")
    service = one(objects, "Service")
    pod = LocalPod(job, objects, tmp_path / "application", {service["metadata"]["name"]: "127.0.0.1"})
    package = tmp_path / "package"
    shutil.copytree(Path(__file__).with_name("k8s_job_package"), package)
    pod.mounts["/opt/streamlab/job"] = package  # what the application image holds at that path
    _wait_for_free_ports([8081, 6123])
    pod.start()
    try:
        assert pod.proc.wait(300) == 0, pod.log_tail()
        assert "FINISHED" in (pod.directory / "container.log").read_text()
    finally:
        _terminate([pod])
    cluster_dir = pod.mounted("/var/lib/streamlab")
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if str(cluster_dir) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, f"processes of the application cluster left: {leftovers}"
