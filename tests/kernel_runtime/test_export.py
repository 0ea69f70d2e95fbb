"""streamlab export / %stream_export: a notebook's %%stream cells as job packages.

Notebooks are built with nbformat in tmp_path; the packages are read back (script, config.yaml,
requirements.txt), and one is run as `python job.py --output OUT` in a process of its own, with
nothing but the project installed, its rows checked against pandas."""
from __future__ import annotations

import ast
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from kernel_runtime.cli.main import main as cli
from kernel_runtime.export.package import export_notebook
from kernel_runtime.export.slicing import ExportError

from .conftest import run

ROOT = Path(__file__).resolve().parents[2]


def notebook(tmp_path: Path, *cells, name: str = "nb.ipynb") -> Path:
    """A notebook of code cells; a cell is its source, or (source, [tags])."""
    nb = nbformat.v4.new_notebook()
    for count, cell in enumerate(cells, start=1):
        source, tags = cell if isinstance(cell, tuple) else (cell, [])
        code = nbformat.v4.new_code_cell(source, execution_count=count)
        if tags:
            code.metadata["tags"] = tags
        nb.cells.append(code)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# a notebook"))
    path = tmp_path / name
    nbformat.write(nb, str(path))
    return path


def export_one(path: Path, cell: str | None = None) -> Path:
    (package, directory), = export_notebook(path, path.parent / "out", cell)
    return directory


def script_of(directory: Path) -> str:
    return (directory / "job.py").read_text()


def top_level_names(script: str) -> set[str]:
    names = set()
    for node in ast.parse(script).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


EXPLORATION = [
    "%load_ext kernel_runtime",
    "%matplotlib inline",
    "!ls -l",
    "import numpy as np\nimport pandas as pd\nimport matplotlib.pyplot as plt",
    "SCALE = 3\nUNUSED = 99\n\ndef rows(seq):\n    return pd.DataFrame({'k': seq % 5, 'v': seq * SCALE})\n\n"
    "def plot(df):\n    df.plot()",
    "rows(np.arange(10))",  # a look at the data
    "df = rows(np.arange(100))\nplot(df)\ndisplay(df.head())",
    "for i in range(3):\n    print(i)",
]


def test_only_what_the_cell_needs_is_kept(tmp_path):
    path = notebook(tmp_path, *EXPLORATION,
                    "%%stream --name sums -o sums\nenv.from_generator(rows, count=1000).key_by('k')"
                    ".aggregate(total=('v', 'sum')).collect(name='totals')\nsums_seen = 1")
    script = script_of(export_one(path))
    assert top_level_names(script) == {"pd", "SCALE", "rows", "build", "main", "run_job"}
    assert "def plot" not in script and "UNUSED" not in script and "np" not in top_level_names(script)
    assert "sums_seen" not in script  # a statement of the cell that does not make the pipeline


def test_the_script_has_no_magics_and_no_display_code(tmp_path):
    path = notebook(tmp_path, *EXPLORATION,
                    "%%stream --name sums\nstream = env.from_generator(rows, count=10)\nstream.head_of_data = 1\n"
                    "display(stream)\nprint('built')\nstream.collect()")
    script = script_of(export_one(path))
    tree = ast.parse(script)
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not called & {"display", "print", "get_ipython"}
    assert "get_ipython" not in script and "run_line_magic" not in script
    assert not any(line.lstrip().startswith(("%", "!")) for line in script.splitlines())
    assert "matplotlib" not in script and "plot" not in script
    docstring = ast.get_docstring(tree)
    assert "nb.ipynb" in docstring and "'sums'" in docstring  # where it came from
    first_code = next(n for n in tree.body if not isinstance(n, ast.Expr))
    assert isinstance(first_code, (ast.Import, ast.ImportFrom))  # imports at the top
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert [a.arg for a in main.args.args] == ["argv"]


