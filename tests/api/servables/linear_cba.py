"""Test servable: the linear servable with its inputs declared in the other order (c, b, a)."""

import numpy as np

from forestflow.core.frame import Frame

METADATA = {
    "inputs": [{"name": "c", "datatype": "FP64"}, {"name": "b", "datatype": "FP64"}, {"name": "a", "datatype": "FP64"}],
    "outputs": [{"name": "y", "datatype": "FP64"}, {"name": "pair", "datatype": "FP64", "shape": [-1, 2]}],
}


def predict(frame: Frame) -> Frame:
    a, b, c = (np.asarray(frame[n], dtype=np.float64) for n in ("a", "b", "c"))
    y = a + 2 * b + 3 * c
    return Frame({"y": y, "pair": np.stack([a, y], axis=1)})
