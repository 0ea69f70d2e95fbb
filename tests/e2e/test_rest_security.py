"""The REST API is a local HTTP API that a web page (or another user's request) cannot drive.

Token, Host check, JSON-only mutations, a body cap enforced before the body is read, savepoint
targets confined to the configured folders, bad input answered 4xx in Flink's error shape.
"""
from __future__ import annotations

import json
import os
import select
import socket
import stat
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import psutil
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from tests.conftest import assert_at_rest, rest, start_cluster, wait_for

MB = 1024 * 1024


def call(cluster, path: str, method: str = "GET", data: bytes | None = None, headers: dict | None = None,
         token: bool = True):
    """(status, JSON body) of any request, error answers included."""
    all_headers = (dict(cluster.info.rest_headers) if token else {}) | (headers or {})
    req = urllib.request.Request(cluster.info.rest_address + path, data=data, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def flink_error(body) -> str:
    """The text of Flink's error shape {"errors": ["..."]}; fails on any other shape."""
    assert isinstance(body, dict) and list(body) == ["errors"], body
    assert body["errors"] and all(isinstance(e, str) for e in body["errors"]), body
    return " ".join(body["errors"])


def post_json(cluster, path: str, body, **kwargs):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return call(cluster, path, "POST", data, {"Content-Type": "application/json"}, **kwargs)


@pytest.fixture(scope="class")
def running_job(cluster):
    client = JobClient(cluster.info)
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir)
    env.from_generator(rate=100, batch_size=20).print()
    handle = env.execute_async("rest security", client=client)
    wait_for(lambda: all_tasks_running(cluster, handle.job_id), 30, "every task running")
    yield handle
    handle.cancel()
    wait_for(lambda: handle.status == "CANCELED", 30, "job cancelled")
    client.close()
    assert_at_rest(cluster)


def all_tasks_running(cluster, job_id: str) -> bool:
    """A savepoint needs every task RUNNING, which follows the job's own RUNNING."""
    vertices = rest(cluster, f"/jobs/{job_id}")[1]["vertices"]
    return all(v["status"] == "RUNNING" for v in vertices)


def savepoints_of(cluster, job_id: str) -> int:
    return rest(cluster, f"/jobs/{job_id}/checkpoints")[1]["counts"]["total"]


