"""Which of a notebook's code a ``%%stream`` cell's job needs: pure, no I/O (kernel_runtime.export.package
reads the notebook and writes what this chooses).

A ``%%stream`` cell's body is Python run with ``env`` bound; what it reads from the cells before it
is found by statement-level slicing: every statement of those cells is read with ``ast`` (after
IPython's own transformation of magics and shell lines into calls of ``get_ipython()``), the names
it binds and the module-level names it reads with ``symtable`` (exact scoping: a function's locals
and a comprehension's variables are not reads). From the names the cell reads, the statements that
last bound them are kept, then what those read, and so on. Only imports, function and class
definitions and assignments can be kept; a name last bound by anything else (a loop, a magic, a job
handle, ``_``/``Out``) is computed interactively, and the cell cannot be exported: ExportError names
the cell and the variable. Bare expressions (displays), other magics and shell lines never reach the
script, nor do cells tagged ``skip-export``; cells tagged ``export`` are kept whole. The job's
configuration comes from the same reading: the notebook's ``%config StreamMagics.cluster_config``
and ``%stream_cluster start`` lines and the cell's options, in Flink's keys.
"""
from __future__ import annotations

import ast
import builtins
import re
import symtable
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from IPython.core.error import UsageError

from kernel_runtime.export.magic_arguments import (CHECKPOINT_INTERVAL_KEY, StreamArgs, parse_cluster_args, parse_stream_args,
                                                   parse_stream_sql_args)

SKIP_TAG, KEEP_TAG = "skip-export", "export"
# names only an interactive session has: IPython's output history and its shell
_INTERACTIVE = re.compile(r"^(_+|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|get_ipython|display|exit|quit)$")
_BUILTINS = frozenset(dir(builtins))
_DISPLAY_CALLS = {"display", "print", "pprint"}


class ExportError(Exception):
    """A notebook (or one of its cells) that cannot become a job package; the message says which
    cell and why."""


# ---------------------------------------------------------------------------- reading the notebook
@dataclass
class Statement:
    """One top-level statement of a cell, in notebook order (``position``)."""
    position: int
    cell: "Cell"
    node: Optional[ast.stmt]
    source: str
    binds: set[str]
    reads: set[str]
    # None: exportable; else why its bindings are interactive ("a for loop", "the job handle of ...")
    interactive: Optional[str] = None


@dataclass
class Cell:
    index: int  # among all the notebook's cells
    execution_count: Optional[int]
    source: str
    tags: set[str]
    stream_line: Optional[str] = None  # the %%stream line's arguments, for a %%stream cell
    args: Optional[StreamArgs] = None  # those arguments, parsed
    statements: list[Statement] = field(default_factory=list)

    @property
    def label(self) -> str:
        where = f"In [{self.execution_count}]" if self.execution_count is not None else f"cell #{self.index}"
        if self.stream_line is not None:
            if self.args is not None and self.args.name:
                return f"%%stream cell '{self.args.name}' ({where})"
            return f"%%stream cell {where}"
        return where

    @property
    def job_name(self) -> str:
        if self.args is not None and self.args.name:
            return self.args.name
        return f"cell {self.execution_count}" if self.execution_count is not None else f"cell #{self.index}"


def _transform(source: str) -> str:
    """Python source with IPython's magics and shell lines as get_ipython() calls (as the kernel runs it)."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


def _scope_reads(table: symtable.SymbolTable, top: bool = True) -> set[str]:
    """Module-level names a piece of code reads, at any depth of nested scopes (in a function,
    class or comprehension: the names it neither binds nor takes from an enclosing function)."""
    reads = {s.get_name() for s in table.get_symbols() if s.is_referenced() and (top or s.is_global())}
    for child in table.get_children():
        reads |= _scope_reads(child, top=False)
    return reads


def _names(source: str) -> tuple[set[str], set[str]]:
    """(the module-level names the code binds, those it reads before or without binding them)."""
    table = symtable.symtable(source, "<cell>", "exec")
    binds = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    return binds, _scope_reads(table)


def _uses_ipython(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "get_ipython" for n in ast.walk(node))


def _magic_call(node: ast.stmt) -> Optional[tuple[str, str]]:
    """(magic name, its line) for a statement that is a line magic, as IPython transformed it."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        call = node.value
        if (isinstance(call.func, ast.Attribute) and call.func.attr == "run_line_magic"
                and len(call.args) >= 2 and all(isinstance(a, ast.Constant) for a in call.args[:2])):
            return call.args[0].value, call.args[1].value  # type: ignore[attr-defined]
    return None


