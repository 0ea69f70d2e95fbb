"""A job failing in a real kernel: `.wait()` raises one line naming the cell line, the notebook
shows the user's traceback without framework frames, and the dashboard header says the cause."""
import pytest

pytestmark = pytest.mark.timeout(240)

HELPER = """import pandas as pd

def enrich(df):
    df["total"] = df["amount"] * 2
    return df["nope"]
"""
STREAM = """%%stream -o job
events = env.from_generator(lambda seq: pd.DataFrame({"amount": seq}), count=100, batch_size=10)
events.map_batches(enrich, name="enrich").collect()
"""
FRAMEWORK = ("cluster/", "kernel_runtime/", "task.py", "client.py", "threading", "ipykernel_")


def test_wait_raises_the_root_cause_in_one_line_naming_the_cell_line(kernel):
    kernel.client.wait_for_ready(timeout=60)
    kernel.execute("%load_ext kernel_runtime")
    helper = kernel.execute(HELPER)["content"]["execution_count"]
    stream = kernel.execute(STREAM)["content"]["execution_count"]
    kernel.cluster_dir = kernel.evaluate("str(job.client.cluster.cluster_dir)")
    # the cell as its prompt numbers it (IPython 9 already counts the next cell while one runs)
    assert kernel.evaluate("job.name") == f"cell {stream}"
    reply = kernel.client.execute_interactive("job.wait(120)", timeout=150, output_hook=lambda msg: None)
    content = reply["content"]
    assert (content["status"], content["ename"]) == ("error", "JobExecutionError"), content
    headline = f"KeyError: 'nope', in operator 'enrich' (In [{helper}], line 5)"
    assert content["evalue"] == headline
    shown = "\n".join(content["traceback"])  # what the notebook renders (_render_traceback_)
    assert headline in shown and "failed on TaskManager" in shown and "restart-strategy.type is none" in shown
    assert f"In [{helper}], line 5, in enrich\n    return df[\"nope\"]" in shown
    for name in FRAMEWORK:
        assert name not in shown, name

    header = kernel.evaluate("job.dashboard().status.header.value")
    cause = kernel.evaluate("job.dashboard().status.cause.value")
    assert 'data-state="FAILED"' in header and headline.replace("'", "&#x27;") in header
    assert "not restarted" not in header and "not restarted" in cause
    assert cause.count("<details") == 1 and f"In [{helper}], line 5, in enrich" in cause
    for name in FRAMEWORK:
        assert name not in header + cause, name
