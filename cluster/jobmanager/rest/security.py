"""What keeps the REST API a local HTTP API that a web page in the user's browser cannot drive,
as jupyter_server's guards (``check_host``, token, body limits) and Flink's are:

* the Host header must name this server (localhost, a loopback address, ``rest.address`` or
  ``rest.allowed-hosts``), so a DNS-rebound name is refused;
* ``Authorization: Bearer <token>`` (the token is derived from the cluster secret) on every
  route, or with ``rest.auth: mutating`` on the mutating ones only;
* a mutating request with a body is JSON (``Content-Type: application/json``): a cross-site form
  cannot send one without a CORS preflight, which this server never grants;
* ``rest.server.max-content-length`` is enforced on the declared length before the body is read
  (here), and on a chunked body as it streams in (the handlers, with ``too_large``);
* savepoint targets stay inside ``state.savepoints.dir`` or ``state.savepoints.allowed-dirs``.

Every check decides from the request alone and raises RestError, which the handlers answer in
Flink's error shape. Shared by the leader's RestServer and a standby's forwarder.
"""
from __future__ import annotations

import hmac
import ipaddress
import os
import re
from http import HTTPStatus
from pathlib import Path
from typing import Optional

import tornado.web

from cluster.checkpoint.storage import local_path
from cluster.conf import Configuration
from cluster.conf.options import RestOptions

MUTATING_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})
# Every body a route here reads is a small JSON object (a savepoint request is a few hundred bytes);
# Flink's cap (100 MB by default, sized for jar uploads, which streamlab has none of) applies on top.
MAX_JSON_BODY = 1024 * 1024
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class RestError(tornado.web.HTTPError):
    """An answer other than success, with the text that goes into Flink's ``errors`` list."""

    def __init__(self, status: int, message: str, headers: Optional[dict] = None):
        super().__init__(status)
        self.message = message
        self.headers = headers or {}


# ---------------------------------------------------------------------- request checks
class RequestGuard:
    """Decides, from the request line and headers alone, whether a request may go on."""

    def __init__(self, conf: Configuration, token: str):
        self.token = token
        self.auth = conf.get(RestOptions.AUTH)
        self.max_content_length = min(conf.get(RestOptions.SERVER_MAX_CONTENT_LENGTH), MAX_JSON_BODY)
        hosts: list[str] = conf.get(RestOptions.ALLOWED_HOSTS)
        allowed = list(hosts)
        self.any_host = "*" in allowed
        self.names = _LOCAL_NAMES | {h.lower() for h in allowed} | {conf.get(RestOptions.ADDRESS).lower()}
        bind = _ip(conf.get(RestOptions.BIND_ADDRESS) or conf.get(RestOptions.ADDRESS))
        self.bind_ip = bind
        # bound to every interface: any of the machine's addresses reaches it
        self.any_ip = bind is not None and bind.is_unspecified

    def check(self, request, check_token: bool = True) -> None:
        """``check_token=False``: a standby's forwarder, whose leader checks the token itself."""
        self._check_host(request.host)
        mutating = request.method in MUTATING_METHODS
        if check_token and (mutating or self.auth == "all" or "Authorization" in request.headers):
            self._check_token(request.headers.get("Authorization", ""))
        if mutating:
            self._check_content_type(request.headers)
        self._check_declared_length(request.headers)

    def _check_host(self, host_header: str) -> None:
        if self.any_host:
            return
        host = re.sub(r":\d+$", "", host_header or "").strip().lower()
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        address = _ip(host)
        # A DNS-rebinding page reaches us under its own name; an address literal cannot be rebound.
        if address is not None:
            allowed = address.is_loopback or address == self.bind_ip or self.any_ip
        else:
            allowed = host in self.names
        if not allowed:
            raise RestError(HTTPStatus.FORBIDDEN, f"Host {host_header!r} is not a name of this server; "
                                                  "add it to rest.allowed-hosts to serve it")

    def _check_token(self, authorization: str) -> None:
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credentials.strip().encode(), self.token.encode()):
            what = "a wrong token" if authorization else "no token"
            raise RestError(HTTPStatus.UNAUTHORIZED,
                            f"Unauthorized: {what}. Send 'Authorization: Bearer <token>' "
                            "(the token: streamlab cluster rest-token)",
                            {"WWW-Authenticate": 'Bearer realm="streamlab"'})

    @staticmethod
    def _check_content_type(headers) -> None:
        has_body = headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in headers
        content_type = headers.get("Content-Type")
        if not has_body and content_type is None:
            return
        media_type = (content_type or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise RestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                            f"Content-Type {content_type!r} is not accepted: send the body as application/json")

    def _check_declared_length(self, headers) -> None:
        declared = headers.get("Content-Length")
        if declared is None:
            return
        try:
            length = int(declared)
        except ValueError:
            raise RestError(HTTPStatus.BAD_REQUEST, f"Content-Length {declared!r} is not a number") from None
        if length > self.max_content_length:
            raise self.too_large()

    def too_large(self) -> RestError:
        return RestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         f"Request body larger than {self.max_content_length} bytes, the most this API accepts "
                         "(rest.server.max-content-length, and 1 MiB for the JSON bodies of its routes)")


def _ip(text: str):
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None



def confined_target(target: str, savepoints_dir: str, allowed_dirs: list[str]) -> str:
    """``target`` as an absolute path, if it is one of the allowed folders or below one; else 400."""
    roots = [os.path.realpath(local_path(d)) for d in [savepoints_dir, *allowed_dirs] if d]
    path = local_path(target)
    if "://" in path:
        raise RestError(HTTPStatus.BAD_REQUEST, f"target directory {target!r}: only local paths are supported")
    if not os.path.isabs(path):
        raise RestError(HTTPStatus.BAD_REQUEST, f"target directory {target!r} must be an absolute path")
    resolved = os.path.realpath(path)  # symlinks and ".." cannot lead out of a root
    if not any(Path(resolved).is_relative_to(root) for root in roots):
        raise RestError(HTTPStatus.BAD_REQUEST,
                        f"target directory {target!r} is outside the savepoint folders "
                        f"({', '.join(roots)}): use a folder below them, or add it to state.savepoints.allowed-dirs")
    return resolved
