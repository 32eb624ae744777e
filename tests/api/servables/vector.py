"""Test servable with one vector input: INPUT0 FP32 [-1, 4] -> OUTPUT0 FP32 [-1, 2] = (row sum, row max)."""

import numpy as np

from forestflow.core.frame import Frame

METADATA = {
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 2]}],
}


def predict(frame: Frame) -> Frame:
    x = frame["INPUT0"]
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != 4:  # the front-end must hand over [N, 4] FP32
        raise ValueError(f"INPUT0 must be float32 [N, 4], got {x.dtype} {list(x.shape)}")
    return Frame({"OUTPUT0": np.stack([x.sum(axis=1), x.max(axis=1)], axis=1)})