def test_tags_skip_export_and_export(tmp_path):
    path = notebook(tmp_path,
                    "import pandas as pd\nK = 1",
                    ("K = 2", ["skip-export"]),
                    ("import json\nBANNER = json.dumps({'job': 'demo'})", ["export"]),
                    "%%stream --name a\nenv.from_generator(lambda s: pd.DataFrame({'v': s * K}), count=5).collect()",
                    ("%%stream --name b\nenv.from_generator(count=5).collect()", ["skip-export"]))
    (package, directory), = export_notebook(path, tmp_path / "out")  # b is left out
    script = script_of(directory)
    assert package.name == "a"
    assert "K = 1" in script and "K = 2" not in script
    assert "BANNER = json.dumps" in script and "import json" in script


def test_the_latest_binding_before_the_cell_counts_and_functions_bring_what_they_read(tmp_path):
    path = notebook(tmp_path,
                    "import pandas as pd\nfrom math import floor, ceil\nOFFSET = 1",
                    "OFFSET = OFFSET + 10\nOFFSET += 100",
                    "def shift(seq):\n    return seq + OFFSET\n\ndef rows(seq):\n"
                    "    return pd.DataFrame({'v': [floor(x) for x in shift(seq)]})",
                    "%%stream --name c\nenv.from_generator(rows, count=4).collect()",
                    "OFFSET = 'later, not seen'")
    script = script_of(export_one(path))
    assert script.index("OFFSET = 1") < script.index("OFFSET = OFFSET + 10") < script.index("OFFSET += 100")
    assert "later" not in script
    assert "from math import floor\n" in script  # ceil is not used


def test_a_function_of_an_earlier_cell_may_read_what_the_stream_cell_defines(tmp_path):
    path = notebook(tmp_path, "def scaled(seq):\n    return {'v': seq * FACTOR}",
                    "%%stream --name f\nFACTOR = 3\nIGNORED = 4\nenv.from_generator(scaled, count=3).collect()")
    script = script_of(export_one(path))
    assert script.index("def scaled") < script.index("FACTOR = 3") < script.index("def build")
    assert "IGNORED" not in script


@pytest.mark.parametrize("cells, variable, why", [
    (["%%stream --name first -o handle\nenv.from_generator(count=3).collect()",
      "N = len(handle.wait().to_pandas())"], "N", "the job handle of %%stream cell 'first'"),
    (["total = 0\nfor i in range(4):\n    total += i"], "total", "a for statement"),
    (["3 * 7", "N = _"], "N", "`_`, which only an interactive session has"),
    (["files = !ls", "N = len(files)"], "N", "a magic or shell command"),
])
def test_a_variable_computed_interactively_is_an_error_naming_cell_and_variable(tmp_path, cells, variable, why):
    path = notebook(tmp_path, *cells, f"%%stream --name needy\nenv.from_generator(lambda s: {{'v': s * {variable}}}, "
                                      "count=3).collect()")
    count = len(cells) + 1
    with pytest.raises(ExportError) as error:
        export_notebook(path, tmp_path / "out")
    message = str(error.value)
    assert f"%%stream cell 'needy' (In [{count}])" in message
    assert f"`{variable}`" in message and why in message


def test_an_unnamed_cell_is_named_by_its_number_and_out_is_interactive(tmp_path):
    path = notebook(tmp_path, "%%stream\nenv.from_generator(lambda s: {'v': s + Out[1]}, count=3).collect()")
    with pytest.raises(ExportError, match=r"%%stream cell In \[1\] reads `Out`, which only an interactive session"):
        export_notebook(path, tmp_path / "out")


def test_a_cell_that_does_not_parse_blocks_only_a_pipeline_that_needs_it(tmp_path):
    cells = ["import pandas as pd", "broken = (", "%%stream --name ok\nenv.from_generator(count=3).collect()"]
    assert export_one(notebook(tmp_path, *cells)).name == "ok"
    cells[-1] = "%%stream --name needs\nenv.from_generator(lambda s: {'v': s * broken}, count=3).collect()"
    with pytest.raises(ExportError, match="reads `broken`, which no cell before it defines"):
        export_notebook(notebook(tmp_path, *cells, name="b.ipynb"), tmp_path / "b")