_EXPORTABLE_KINDS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                     ast.Assign, ast.AnnAssign, ast.AugAssign)


def _interactive_kind(node: ast.stmt) -> Optional[str]:
    """Why the names this statement binds cannot go into a script (None: they can)."""
    if isinstance(node, _EXPORTABLE_KINDS):
        return None
    if isinstance(node, (ast.If, ast.Try)):  # `try: import x / except ImportError: x = None`
        inner = [s for s in ast.walk(node) if isinstance(s, ast.stmt) and s is not node]
        if all(isinstance(s, _EXPORTABLE_KINDS + (ast.Pass, ast.If, ast.Try)) or
               isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in inner):
            return None
    return f"a {type(node).__name__.lower()} statement"


def _statements(cell: Cell, source: str, start: int) -> list[Statement]:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        if cell.stream_line is None:
            return []  # what it would bind is unknown: a pipeline that needs it hears "no cell defines"
        raise ExportError(f"{cell.label}: SyntaxError: {exc.msg} (line {exc.lineno})") from None
    statements = []
    for i, node in enumerate(tree.body):
        text = ast.get_source_segment(source, node) or ast.unparse(node)
        binds, reads = _names(ast.unparse(node))
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            reads.add(node.target.id)  # `x += 1` reads x first (symtable marks it bound only)
        why = _interactive_kind(node)
        if why is None and _uses_ipython(node):
            why = "a magic or shell command"
        statements.append(Statement(start + i, cell, node, text, binds, reads, why))
    return statements


def _magic(first: str, name: str) -> Optional[str]:
    """The options of a cell whose first line is the cell magic ``name``; None for another cell."""
    if first.startswith(name) and first[len(name):][:1] in ("", " ", "\t"):
        return first[len(name):].strip()
    return None


def _view_registration(statement: "Statement") -> Optional[str]:
    """``create_temporary_view(name, definition)`` (or ``NexmarkSource.create_views(...)``) of a
    plain cell as a %%stream_sql cell's job makes it: on its ``env`` (a view of the process is a
    definition, run on each environment)."""
    node = statement.node
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return None
    func = node.value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    call = node.value
    if name == "create_views" and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
            and func.value.id == "NexmarkSource" and not any(k.arg == "env" for k in call.keywords):
        # NexmarkSource.create_views: its views, on the job's env
        return ast.unparse(ast.Call(func, call.args, call.keywords + [ast.keyword("env", ast.Name("env"))]))
    if name != "create_temporary_view" or isinstance(func, ast.Attribute) and \
            isinstance(func.value, ast.Name) and func.value.id == "env":
        return None
    given = [ast.unparse(a) for a in call.args] + [f"{k.arg}={ast.unparse(k.value)}" if k.arg else
                                                    f"**{ast.unparse(k.value)}" for k in call.keywords]
    return f"env.create_temporary_view({', '.join(given)})"


