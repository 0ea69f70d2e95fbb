"""A pytest plugin for the nbval run of test_notebooks.py: once the run ends, it writes the notebook
as the kernel executed it (each cell's outputs as nbval received them, and its execution count)
to $STREAMLAB_EXECUTED_NOTEBOOK, so that the export test reads the one run nbval checked instead
of executing the notebook a second time.

nbval keeps a cell's outputs on its test item (``test_outputs``, set as the cell starts) but not the
count the kernel gave it: every cell nbval sends is one execution, so the count is the number of
cells sent so far (the job of an unnamed %%stream cell is named after it; the export test finds
each package's job by that name, so a wrong count fails it).
"""
from __future__ import annotations

import os

import nbformat

_ran: list = []  # nbval's cell items in the order they ran


def pytest_runtest_teardown(item) -> None:
    if getattr(item, "test_outputs", None) is not None and hasattr(item, "cell"):
        _ran.append(item)


def pytest_sessionfinish(session) -> None:
    path = os.environ.get("STREAMLAB_EXECUTED_NOTEBOOK")
    if not path or not _ran:
        return
    notebook = _ran[0].parent.nb
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    for count, item in enumerate(_ran, start=1):
        item.cell.outputs = list(item.test_outputs)
        item.cell.execution_count = count
    nbformat.write(notebook, path)
