"""Notebook cells by the names their users know: "In [5], line 3", not "283820497.py:3".

IPython compiles each cell to a file name of its own and keeps the map to the cell's execution
count (``shell.compile._filename_map``) and the cell's code (linecache). A job submitted from a
kernel carries the cells its code comes from (``JobGraph.cells``), and its call sites are
rewritten, so that what the cluster says of it names cells too (cluster.common.failures).
"""
from __future__ import annotations

import linecache
import os
import sys
from dataclasses import replace
from types import FrameType
from typing import Any, Optional

import msgpack

from cluster.common.failures import rewrite_sites
from cluster.graph.job_graph import JobGraph


def running_shell() -> Optional[Any]:
    """The IPython shell this code runs in, if any (a script never imports IPython for this)."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython
    return get_ipython()


def running_cell(shell) -> int:
    """The execution count of the cell running now, as its prompt shows it. IPython 9 counts the
    next cell in ``shell.execution_count`` while one runs (earlier versions the running one), so
    the count is the one the running cell's code was compiled under, found up the stack."""
    counts = getattr(shell.compile, "_filename_map", {})
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        count = counts.get(frame.f_code.co_filename)
        if count is not None:
            return count
        frame = frame.f_back
    return shell.execution_count  # not called from a cell's code


class CellSites:
    """The cells of a shell, and the call sites of its API calls ("3141592653.py:4") rewritten
    as "In [5], line 4"."""

    def __init__(self, shell):
        self.files: dict[str, str] = {}  # base name -> the cell's file name
        self.cells: dict[str, dict[str, str]] = {}  # base name -> {"name": "In [5]"}
        for filename, count in getattr(shell.compile, "_filename_map", {}).items():
            name = os.path.basename(filename)
            self.files[name] = filename
            self.cells[name] = {"name": f"In [{count}]"}

    def rewrite(self, text: str) -> str:
        return rewrite_sites(text, self.cells)

    def name(self, filename: str) -> Optional[str]:
        """"In [5]" for a cell's file name, None for another file."""
        cell = self.cells.get(os.path.basename(filename))
        return cell["name"] if cell else None

    def of_graph(self, graph: JobGraph) -> JobGraph:
        """The graph with its call sites in cells rewritten, carrying the cells its code comes
        from with their code: those whose file name is in its pickled functions or call sites."""
        if not self.cells:
            return graph
        wire = msgpack.packb(graph.to_dict(), use_bin_type=True)
        used = {name: {"name": cell["name"], "source": "".join(linecache.getlines(self.files[name]))}
                for name, cell in self.cells.items() if name.encode() in wire}
        if not used:
            return graph
        vertices = [replace(v, operators=[replace(o, call_site=rewrite_sites(o.call_site, used))
                                          for o in v.operators])
                    for v in graph.vertices]
        return replace(graph, vertices=vertices, cells=graph.cells | used)


def with_notebook_cells(graph: JobGraph) -> JobGraph:
    """``graph`` as submitted from a kernel: naming its cells (CellSites.of_graph); else unchanged."""
    shell = running_shell()
    return CellSites(shell).of_graph(graph) if shell is not None else graph