def notebook_cells(raw_cells: Sequence[Any]) -> list[Cell]:
    """The code cells of a notebook (nbformat's cells, as read), each read into its statements.

    A ``%%stream_sql`` cell is read as the ``%%stream`` cell it stands for: the views registered
    before it (``create_temporary_view`` in plain cells), then ``env.sql_query(query).collect()``."""
    cells, position = [], 0
    registrations: list[str] = []
    for index, raw in enumerate(raw_cells):
        if raw.cell_type != "code":
            continue
        cell = Cell(index, raw.get("execution_count"), raw.source, set(raw.metadata.get("tags", [])))
        first, _, rest = raw.source.lstrip().partition("\n")
        sql_line = _magic(first, "%%stream_sql")
        if sql_line is not None:
            try:
                args, explain = parse_stream_sql_args(sql_line)
            except UsageError as exc:
                raise ExportError(f"{cell.label}: {exc}") from None
            if explain:  # prints the query's plan; runs no job
                cell.statements = []
                cells.append(cell)
                continue
            name = args.name or "sql"
            rest = "\n".join(registrations + [f"env.sql_query({rest!r}, name={name!r}).collect({name!r})"])
            first = f"%%stream {sql_line}"
        stream_line = _magic(first, "%%stream")
        if stream_line is not None:
            try:
                args = parse_stream_args(stream_line)
            except UsageError as exc:  # a bad option, as the magic would say
                raise ExportError(f"{cell.label}: {exc}") from None
            if args.dry_run:  # previews an upgrade; runs no job
                cell.statements = []
                cells.append(cell)
                continue
            cell.stream_line, cell.args = stream_line, args
            source = _transform(rest)
            # the cell's -o variable is a job handle; env is bound for its body only
            cell.statements = [Statement(position, cell, None, "", {"env"}, set(), "the `env` of a %%stream cell")]
            cell.statements += _statements(cell, source, position + 1)
            output = cell.args.output
            if output:
                cell.statements.append(Statement(position + len(cell.statements), cell, None, "", {output}, set(),
                                                 f"the job handle of {cell.label} (-o {output})"))
        elif first.startswith("%%"):
            cell.statements = []  # another cell magic: its body is not Python for the script
        else:
            cell.statements = _statements(cell, _transform(raw.source), position)
            if SKIP_TAG not in cell.tags:
                registrations += [r for r in map(_view_registration, cell.statements) if r is not None]
        position += len(cell.statements) + 1
        cells.append(cell)
    return cells


# ---------------------------------------------------------------------------- slicing
@dataclass
class Slice:
    module: list[Statement]  # the definitions the pipeline needs, in notebook order
    build: list[Statement]  # the cell's statements that make the pipeline (they use env)
    config: dict


def _last_binding(statements: list[Statement], name: str, before: int) -> Optional[Statement]:
    found = None
    for statement in statements:
        if statement.position >= before:
            break
        if name in statement.binds:
            found = statement
    return found


def _why_interactive(earlier: list[Statement]) -> dict[int, str]:
    """Why each statement's bindings are interactive, by position: its own kind, or (transitively)
    a name it reads that is (``result = orders.wait()`` reads the job handle ``orders``)."""
    why: dict[int, str] = {}
    latest: dict[str, Statement] = {}
    for statement in earlier:
        reason = statement.interactive
        if reason is None:
            for name in sorted(statement.reads):
                source = latest.get(name)
                if _INTERACTIVE.match(name) and source is None:
                    reason = f"`{name}`, which only an interactive session has"
                elif source is not None and source.position in why:
                    reason = f"`{name}` ({why[source.position]})"
                if reason is not None:
                    reason = f"a statement of {statement.cell.label} that reads {reason}" \
                        if not reason.startswith("a ") else reason
                    break
        if reason is not None:
            why[statement.position] = reason
        for name in statement.binds:
            latest[name] = statement
    return why


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def slice_cell(cells: list[Cell], target: Cell) -> Slice:
    before = [c for c in cells if c.index < target.index and SKIP_TAG not in c.tags]
    earlier = [s for c in before for s in c.statements]
    why = _why_interactive(earlier)
    start = target.statements[0].position
    kept: dict[int, Statement] = {}  # of the cells before, by position
    build, module_own = _split_body(target)
    own_defs = {name: s for s in module_own for name in s.binds}  # each bound once (_split_body)
    used_own: dict[int, Statement] = {}

    def need(name: str, reader: Statement, before_position: int, late: bool = False) -> None:
        if late and name in own_defs:  # an earlier cell's function reading what the cell defines
            use_own(own_defs[name])
            return
        statement = _last_binding(earlier, name, before_position)
        if statement is None and name in _BUILTINS:
            return
        if statement is None and _INTERACTIVE.match(name):
            raise ExportError(f"{target.label} reads `{name}`, which only an interactive session has"
                              + _through(reader, target))
        if statement is None:
            raise ExportError(f"{target.label} reads `{name}`, which no cell before it defines"
                              + _through(reader, target))
        if statement.position in why:
            raise ExportError(f"{target.label} reads `{name}`, which is computed interactively: bound by "
                              f"{why[statement.position]} in {statement.cell.label}" + _through(reader, target)
                              + f". Define `{name}` with an import, def, class or assignment the job can run, "
                                "or tag the cell that needs it skip-export")
        if statement.position not in kept:
            kept[statement.position] = statement
            read_all(statement)

    def read_all(statement: Statement) -> None:
        # a function's or class's body reads its globals when called (in the pipeline): the latest
        # bindings before the cell, or the cell's own; anything else reads them where it stands
        late = isinstance(statement.node, DEFINITIONS)
        for name in sorted(statement.reads - (statement.binds if late else set())):
            need(name, statement, start if late else statement.position, late)

    def read_own(statement: Statement, local: set[str]) -> None:
        for name in sorted(statement.reads - local - {"env"}):
            if name in own_defs:
                use_own(own_defs[name])
            else:
                need(name, statement, start)

    def use_own(statement: Statement) -> None:
        if statement.position not in used_own:
            used_own[statement.position] = statement
            read_own(statement, statement.binds)

    for cell in before:
        if KEEP_TAG in cell.tags:
            for statement in cell.statements:
                if statement.node is not None and _magic_call(statement.node) is None:
                    kept[statement.position] = statement
    for statement in list(kept.values()):
        read_all(statement)
    build_locals = {n for s in build for n in s.binds}
    for statement in build:
        read_own(statement, build_locals)
    # the cell's own definitions, only those used, in the cell's order
    module_own = [s for s in module_own if s.position in used_own]
    module = sorted(kept.values(), key=lambda s: s.position) + module_own
    return Slice(module, build, _config(before, target))


