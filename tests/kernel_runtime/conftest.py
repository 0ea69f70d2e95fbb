"""A real IPython shell with the extension loaded, shared by the magic tests."""
import pytest
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output


@pytest.fixture
def kernel():
    """A real kernel (its own process, as a notebook's) with Spark started lazily."""
    from .test_two_kernels import Kernel
    started = Kernel()
    yield started
    started.close()


@pytest.fixture(scope="session")
def shell():
    ip = start_ipython()
    # these tests start the embedded cluster when they mean to (test_magic checks none is started)
    ip.config.StreamMagics.start_at_load = False
    ip.run_line_magic("load_ext", "kernel_runtime")
    yield ip
    ip.run_line_magic("stream_cluster", "stop")


def run(shell, cell: str):
    """Run a cell as a user would; (result, everything it printed)."""
    with capture_output() as out:
        result = shell.run_cell(cell)
    return result, out.stdout + out.stderr
