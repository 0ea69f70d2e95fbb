"""How the lab extension's server finds a notebook's cluster (labext/streamlab_labext).

A kernel whose cells run on a cluster writes ``<runtime dir>/streamlab/kernel-<kernel id>.json``
= ``{"kernel_id", "cluster_dir", "pid"}`` beside its connection file (the Jupyter server's runtime
dir); the server lists the ones whose kernel it runs. The file goes when the cluster stops and at
exit. Outside a Jupyter kernel (a script, a terminal IPython) there is no kernel id and nothing
is written.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Optional

REGISTRY_FOLDER = "streamlab"
# a %%stream cell's output names its job for the lab ("Cancel this cell's job")
JOB_MIME_TYPE = "application/vnd.streamlab.job+json"
_KERNEL_FILE = re.compile(r"kernel-(?P<id>[0-9A-Za-z-]+)\.json")

_written: Optional[tuple[Path, str]] = None  # (registry file, cluster directory it names)


def cluster_id(cluster_dir: "str | os.PathLike[str]") -> str:
    """A cluster's id in the lab: the first 12 hex of the sha1 of its directory's real path
    (stable across restarts of the cluster, and naming no path in the page)."""
    return hashlib.sha1(os.path.realpath(cluster_dir).encode()).hexdigest()[:12]


def _connection_file() -> Optional[Path]:
    try:
        from ipykernel.kernelapp import IPKernelApp
    except ImportError:
        return None
    if not IPKernelApp.initialized():
        return None
    name = IPKernelApp.instance().connection_file
    return Path(name) if name else None


def registry_file() -> Optional[Path]:
    """This kernel's registry file, or None outside a Jupyter kernel."""
    connection = _connection_file()
    match = _KERNEL_FILE.fullmatch(connection.name) if connection is not None else None
    if connection is None or match is None:
        return None
    return connection.parent / REGISTRY_FOLDER / f"kernel-{match['id']}.json"


def register(cluster_dir: Path) -> None:
    """Name ``cluster_dir`` as this kernel's cluster (again: no write)."""
    global _written
    path = registry_file()
    if path is None or _written == (path, str(cluster_dir)):
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    kernel = _KERNEL_FILE.fullmatch(path.name)
    assert kernel is not None
    body = {"kernel_id": kernel["id"], "cluster_dir": os.path.realpath(cluster_dir), "pid": os.getpid()}
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(body))
    os.replace(partial, path)  # a reader never sees half a file
    _written = (path, str(cluster_dir))


def unregister(cluster_dir: Optional[Path] = None) -> None:
    """Remove this kernel's registry file (if ``cluster_dir`` is given: only if it names that one)."""
    global _written
    if _written is None or (cluster_dir is not None and _written[1] != str(cluster_dir)):
        return
    _written[0].unlink(missing_ok=True)
    _written = None


atexit.register(unregister)