def test_a_notebook_without_stream_cells_says_so(tmp_path):
    path = notebook(tmp_path, "import pandas as pd", "pd.DataFrame({'a': [1]})")
    with pytest.raises(ExportError, match="has no %%stream cell"):
        export_notebook(path, tmp_path / "out")


def test_config_yaml_has_the_cluster_config_and_the_cell_options_in_flinks_keys(tmp_path):
    path = notebook(tmp_path,
                    '%config StreamMagics.cluster_config = {"heartbeat.timeout": "9 s"}',
                    '%config StreamMagics.cluster_config = {"state.backend.type": "rocksdb", '
                    '"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 3}',
                    "%stream_cluster start --taskmanagers 2 --slots 3",
                    '%%stream --name "per key" --parallelism 4 --checkpoint-interval "2 s" -o h\n'
                    "env.from_generator(count=10).collect()")
    directory = export_one(path)
    assert directory.name == "per-key"
    config = yaml.safe_load((directory / "config.yaml").read_text())
    assert config == {"state.backend.type": "rocksdb", "restart-strategy.type": "fixed-delay",
                      "restart-strategy.fixed-delay.attempts": 3, "taskmanager.numberOfTaskSlots": 3,
                      "pipeline.name": "per key", "parallelism.default": 4,
                      "execution.checkpointing.interval": "2 s"}
    from cluster.conf import Configuration
    Configuration(config)  # every key is one the cluster knows


def test_requirements_pin_the_distributions_of_the_imports_and_always_streamlab(tmp_path):
    path = notebook(tmp_path, "import os, json\nimport numpy as np\nimport yaml\nfrom pandas import DataFrame",
                    "%%stream --name r\nenv.from_generator(lambda s: DataFrame({'v': np.sqrt(s), 'sep': os.sep, "
                    "'y': yaml.__name__, 'j': json.dumps(1)}), count=3).collect()")
    lines = (export_one(path) / "requirements.txt").read_text().split()
    version = importlib.metadata.version
    assert lines == [f"streamlab=={version('streamlab')}", f"numpy=={version('numpy')}",
                     f"PyYAML=={version('PyYAML')}", f"pandas=={version('pandas')}"]


def test_each_cell_its_own_package_and_cell_picks_one(tmp_path):
    path = notebook(tmp_path, "import pandas as pd",
                    "%%stream --name 'Job One'\nenv.from_generator(count=3).collect()",
                    "%%stream --name two\nenv.from_generator(count=3).collect()")
    written = export_notebook(path, tmp_path / "all")
    assert [d.name for _, d in written] == ["job-one", "two"]
    (package, directory), = export_notebook(path, tmp_path / "one", "two")
    assert directory == tmp_path / "one" and (directory / "job.py").exists()
    with pytest.raises(ExportError, match="no %%stream cell named 'three'; its cells are 'Job One', 'two'"):
        export_notebook(path, tmp_path / "x", "three")


