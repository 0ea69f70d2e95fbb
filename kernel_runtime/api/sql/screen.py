"""Whether a query may need more than one batch for its answer, from its text alone, so that a
query which only projects and filters never waits for Spark's analyser in the client.

Conservative: a query passes as per batch only if it has none of the words that start a clause
spanning rows (GROUP BY, DISTINCT, JOIN, ORDER BY, LIMIT, OVER, UNION, ...) and calls none of
Spark's aggregate functions; anything else is analysed. Words inside string literals, quoted
identifiers and comments do not count.
"""
from __future__ import annotations

import re

_CLAUSES = {"group", "distinct", "join", "order", "sort", "cluster", "distribute", "limit", "offset",
            "over", "window", "union", "intersect", "except", "minus", "having", "qualify", "tablesample",
            "lateral", "pivot", "unpivot", "with"}
# Spark 4.3's aggregate and window functions: the registry's AggregateFunction classes and those
# it rewrites into one (max_by, mode, try_avg, ...); tests/api/test_sql_screen.py checks the
# registry's against this list
AGGREGATE_FUNCTIONS = frozenset("""
any any_value approx_count_distinct approx_percentile approx_top_k approx_top_k_accumulate
approx_top_k_combine array_agg avg bit_and bit_or bit_xor bitmap_and_agg bitmap_construct_agg
bitmap_or_agg bool_and bool_or collect_list collect_set collect_union corr count count_if
count_min_sketch covar_pop covar_samp cume_dist dense_rank every first first_value grouping
grouping_id histogram_numeric hll_sketch_agg hll_union_agg kll_merge_agg_bigint kll_merge_agg_double
kll_merge_agg_float kll_sketch_agg_bigint kll_sketch_agg_double kll_sketch_agg_float kurtosis last
last_value listagg max max_by mean measure median min min_by mode nth_value ntile percent_rank
percentile percentile_approx percentile_cont percentile_disc rank regr_avgx regr_avgy regr_count
regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy row_number schema_of_variant_agg
skewness some std stddev stddev_pop stddev_samp string_agg sum theta_intersection_agg
theta_sketch_agg theta_union_agg try_avg try_sum tuple_intersection_agg_double
tuple_intersection_agg_integer var_pop var_samp variance vector_avg vector_sum
""".split())

_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`|--[^\n]*|/\*.*?\*/", re.DOTALL)
_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_CALL = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(")


def may_span_batches(query: str) -> bool:
    text = _QUOTED.sub(" ", query)
    if any(word.lower() in _CLAUSES for word in _WORD.findall(text)):
        return True
    return any(name.lower() in AGGREGATE_FUNCTIONS for name in _CALL.findall(text))
