"""table_to_numpy: the report phase's numpy view of a run's Arrow tables."""

import numpy as np
import pyarrow as pa

from bench.evidence.figures import table_to_numpy


def test_string_rows_share_one_object_per_value_and_keep_nulls_and_numbers():
    t = pa.table(
        {
            "source": pa.chunked_array([["chunk", "none"], ["chunk", None, "chunk"]]),
            "t": pa.array([0.0, 0.1, 0.2, 0.3, 0.4]),
            "robot": pa.array([1, 1, 2, 2, 2], pa.int32()),
        }
    )
    out = table_to_numpy(t)
    src = out["source"]
    assert src.dtype == object and list(src) == ["chunk", "none", "chunk", None, "chunk"]
    assert src[0] is src[2] is src[4]  # one str for every "chunk" row, not one per row
    assert (src == "chunk").tolist() == [True, False, True, False, True]
    assert out["t"].dtype == np.float64 and out["robot"].dtype == np.int32 and out["robot"].tolist() == [1, 1, 2, 2, 2]
    assert table_to_numpy(pa.table({"s": pa.array([], pa.string())}))["s"].size == 0