def test_the_command_gives_one_line_errors(tmp_path):
    empty = notebook(tmp_path, "x = 1")
    result = CliRunner().invoke(cli, ["export", str(empty), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: {empty}: the notebook has no %%stream cell to export"]
    good = notebook(tmp_path, "%%stream --name g\nenv.from_generator(count=3).collect()", name="good.ipynb")
    result = CliRunner().invoke(cli, ["export", str(good), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "g" / "job.py").exists()


def test_the_line_magic_exports_the_notebook(shell, tmp_path):
    good = notebook(tmp_path, "%%stream --name g\nenv.from_generator(count=3).collect()")
    _, out = run(shell, f"%stream_export --notebook {good} -o {tmp_path / 'pkg'} --cell g")
    assert (tmp_path / "pkg" / "job.py").exists(), out
    # without --notebook: the notebook the kernel's session is named after (as Jupyter names it)
    shell.user_ns["__session__"] = str(good)
    try:
        _, out = run(shell, f"%stream_export -o {tmp_path / 'mine'}")
    finally:
        del shell.user_ns["__session__"]
    assert (tmp_path / "mine" / "g" / "job.py").exists(), out
    empty = notebook(tmp_path, "x = 1", name="empty.ipynb")
    result, out = run(shell, f"%stream_export --notebook {empty}")
    assert "ExportError" in out and "has no %%stream cell" in out and "Traceback" not in out
    assert result.error_in_exec is not None


@pytest.mark.timeout(180)
def test_an_exported_job_runs_as_a_plain_script_without_jupyter_with_the_rows_pandas_gives(tmp_path):
    path = notebook(tmp_path,
                    "%load_ext kernel_runtime",
                    "import numpy as np\nimport pandas as pd\nSHOPS = 7",
                    "def sales(seq):\n    return pd.DataFrame({'shop': seq % SHOPS, 'amount': (seq * 13) % 50})",
                    "sales(np.arange(5))",
                    '%%stream --name revenue --parallelism 2 -o revenue\n'
                    "(env.from_generator(sales, count=5_000, batch_size=500)\n"
                    "    .key_by('shop')\n    .aggregate(revenue=('amount', 'sum'), n=('amount', 'count'))\n"
                    "    .collect(name='per shop'))")
    directory = export_one(path)
    out = tmp_path / "result"
    # a clean environment: the project on the path, no notebook, not this test's process
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMLAB_", "JPY_"))}
    env["PYTHONPATH"] = str(ROOT)
    # -X importtime lists every module the script's process imports (on stderr)
    done = subprocess.run([sys.executable, "-X", "importtime", "job.py", "--output", str(out)], cwd=directory,
                          env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "kernel_runtime" in imported and "pandas" in imported
    assert not imported & {"IPython", "ipykernel", "nbformat", "ipywidgets", "bokeh", "jupyter_client"}
    got = pd.read_parquet(out / "per shop.parquet").sort_values("shop", ignore_index=True)
    data = pd.DataFrame({"shop": np.arange(5_000) % 7, "amount": (np.arange(5_000) * 13) % 50})
    expected = data.groupby("shop").agg(revenue=("amount", "sum"), n=("amount", "count")).reset_index()
    pd.testing.assert_frame_equal(got[["shop", "revenue", "n"]], expected, check_dtype=False)


def test_a_stream_sql_cell_exports_as_its_query_over_the_views_registered_before_it(tmp_path):
    path = notebook(tmp_path,
                    "%load_ext kernel_runtime",
                    "import pandas as pd\nfrom kernel_runtime import create_temporary_view\nUNUSED = 1",
                    "def orders(seq):\n    return pd.DataFrame({'city': seq % 3, 'amount': seq % 10})",
                    "create_temporary_view('orders', lambda env: env.from_generator(orders, count=90))",
                    ("create_temporary_view('scratch', lambda env: env.from_generator(count=1))", ["skip-export"]),
                    "%%stream_sql --explain\nSELECT city, count(*) AS n FROM orders GROUP BY city",
                    "%%stream_sql --name 'per city' -p 2\nSELECT city, sum(amount) AS total\nFROM orders GROUP BY city")
    (package, directory), = export_notebook(path, tmp_path / "out")
    script = script_of(directory)
    assert package.name == "per city"
    assert "env.create_temporary_view('orders', lambda env: env.from_generator(orders, count=90))" in script
    assert "env.sql_query('SELECT city, sum(amount) AS total\\nFROM orders GROUP BY city', name='per city')" \
           ".collect('per city')" in script, script
    assert "scratch" not in script and "UNUSED" not in script and "def orders" in script
    assert yaml.safe_load((directory / "config.yaml").read_text())["parallelism.default"] == 2


def test_nexmark_views_export_onto_the_jobs_environment(tmp_path):
    path = notebook(tmp_path,
                    "%load_ext kernel_runtime",
                    "from kernel_runtime.api import NexmarkSource\nNexmarkSource.create_views(events=5_000, seed=3)",
                    "%%stream_sql --name 'hot auctions'\nSELECT auction, price FROM bid WHERE MOD(auction, 123) = 0")
    (package, directory), = export_notebook(path, tmp_path / "out")
    script = script_of(directory)
    assert "from kernel_runtime.api import NexmarkSource" in script
    assert "NexmarkSource.create_views(events=5000, seed=3, env=env)" in script, script
