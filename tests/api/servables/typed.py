"""Test servable with small integer inputs: q INT8 [-1, 2] and u UINT8 [-1] -> total INT64 [-1] = q0 + q1 + u.

It checks the dtypes it is handed, so a front-end that let a value wrap (300 -> 44) still shows
in the answer's numbers, and one that handed another type over fails loudly."""

import numpy as np

from forestflow.core.frame import Frame

METADATA = {
    "inputs": [{"name": "q", "datatype": "INT8", "shape": [-1, 2]}, {"name": "u", "datatype": "UINT8", "shape": [-1]}],
    "outputs": [{"name": "total", "datatype": "INT64", "shape": [-1]}],
}


def predict(frame: Frame) -> Frame:
    q, u = frame["q"], frame["u"]
    if q.dtype != np.int8 or u.dtype != np.uint8:
        raise ValueError(f"q must be int8 and u uint8, got {q.dtype} and {u.dtype}")
    return Frame({"total": q.astype(np.int64).sum(axis=1) + u.astype(np.int64)})
