"""Notebook -> job package: what ``streamlab export``, ``%stream_export`` and the lab's Export write.

The notebook is read from disk (nbformat); which of its code each ``%%stream`` cell's job needs is
chosen by kernel_runtime.export.slicing; this module writes it out. The package (the layout of
/work/helpers/issue11-design.md): ``job.py`` (the kept definitions at module level, the cell's
pipeline in ``build(env)``, ``main(argv=None)``), ``config.yaml`` (the notebook's
``%config StreamMagics.cluster_config`` and the cell's options, in Flink's keys) and
``requirements.txt`` (the distributions of the script's imports, pinned to the installed versions).
"""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from kernel_runtime.export.slicing import (DEFINITIONS, KEEP_TAG, SKIP_TAG, Cell, ExportError, Slice, Statement,
                                           notebook_cells, slice_cell)

DISTRIBUTION = "streamlab"


def read_cells(path: Path) -> list[Cell]:
    import nbformat
    try:
        notebook = nbformat.read(str(path), as_version=4)
    except FileNotFoundError:
        raise ExportError(f"{path}: no such notebook") from None
    except Exception as exc:  # nbformat's errors: not JSON, not a notebook
        raise ExportError(f"{path}: not a readable notebook ({type(exc).__name__}: {exc})") from None
    return notebook_cells(notebook.cells)


# ---------------------------------------------------------------------------- the package
@dataclass
class JobPackage:
    cell: Cell
    script: str
    config: dict
    requirements: list[str]

    @property
    def name(self) -> str:
        return self.cell.job_name

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "job.py").write_text(self.script)
        (directory / "config.yaml").write_text(
            f"# Job '{self.name}': Flink's configuration keys (see streamlab's cluster/conf/config.yaml)\n"
            + yaml.safe_dump(self.config, sort_keys=False, allow_unicode=True))
        (directory / "requirements.txt").write_text("\n".join(self.requirements) + "\n")
        return directory


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "job"


def _is_import(statement: Statement) -> bool:
    return isinstance(statement.node, (ast.Import, ast.ImportFrom))


def _imports(piece: Slice) -> list[str]:
    """The import statements the script needs, each name imported once: only the names some kept
    statement reads (a cell's `from x import a, b` of which the job uses `a`), the names from one
    module in one statement (unless a cell tagged export asks for its imports as they are)."""
    reads = {n for s in piece.module + piece.build if not _is_import(s) for n in s.reads}
    lines: dict[str, None] = {}
    from_module: dict[tuple[str, int], list[ast.alias]] = {}
    for statement in piece.module:
        node = statement.node
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if KEEP_TAG in statement.cell.tags or any(a.name == "*" for a in node.names):
            lines[statement.source] = None
            continue
        names = [a for a in node.names if (a.asname or a.name.split(".")[0]) in reads]
        if isinstance(node, ast.Import):
            for alias in names:
                lines[ast.unparse(ast.Import(names=[alias]))] = None
        elif names:
            key = (node.module or "", node.level)
            if key not in from_module:
                from_module[key] = []
                lines[f"from-module {key}"] = None  # its place in the order
            known = {(a.name, a.asname) for a in from_module[key]}
            from_module[key] += [a for a in names if (a.name, a.asname) not in known]
    result = []
    for line in lines:
        if line.startswith("from-module "):
            (module, level), = [k for k in from_module if f"from-module {k}" == line]
            line = ast.unparse(ast.ImportFrom(module=module or None, names=from_module[(module, level)], level=level))
        result.append(line)
    return result


def _script(notebook: Path, cell: Cell, piece: Slice) -> str:
    imports = _imports(piece)
    definitions = [s for s in piece.module if not _is_import(s)]
    if not piece.build:
        raise ExportError(f"{cell.label}: the cell builds no pipeline on `env`")
    body = "\n".join(_indent(s.source) for s in piece.build)
    header = "from kernel_runtime.export.job_main import run_job"
    if header not in imports:
        imports.append(header)
    parts = [
        f'"""Job \'{cell.job_name}\', exported from {notebook.name} ({cell.label}) by `streamlab export`.\n\n'
        "Run it on an embedded cluster:  python job.py [--output OUT]\n"
        "on a session cluster:           streamlab run job.py [--output OUT]\n"
        "in application mode:            streamlab run-application . -- [--output OUT]\n"
        "Its options are in config.yaml (Flink's keys); with --output, each collect sink's final table\n"
        "is written to OUT/<sink name>.parquet.\n"
        '"""',
    ]
    parts[0] += "\n\n" + _sorted_imports(imports)
    if definitions:
        text = definitions[0].source
        for previous, statement in zip(definitions, definitions[1:]):
            # constants together, functions and classes apart (PEP 8's two blank lines)
            spaced = isinstance(previous.node, DEFINITIONS) or isinstance(statement.node, DEFINITIONS)
            text += ("\n\n\n" if spaced else "\n") + statement.source
        parts.append(text)
    parts.append(f'def build(env):\n    """The pipeline of {cell.label}."""\n{body}')
    parts.append('def main(argv=None):\n    """Build the pipeline on an environment configured by config.yaml and run it."""\n'
                 "    return run_job(build, __file__, argv)")
    parts.append('if __name__ == "__main__":\n    main()')
    text = "\n\n\n".join(parts) + "\n"
    compile(text, "job.py", "exec")  # what we write must at least be Python
    return text


