"""%%stream and %stream_cluster in a real IPython shell: arguments, and how errors are shown.

None of these cells gets far enough to need a cluster: the test checks that none was started.
"""
import pytest
from IPython.core.error import UsageError

from kernel_runtime.notebook.magic import StreamMagics
from kernel_runtime.export.magic_arguments import ClusterAddress, parse_cluster_args, parse_stream_args

from .conftest import run

PIPELINE = "env.from_generator(count=10).collect()\n"


def magics(shell) -> StreamMagics:
    return next(c for c in shell.configurables if isinstance(c, StreamMagics))


@pytest.fixture(autouse=True)
def no_cluster_started(shell):
    yield
    session = magics(shell)._session
    assert session is None or session.embedded is None


def test_every_option_is_parsed():
    args = parse_stream_args('--name "page views" -p 3 --checkpoint-interval "10 s" -d '
                             "--cluster 127.0.0.1:6123 -o views --mode update --max-rows 500")
    assert (args.name, args.parallelism, args.detached, args.output, args.mode, args.max_rows) == \
        ("page views", 3, True, "views", "update", 500)
    assert args.job_config() == {"execution.checkpointing.interval": "10 s"}
    assert ClusterAddress.parse(args.cluster) == ClusterAddress(rpc_address="tcp://127.0.0.1:6123")
    assert ClusterAddress.parse("~/.streamlab/cluster") == ClusterAddress(directory="~/.streamlab/cluster")
    assert (parse_stream_args("--restart").restart, parse_stream_args("--allow-non-restored-state")
            .allow_non_restored_state) == (True, True)
    assert parse_stream_args("--name x --dry-run").dry_run and not parse_stream_args("--name x").dry_run
    defaults = parse_stream_args("")
    assert (defaults.mode, defaults.max_rows, defaults.detached, defaults.job_config()) == (None, 10_000, False, {})
    assert parse_cluster_args("start --taskmanagers 3 --slots 4") == (parse_cluster_args("start -t 3 -s 4"))


@pytest.mark.parametrize("line, message", [
    ("--mode upsert", "argument -m/--mode: invalid choice: 'upsert'"),
    ("-p 0", "--parallelism must be a positive integer, got 0"),
    ("-p two", "argument -p/--parallelism: invalid int value: 'two'"),
    ("--max-rows -5", "--max-rows must be a positive integer, got -5"),
    ("--checkpoint-interval soon", "--checkpoint-interval 'soon': expected a duration such as"),
    ("-o 2fast", "-o '2fast': not a Python variable name"),
    ("--cluster 127.0.0.1:99999", "--cluster 127.0.0.1:99999: port 99999 is not between 1 and 65535"),
    ("--name 'unclosed", "cannot split the arguments"),
    ("--frobnicate", "unrecognized arguments: --frobnicate"),
    ("--restart --allow-non-restored-state", "--restart starts without any state: --allow-non-restored-state goes "
                                             "with an upgrade"),
    ("--dry-run", "--dry-run previews the upgrade of the running job of a --name: give --name"),
    ("--name x --dry-run --restart", "--dry-run previews the upgrade of the running job of a --name"),
])
def test_argument_mistakes_are_usage_errors_naming_the_argument(shell, line, message):
    with pytest.raises(UsageError, match=None) as info:
        parse_stream_args(line)
    assert message in str(info.value)
    result, out = run(shell, f"%%stream {line}\n{PIPELINE}")
    assert isinstance(result.error_in_exec, UsageError)
    assert f"UsageError: {message}" in out and "Traceback" not in out


def test_stream_cluster_arguments(shell):
    with pytest.raises(UsageError, match="--taskmanagers and --slots go with 'start', not 'stop'"):
        parse_cluster_args("stop --slots 2")
    with pytest.raises(UsageError, match="invalid choice: 'restart'"):
        parse_cluster_args("restart")
    _, out = run(shell, "%stream_cluster status")
    assert "No cluster yet" in out


def test_help_shows_the_options(shell):
    doc = shell.find_cell_magic("stream").__doc__
    assert doc.lstrip(":\n ").startswith("%%stream [-n NAME] [-p PARALLELISM] [--checkpoint-interval T] [-d]")
    for option in ("--cluster ADDRESS", "-o VAR", "--mode MODE", "--max-rows N", "--detached"):
        assert option in doc
    assert "[-t TASKMANAGERS] [-s SLOTS]" in shell.find_line_magic("stream_cluster").__doc__


