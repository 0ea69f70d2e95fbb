"""An unbounded job: page views per page, counted live and printed by the TaskManagers.

    streamlab run -d examples/live_counts.py     # prints the job id
    streamlab list
    streamlab cancel <job id>
"""
import pandas as pd

from kernel_runtime import StreamEnvironment

PAGES = ["home", "search", "cart", "checkout", "help"]


def page_views(seq):
    return pd.DataFrame({"page": [PAGES[i] for i in (seq * 31) % len(PAGES)], "seq": seq})


env = StreamEnvironment.get_execution_environment(parallelism=2)
env.from_generator(page_views, rate=200, batch_size=50, name="page views").key_by("page").count().print()
env.execute("live page counts")
