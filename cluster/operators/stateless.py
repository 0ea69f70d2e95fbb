"""Stateless record-batch operators that need no Spark: map_batches and filter (pandas)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from cluster.operators.base import Operator, UserFunctionError
from cluster.common.frames import table_to_frame, to_table


class MapBatches(Operator, kind="map-batches"):
    """udf: fn(pandas.DataFrame) -> pandas.DataFrame."""

    def process(self, table: pa.Table) -> list[pa.Table]:
        result = self.call_user(table_to_frame(table))
        return [to_table(result, f"{self.spec.where()}: the function")]


class Filter(Operator, kind="filter"):
    """udf: fn(pandas.DataFrame) -> boolean mask (Series or array) of the same length."""

    def process(self, table: pa.Table) -> list[pa.Table]:
        mask = self.call_user(table_to_frame(table))
        if isinstance(mask, pd.Series):
            mask = mask.to_numpy()
        mask = np.asarray(mask)
        if mask.dtype != bool or mask.shape != (table.num_rows,):
            raise UserFunctionError(
                f"{self.spec.where()}: the predicate must return one boolean per row "
                f"({table.num_rows}), got dtype {mask.dtype} and shape {mask.shape}")
        return [table.filter(pa.array(mask))]