def test_a_pipeline_mistake_points_at_the_cell_line_without_a_traceback(shell):
    result, out = run(shell, "%%stream\n"
                             "events = env.from_generator(count=10)\n"
                             "\n"
                             "events.map_batches(lambda df: df, parallelism=0).collect()\n")
    cell = shell.execution_count  # run() does not count the cell in the history
    assert f"GraphValidationError: operator 'map_batches' (In [{cell}], line 4): parallelism must be a positive " \
           "integer" in out
    assert "Traceback" not in out and "magic.py" not in out
    assert type(result.error_in_exec).__name__ == "StreamCellError"


def test_a_mistake_in_a_function_of_an_earlier_cell_names_that_cell(shell):
    shell.run_cell("def add_slow_step(stream):\n"
                   "    return stream.map_batches(print, parallelism=-1)\n", store_history=True)
    earlier = shell.execution_count - 1
    _, out = run(shell, "%%stream\nadd_slow_step(env.from_generator(count=10)).collect()\n")
    assert f"operator 'map_batches' (In [{earlier}], line 2): parallelism must be a positive integer" in out


def test_a_pipeline_without_sink_is_reported(shell):
    _, out = run(shell, "%%stream\nenv.from_generator(count=10).key_by('seq').count()\n")
    assert "GraphValidationError: the pipeline has no sink: end it with .collect() or .print()" in out


def test_an_exception_in_the_body_shows_the_traceback_from_the_cell_on(shell):
    result, out = run(shell, "%%stream\n"
                             "rows = 10\n"
                             "env.from_generator(count=rows / undefined_name).collect()\n")
    assert isinstance(result.error_in_exec.__cause__, NameError)
    assert "----> 3 env.from_generator(count=rows / undefined_name).collect()" in out
    assert "NameError: name 'undefined_name' is not defined" in out
    assert "run_cell_magic" not in out and "magic.py" not in out and "exec(" not in out


def test_a_syntax_error_names_the_cell_line(shell):
    _, out = run(shell, "%%stream\nx = 1\nenv.from_generator(count=10).collect(\n")
    assert f"SyntaxError: '(' was never closed (In [{shell.execution_count}], line 3)" in out


def test_the_body_runs_in_the_user_namespace_with_a_fresh_env(shell):
    run(shell, "%%stream\nbuilt_here = env\n")  # fails for want of a sink, after the body ran
    assert type(shell.user_ns["built_here"]).__name__ == "StreamEnvironment"
    first = shell.user_ns["built_here"]
    run(shell, "%%stream\nbuilt_here = env\n")
    assert shell.user_ns["built_here"] is not first


def test_a_cluster_directory_without_a_cluster_is_an_error_without_traceback(shell, tmp_path):
    _, out = run(shell, f"%%stream --cluster {tmp_path}\n{PIPELINE}")
    assert f"ClusterNotRunning: no cluster is running in {tmp_path}" in out and "Traceback" not in out
    _, out = run(shell, f"%%stream --cluster 127.0.0.1:1\n{PIPELINE}")
    assert "ClusterNotRunning: no running cluster known at tcp://127.0.0.1:1" in out
    assert "use --cluster DIR" in out


VIEW = ("from kernel_runtime import create_temporary_view\n"
        "import pandas as pd\n"
        "create_temporary_view('clicks', lambda env: env.from_generator(\n"
        "    lambda s: pd.DataFrame({'page': s % 5, 'ms': s * 10}), count=100))\n")


def test_stream_sql_explains_a_query_over_a_view_without_running_it(shell, spark):
    shell.run_cell(VIEW)
    _, out = run(shell, "%%stream_sql --explain\nSELECT page, count(*) AS n, max(ms) AS last FROM clicks GROUP BY page\n")
    assert "keyed state by page: count(__sql_arg0), max(__sql_arg1) merged across batches" in out, out
    assert "SELECT clicks.page AS `page`, 1 AS `__sql_arg0`, clicks.ms AS `__sql_arg1` FROM input AS `clicks`" in out
    assert "output: an upsert stream keyed by page" in out


def test_stream_sql_refuses_a_clause_at_its_cell_line(shell, spark):
    shell.run_cell(VIEW)
    result, out = run(shell, "%%stream_sql -n top\nSELECT page, count(*) AS n\nFROM clicks\nGROUP BY page\nORDER BY n\n")
    cell = shell.execution_count
    assert f"operator 'top' (In [{cell}], line 2): 'ORDER BY n' (line 4 of the query): a stream has no last row" \
           in out, out
    assert "Traceback" not in out and type(result.error_in_exec).__name__ == "StreamCellError"
    _, out = run(shell, "%%stream_sql\nSELECT * FROM clickz\n")
    assert "the query reads clickz, and no temporary view of that name exists (views: clicks" in out, out