def _is_display(node: ast.Expr) -> bool:
    call = node.value
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in _DISPLAY_CALLS


def _split_body(target: Cell) -> tuple[list[Statement], list[Statement]]:
    """The cell's statements that make the pipeline (they use ``env``, or what was made from it)
    for build(env), and the definitions that do not (imports, helpers, constants bound once) for
    the module's top. Bare expressions that do not use the pipeline are displays: left out."""
    body = [s for s in target.statements if s.node is not None]
    bound: dict[str, int] = {}
    for statement in body:
        if statement.node is not None and _uses_ipython(statement.node):
            raise ExportError(f"{target.label}: a magic or shell command in a %%stream cell's body cannot be "
                              "exported")
        for name in statement.binds:
            bound[name] = bound.get(name, 0) + 1
    pipeline_names = {"env"}
    build, module = [], []
    for statement in body:
        if isinstance(statement.node, ast.Expr):
            if statement.reads & pipeline_names and not _is_display(statement.node):
                build.append(statement)
        elif (statement.reads & pipeline_names or statement.interactive is not None
              or any(bound[n] > 1 for n in statement.binds)):
            pipeline_names |= statement.binds
            build.append(statement)
        else:
            module.append(statement)
    return build, module


def _through(reader: Statement, target: Cell) -> str:
    return "" if reader.cell is target else f" (through {reader.cell.label}, which the cell needs)"


def _config(before: list[Cell], target: Cell) -> dict:
    """The notebook's cluster settings and the cell's options, in Flink's keys."""
    config: dict = {}
    for cell in before:
        for statement in cell.statements:
            magic = _magic_call(statement.node) if statement.node is not None else None
            if magic is None:
                continue
            name, line = magic
            if name == "config":
                key, sep, value = line.partition("=")
                if key.strip() == "StreamMagics.cluster_config" and sep:
                    try:
                        settings = ast.literal_eval(value.strip())
                    except (ValueError, SyntaxError):
                        raise ExportError(f"{cell.label}: %config StreamMagics.cluster_config is not a literal "
                                          f"dict: {value.strip()!r}") from None
                    config = {k: v for k, v in config.items() if k == "taskmanager.numberOfTaskSlots"}
                    config.update(settings)  # assigning the trait replaces the whole dict
                elif key.strip() == "StreamMagics.slots" and sep:
                    config["taskmanager.numberOfTaskSlots"] = int(value)
            elif name == "stream_cluster":
                cluster = parse_cluster_args(line)
                if cluster.action == "start" and cluster.slots:
                    config["taskmanager.numberOfTaskSlots"] = cluster.slots
    options = target.args or parse_stream_args("")
    config["pipeline.name"] = target.job_name
    if options.parallelism:
        config["parallelism.default"] = options.parallelism
    if options.checkpoint_interval:
        config[CHECKPOINT_INTERVAL_KEY] = options.checkpoint_interval
    return config
