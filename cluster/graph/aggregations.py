"""The aggregate functions a job graph may name (``aggregate(out=(column, function))``): what the
client checks a pipeline against; cluster.operators.aggregates computes them.

Thread use: any thread (constants).
"""

AGGREGATE_FUNCTIONS = ("sum", "count", "min", "max", "mean", "nunique", "sum_distinct", "mean_distinct",
                       "first", "last", "first_row", "last_row", "collect_list", "collect_set",
                       "var", "var_pop", "std", "std_pop")

# a window's state is merged by numpy and Arrow: numbers only
WINDOW_AGGREGATE_FUNCTIONS = ("sum", "count", "min", "max", "mean")