class TestWhileAJobRuns:
    """One job runs through these tests; it is cancelled (and the cluster checked) after them."""

    def test_a_request_without_the_token_is_refused_and_with_it_served(self, cluster, running_job):
        for token_headers in ({}, {"Authorization": "Bearer " + "0" * 64}, {"Authorization": cluster.info.rest_token}):
            status, body = call(cluster, "/overview", headers=token_headers, token=False)
            assert status == 401 and "token" in flink_error(body)
        status, body = call(cluster, f"/jobs/{running_job.job_id}?mode=cancel", "PATCH", token=False)
        assert status == 401 and running_job.status == "RUNNING"

        status, body = call(cluster, "/overview")
        assert status == 200 and body["jobs-running"] == 1
        assert call(cluster, f"/v1/jobs/{running_job.job_id}/status")[1] == {"status": "RUNNING"}

    def test_a_text_plain_post_and_a_foreign_host_are_refused(self, cluster, running_job):
        before = savepoints_of(cluster, running_job.job_id)
        # what an HTML form on any web page can send without a CORS preflight
        status, body = call(cluster, f"/jobs/{running_job.job_id}/savepoints", "POST", b'{"cancel-job": true}',
                            {"Content-Type": "text/plain"})
        assert status == 415 and "application/json" in flink_error(body)
        status, body = call(cluster, f"/jobs/{running_job.job_id}/stop", "POST", b"{}",
                            {"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 415
        # a DNS-rebinding page reaches 127.0.0.1 under its own name
        for host in ("evil.example:8081", "evil.example", "127.0.0.1.evil.example"):
            status, body = call(cluster, "/overview", headers={"Host": host})
            assert status == 403 and host in flink_error(body)
            status, _ = call(cluster, f"/jobs/{running_job.job_id}/stop", "POST", b"{}",
                             {"Host": host, "Content-Type": "application/json"})
            assert status == 403
        port = urlsplit(cluster.info.rest_address).port
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            assert call(cluster, "/overview", headers={"Host": host})[0] == 200
        assert running_job.status == "RUNNING" and savepoints_of(cluster, running_job.job_id) == before

    def test_a_savepoint_outside_the_allowed_folders_is_refused_and_nothing_is_created(self, cluster, running_job, tmp_path):
        savepoints_dir = cluster.cluster_dir / "savepoints"
        savepoints_dir.mkdir(exist_ok=True)
        (savepoints_dir / "link-out").symlink_to(tmp_path, target_is_directory=True)
        before = savepoints_of(cluster, running_job.job_id)
        for target in (tmp_path / "outside" / "deep", f"file://{tmp_path}/outside", f"{savepoints_dir}/../outside",
                       savepoints_dir / "link-out" / "outside", "relative/dir"):
            status, body = post_json(cluster, f"/jobs/{running_job.job_id}/savepoints", {"target-directory": str(target)})
            assert status == 400, (target, body)
            assert str(target) in flink_error(body)
            if os.path.isabs(str(target).removeprefix("file://")):
                assert str(savepoints_dir.resolve()) in flink_error(body)
        status, body = post_json(cluster, f"/jobs/{running_job.job_id}/stop", {"targetDirectory": str(tmp_path / "x")})
        assert status == 400 and "state.savepoints.allowed-dirs" in flink_error(body)
        assert not (tmp_path / "outside").exists() and not (tmp_path / "x").exists()
        assert not (savepoints_dir.parent / "outside").exists()
        assert running_job.status == "RUNNING" and savepoints_of(cluster, running_job.job_id) == before

    def test_a_savepoint_inside_is_written_for_the_clusters_user_only(self, cluster, running_job):
        target = cluster.cluster_dir / "savepoints" / "private" / running_job.job_id[:8]
        status, body = post_json(cluster, f"/jobs/{running_job.job_id}/savepoints", {"target-directory": str(target)})
        assert status == 202, body
        trigger = body["request-id"]
        done = wait_for(lambda: (b := rest(cluster, f"/jobs/{running_job.job_id}/savepoints/{trigger}")[1])
                        ["status"]["id"] == "COMPLETED" and b, 30, "savepoint completed")
        location = done["operation"]["location"].removeprefix("file:")
        assert location.startswith(str(target)) and os.path.exists(os.path.join(location, "_metadata"))
        for path in [target.parent, target, location]:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
        files = [os.path.join(location, f) for f in os.listdir(location)]
        assert files and all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files), \
            {f: oct(os.stat(f).st_mode) for f in files}

    def test_bad_field_types_and_bodies_are_400_in_flinks_shape(self, cluster, running_job):
        jid = running_job.job_id
        cases = [
            (f"/jobs/{jid}/savepoints", {"target-directory": 5}, "'target-directory' must be a string"),
            (f"/jobs/{jid}/savepoints", {"cancel-job": "yes"}, "'cancel-job' must be a boolean"),
            (f"/jobs/{jid}/savepoints", {"target_directory": "/tmp"}, "unknown field(s) target_directory"),
            (f"/jobs/{jid}/savepoints", {"triggerId": "not-hex"}, "triggerId must be 32 hexadecimal"),
            (f"/jobs/{jid}/stop", {"targetDirectory": ["a"]}, "'targetDirectory' must be a string"),
            (f"/jobs/{jid}/stop", [1, 2], "must be a JSON object"),
            (f"/jobs/{jid}/stop", b"{not json", "not valid JSON"),
        ]
        for path, body, message in cases:
            status, answer = post_json(cluster, path, body)
            assert status == 400 and message in flink_error(answer), (body, answer)
        status, answer = call(cluster, f"/jobs/{jid}?mode=sideways", "PATCH")
        assert status == 400 and "sideways" in flink_error(answer)
        status, answer = call(cluster, f"/jobs/{jid}/checkpoints/details/latest")
        assert status == 400 and "checkpoint id" in flink_error(answer)
        assert running_job.status == "RUNNING"

    def test_unknown_jobs_vertices_checkpoints_and_triggers_are_404_naming_them(self, cluster, running_job):
        jid, nobody = running_job.job_id, "0123456789abcdef" * 2
        vertex = rest(cluster, f"/jobs/{jid}")[1]["vertices"][0]["id"]
        for path, names in [
            (f"/jobs/{nobody}", ["Job", nobody]),
            (f"/jobs/{nobody}/checkpoints", ["Job", nobody]),
            (f"/jobs/{jid}/vertices/{nobody}", ["vertex", nobody]),
            (f"/jobs/{jid}/vertices/{nobody}/backpressure", ["vertex", nobody]),
            (f"/jobs/{nobody}/vertices/{vertex}", ["Job", nobody]),
            (f"/jobs/{jid}/checkpoints/details/987654", ["checkpoint", "987654"]),
            (f"/jobs/{jid}/savepoints/{nobody}", ["savepoint", nobody]),
            ("/jobs/overview/nothing/here", ["Not found"]),
        ]:
            status, body = call(cluster, path)
            assert status == 404 and all(n in flink_error(body) for n in names), (path, body)
        status, body = call(cluster, f"/jobs/{nobody}?mode=cancel", "PATCH")
        assert status == 404 and nobody in flink_error(body)
        status, body = post_json(cluster, f"/jobs/{nobody}/savepoints", {})
        assert status == 404 and nobody in flink_error(body)


def test_the_token_is_derived_from_the_cluster_secret(cluster):
    import hashlib
    import hmac
    expected = hmac.new(cluster.info.secret, b"streamlab-rest-token", hashlib.sha256).hexdigest()
    assert cluster.info.rest_token == expected and cluster.info.secret.hex() not in expected


def _read_response(sock: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"connection closed before a full answer: {data!r}"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = int(next(v for k, _, v in (line.partition(": ") for line in lines[1:]) if k.lower() == "content-length"))
    while len(body) < length:
        piece = sock.recv(65536)
        assert piece, "connection closed inside the answer"
        body += piece
    return int(lines[0].split()[1]), json.loads(body[:length])


def _request_head(cluster, path: str, framing: str) -> bytes:
    netloc = urlsplit(cluster.info.rest_address).netloc
    return (f"POST {path} HTTP/1.1\r\nHost: {netloc}\r\nAuthorization: Bearer {cluster.info.rest_token}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n\r\n").encode()


def test_an_oversized_body_gets_413_before_it_is_read_and_jobmanager_memory_stays_flat(cluster):
    jobmanager = psutil.Process(cluster.jobmanager.pid)
    rss_before = jobmanager.memory_info().rss
    path = f"/jobs/{'0' * 32}/savepoints"  # the cap applies before the route looks at the job
    address = urlsplit(cluster.info.rest_address)

    # declared: 200 MB announced; the answer comes before a byte of the body is sent
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(_request_head(cluster, path, f"Content-Length: {200 * MB}"))
        status, body = _read_response(sock)
    assert status == 413 and "rest.server.max-content-length" in flink_error(body)

    # streamed: a chunked body of up to 200 MB in 1 MB chunks, refused once it passes the cap
    chunk = b"%x\r\n" % MB + b" " * MB + b"\r\n"
    sent = 0
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(_request_head(cluster, path, "Transfer-Encoding: chunked"))
        while sent < 200 * MB and not select.select([sock], [], [], 0)[0]:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += MB
        status, body = _read_response(sock)
    assert status == 413 and "rest.server.max-content-length" in flink_error(body)
    print(f"chunked body refused after {sent / MB:.0f} MB sent")
    assert sent < 50 * MB  # refused soon after the cap, not after the whole body

    growth = jobmanager.memory_info().rss - rss_before
    print(f"JobManager RSS {rss_before / MB:.0f} MB before, grew by {growth / MB:.1f} MB")
    assert growth < 10 * MB, f"JobManager RSS grew by {growth / MB:.0f} MB"
    assert rest(cluster, "/overview")[0] == 200


def test_rest_auth_mutating_opens_reads_only_and_the_allow_lists_widen_what_is_served(tmp_path):
    extra = tmp_path / "extra-savepoints"
    local = start_cluster(tmp_path / "cluster", taskmanagers=1, slots=1, **{
        "rest.auth": "mutating", "rest.allowed-hosts": ["streamlab.test"],
        "state.savepoints.allowed-dirs": [str(extra)], "rest.server.max-content-length": 1000,
        "taskmanager.spark.startup": "lazy"})
    client = JobClient(local.info)
    try:
        status, body = call(local, "/overview", token=False)
        assert status == 200 and body["taskmanagers"] == 1
        assert call(local, "/overview", headers={"Host": "streamlab.test:80"}, token=False)[0] == 200
        assert call(local, "/overview", headers={"Host": "evil.example"}, token=False)[0] == 403

        env = StreamEnvironment(parallelism=1, cluster=local.cluster_dir)
        env.from_generator(rate=100, batch_size=20).print()
        handle = env.execute_async("rest auth mutating", client=client)
        wait_for(lambda: all_tasks_running(local, handle.job_id), 30, "every task running")
        assert call(local, f"/jobs/{handle.job_id}?mode=cancel", "PATCH", token=False)[0] == 401
        status, body = call(local, f"/jobs/{handle.job_id}/savepoints", "POST", b"{}",
                            {"Content-Type": "application/json"}, token=False)
        assert status == 401 and handle.status == "RUNNING"
        status, body = post_json(local, f"/jobs/{handle.job_id}/savepoints", {"target-directory": "x" * 1000})
        assert status == 413 and "1000 bytes" in flink_error(body)

        status, body = post_json(local, f"/jobs/{handle.job_id}/savepoints", {"target-directory": str(extra / "a")})
        assert status == 202, body
        trigger = body["request-id"]
        done = wait_for(lambda: (b := call(local, f"/jobs/{handle.job_id}/savepoints/{trigger}")[1])
                        ["status"]["id"] == "COMPLETED" and b, 30, "savepoint completed")
        assert done["operation"]["location"].removeprefix("file:").startswith(str(extra / "a"))
        assert call(local, f"/jobs/{handle.job_id}?mode=cancel", "PATCH")[0] == 202
        wait_for(lambda: handle.status == "CANCELED", 30, "job cancelled")
    finally:
        client.close()
        local.stop()


@pytest.mark.parametrize("key,value,expected", [
    ("rest.auth", "off", "all, mutating"),
    ("rest.server.max-content-length", 0, r"\[1,"),
    ("rest.allowed-hosts", 5, "a list of strings"),
    ("state.savepoints.allowed-dirs", {"a": 1}, "a list of strings"),
])
def test_rest_keys_are_validated(key, value, expected):
    from cluster.conf import ConfigError, Configuration
    with pytest.raises(ConfigError, match=rf"invalid value .* for '{key}'.*{expected}"):
        Configuration({key: value})
