"""Test servable with UINT64 outputs: big = 2^64 - 1 - x (past Int64's range), fits = x."""

import numpy as np

from forestflow.core.frame import Frame

METADATA = {
    "inputs": [{"name": "x", "datatype": "FP64"}],
    "outputs": [{"name": "big", "datatype": "UINT64"}, {"name": "fits", "datatype": "UINT64"}],
}


def predict(frame: Frame) -> Frame:
    x = frame["x"].astype(np.uint64)
    return Frame({"big": np.uint64(2**64 - 1) - x, "fits": x})
