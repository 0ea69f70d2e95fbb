"""Checkpoint storage: a directory per checkpoint, and ``_metadata`` written last.

``<execution.checkpointing.dir>/<job id>/chk-<n>/`` holds the files the tasks wrote and, once
every task acknowledged, the ``_metadata`` that the JobManager writes last (to a temporary name,
then renamed): a checkpoint without it does not exist. The metadata carries a checksum of its
own body, so a truncated or edited file is recognised and skipped (checkpoints) or refused
(a savepoint given by the user). State handles name files relative to the checkpoint's folder,
so a savepoint can be moved.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import Optional

FORMAT = "streamlab-checkpoint/1"
METADATA = "_metadata"


class CheckpointFormatError(ValueError):
    pass


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_metadata(directory: Path, body: dict) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    document = {"format": FORMAT, "body": body, "sha256": _digest(body)}
    tmp = directory / f".{METADATA}.{uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        json.dump(document, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(directory / METADATA)  # atomic: readers see the whole file or none
    return directory / METADATA


def read_metadata(directory: Path) -> dict:
    """The body of a checkpoint's or savepoint's metadata; CheckpointFormatError says what is wrong."""
    path = Path(directory) / METADATA
    if not Path(directory).is_dir():
        raise CheckpointFormatError(f"{directory} is not a directory")
    if not path.exists():
        raise CheckpointFormatError(f"{path} is missing (the checkpoint never completed)")
    try:
        document = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointFormatError(f"{path} is not valid JSON ({exc}): truncated or corrupt") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointFormatError(f"{path} is not a {FORMAT} metadata file")
    body = document.get("body")
    if not isinstance(body, dict) or document.get("sha256") != _digest(body):
        raise CheckpointFormatError(f"{path} does not match its checksum: corrupt")
    for key in ("job_id", "checkpoint_id", "kind", "operators"):
        if key not in body:
            raise CheckpointFormatError(f"{path} lacks {key!r}")
    return body


class CheckpointStorage:
    def __init__(self, checkpoints_dir: str, savepoints_dir: str, job_id: str):
        self.job_dir = Path(local_path(checkpoints_dir)) / job_id
        self.savepoints_dir = Path(local_path(savepoints_dir))
        self.job_id = job_id

    def checkpoint_dir(self, checkpoint_id: int) -> Path:
        return self.job_dir / f"chk-{checkpoint_id}"

    def new_savepoint_dir(self, target: Optional[str]) -> Path:
        base = Path(local_path(target)) if target else self.savepoints_dir
        return base / f"savepoint-{self.job_id[:6]}-{uuid.uuid4().hex[:12]}"



def completed_on_disk(job_dir: Path) -> list[tuple[int, Path]]:
    """A job's checkpoint folders, newest first (validity is checked by read_metadata)."""
    found = []
    if job_dir.is_dir():
        for child in job_dir.iterdir():
            m = re.fullmatch(r"chk-(\d+)", child.name)
            if m:
                found.append((int(m.group(1)), child))
    return sorted(found, reverse=True)


def local_path(path: str) -> str:
    """A ``file://`` URI or a plain path, as a local path."""
    return path[len("file://"):] if path.startswith("file://") else path
