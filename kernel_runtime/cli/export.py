"""``streamlab export NOTEBOOK.ipynb [-o DIR] [--cell NAME]``: a notebook's %%stream cells as job
packages (kernel_runtime.export.package)."""
from __future__ import annotations

from pathlib import Path

import click

from kernel_runtime.export.package import export_notebook
from kernel_runtime.export.slicing import ExportError


@click.command("export")
@click.argument("notebook", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the packages go (default: a folder named after the notebook, next to it).")
@click.option("--cell", "cell_name", metavar="NAME",
              help="Export only the %%stream cell of this --name, into the output folder itself.")
def export(notebook: Path, output, cell_name) -> None:
    """Export a notebook's %%stream cells as job packages (job.py, config.yaml, requirements.txt)."""
    output = output or notebook.with_suffix("")
    try:
        written = export_notebook(notebook, output, cell_name)
    except ExportError as exc:
        raise click.ClickException(str(exc)) from None
    for package, directory in written:
        click.echo(f"{package.cell.label} -> {directory}")
