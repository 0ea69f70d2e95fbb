"""Re-execute the tutorials under notebooks/ and keep what nbval compares.

    .venv/bin/python tests/notebooks/refresh.py [notebooks/01-quickstart.ipynb ...]

Each notebook runs top to bottom on a fresh kernel (and so a fresh embedded cluster). The outputs
of the deterministic cells are kept as nbval's reference; the live cells (tagged
nbval-ignore-output) and the widgets' saved state are dropped, so the files stay small and a
reader opening one sees no stale dashboard.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
LIVE_TAG = "nbval-ignore-output"


def refresh(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
                   ).execute()
    for cell in notebook.cells:
        if cell.cell_type == "code" and LIVE_TAG in cell.metadata.get("tags", []):
            cell.outputs = []
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)
    print(f"{path.name}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(NOTEBOOKS.glob("*.ipynb")):
        refresh(Path(name).resolve())
