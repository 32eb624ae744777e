"""An example Python model for KernelSHAP (docs/explanations.md): score = 0.5 + 2*a - b + 0.25*c."""

import numpy as np

from forestflow.core.frame import Frame

METADATA = {
    "inputs": [{"name": n, "datatype": "FP64"} for n in ("a", "b", "c")],
    "outputs": [{"name": "score", "datatype": "FP64"}],
}


def predict(frame: Frame) -> Frame:
    a, b, c = (np.asarray(frame[n], dtype=np.float64) for n in ("a", "b", "c"))
    return Frame({"score": 0.5 + 2 * a - b + 0.25 * c})