def _sorted_imports(imports: list[str]) -> str:
    """Standard library first, then the rest, each in the notebook's order (as isort groups them)."""
    def third_party(text: str) -> bool:
        return any(root not in sys.stdlib_module_names for root in _import_roots(ast.parse(text)))
    groups = [[i for i in imports if not third_party(i)], [i for i in imports if third_party(i)]]
    return "\n\n".join("\n".join(group) for group in groups if group)


def _indent(source: str) -> str:
    return "\n".join(("    " + line) if line.strip() else line for line in source.splitlines())


def _import_roots(tree: ast.AST) -> list[str]:
    roots = []
    for node in tree.body if isinstance(tree, ast.Module) else [tree]:
        if isinstance(node, ast.Import):
            roots += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.append(node.module.split(".")[0])
    return roots


def requirements(script: str) -> list[str]:
    """The distributions the script's top-level imports come from, pinned; never the standard
    library; always streamlab (what runs the job)."""
    by_module = importlib.metadata.packages_distributions()
    wanted: dict[str, None] = {DISTRIBUTION: None}
    unknown = []
    for root in dict.fromkeys(_import_roots(ast.parse(script))):
        if root in sys.stdlib_module_names or root == "__future__":
            continue
        distributions = by_module.get(root)
        if not distributions:
            if root not in ("kernel_runtime", "cluster"):  # streamlab's own packages (an uninstalled checkout)
                unknown.append(root)
            continue
        for distribution in distributions:
            wanted.setdefault(distribution, None)
    lines = []
    for distribution in wanted:
        try:
            lines.append(f"{distribution}=={importlib.metadata.version(distribution)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(distribution)
    lines += [f"# {root}: imported by the job, from no installed distribution" for root in unknown]
    return lines


def export_cell(notebook: Path, cells: list[Cell], cell: Cell) -> JobPackage:
    piece = slice_cell(cells, cell)
    script = _script(notebook, cell, piece)
    return JobPackage(cell, script, piece.config, requirements(script))


def stream_cells(notebook: Path, cells: list[Cell]) -> list[Cell]:
    found = [c for c in cells if c.stream_line is not None and SKIP_TAG not in c.tags]
    if not found:
        raise ExportError(f"{notebook}: the notebook has no %%stream cell to export")
    return found


def export_notebook(notebook: Path, output: Path, cell_name: Optional[str] = None) -> list[tuple[JobPackage, Path]]:
    """Write one package per %%stream cell into output/<slug of its name>/ (with ``cell_name``,
    that cell's alone, into output itself). Returns the packages and where they went."""
    notebook = Path(notebook)
    cells = read_cells(notebook)
    candidates = stream_cells(notebook, cells)
    if cell_name is not None:
        chosen = [c for c in candidates if c.job_name == cell_name]
        if not chosen:
            raise ExportError(f"{notebook}: no %%stream cell named {cell_name!r}; its cells are "
                              + ", ".join(repr(c.job_name) for c in candidates))
        if len(chosen) > 1:
            raise ExportError(f"{notebook}: {len(chosen)} %%stream cells are named {cell_name!r} ("
                              + ", ".join(c.label for c in chosen) + "); give each its own --name")
        package = export_cell(notebook, cells, chosen[0])
        return [(package, package.write(Path(output)))]
    packages = [export_cell(notebook, cells, c) for c in candidates]
    slugs = [slug(p.name) for p in packages]
    written = []
    for package, directory in zip(packages, slugs):
        if slugs.count(directory) > 1:  # two cells of one name: number them in notebook order
            directory = f"{directory}-{package.cell.index}"
        written.append((package, package.write(Path(output) / directory)))
    return written
