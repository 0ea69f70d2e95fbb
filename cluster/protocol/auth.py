"""The cluster's shared secret.

A JobGraph carries pickled user code, so a message that anyone on the machine could forge would
be remote code execution. Every frame is signed with this secret (see codec.py); the secret is
made once per cluster and readable by its owner only.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

SECRET_BYTES = 32
# Domain separation: the REST token is shown to users (curl, FLINK_REST_CLIENT_HEADERS), the secret
# never is, and knowing the token must not help to sign control messages.
_REST_TOKEN_LABEL = b"streamlab-rest-token"


def create_secret(path: Path) -> bytes:
    """Write a new random secret to ``path`` with mode 0600 and return it."""
    return write_secret(path, secrets.token_bytes(SECRET_BYTES))


def write_secret(path: Path, secret: bytes) -> bytes:
    """Write ``secret`` to ``path`` with mode 0600 (a cluster directory's copy of a given one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL-free but mode-first: the file never exists with wider permissions.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, secret.hex().encode())
    finally:
        os.close(fd)
    return secret


def load_secret(path: Path) -> bytes:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"cluster secret not found at {path}: start the cluster first "
            "(streamlab cluster start) or pass --cluster-dir"
        ) from None
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"cluster secret {path} has mode {oct(mode)}; it must be 0600")
    return parse_secret(text, path)


def parse_secret(text: str, where: object) -> bytes:
    """A secret file's content (hex); ``where`` names the file in the error."""
    if not text.strip():  # the Kubernetes base's placeholder, until an overlay gives one
        raise ValueError(f"cluster secret {where} is empty: make one with "
                         "`streamlab jobmanager create-secret FILE`")
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"cluster secret {where} is not a hex string") from None
    if len(secret) < 16:
        raise ValueError(f"cluster secret {where} is too short")
    return secret


def rest_token(secret: bytes) -> str:
    """The bearer token of the cluster's REST API, derived from the cluster secret (hex)."""
    return hmac.new(secret, _REST_TOKEN_LABEL, hashlib.sha256).hexdigest()
