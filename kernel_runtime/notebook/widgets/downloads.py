"""A result's rows as a file the page saves: a link whose address holds the file (a data: URL).

The kernel cannot hand the browser a file, and a file written beside the notebook would need the
server's address of that folder, which the kernel does not know; so the bytes travel in the link
itself, made when the user asks for them, and only up to MAX_BYTES (past that, the message says how
to write the file from the notebook instead).
"""
from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

FORMATS = {"CSV": ("csv", "text/csv"), "Parquet": ("parquet", "application/vnd.apache.parquet")}
MAX_BYTES = 50 * 1024 * 1024


@dataclass(frozen=True)
class Download:
    filename: str
    mime: str
    data: bytes

    def link(self) -> str:
        """HTML: a link that saves the file, with its name and size."""
        size = len(self.data)
        if size > MAX_BYTES:
            return (f'<span class="streamlab-download-refused">{self.filename}: {size / 2**20:.0f} MB is too much to '
                    f'pass through the page; write it from the notebook, e.g. job.to_pandas().to_parquet(...)</span>')
        encoded = base64.b64encode(self.data).decode("ascii")
        return (f'<a class="streamlab-download" download="{self.filename}" href="data:{self.mime};base64,{encoded}">'
                f'save {self.filename}</a> ({_size(size)})')


def _size(n: int) -> str:
    return f"{n:,} B" if n < 1024 else f"{n / 1024:,.1f} KB" if n < 2**20 else f"{n / 2**20:,.1f} MB"


def file_stem(name: str) -> str:
    """A file name from a sink's name: letters, digits, '-', '_' and '.'."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return stem or "results"


def download(frame: pd.DataFrame, name: str, kind: str) -> Download:
    """``frame`` as a file of ``kind`` (a key of FORMATS) named after ``name``."""
    suffix, mime = FORMATS[kind]
    buffer = io.BytesIO()
    if suffix == "csv":
        frame.to_csv(buffer, index=False)
    else:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buffer)
    return Download(f"{file_stem(name)}.{suffix}", mime, buffer.getvalue())
