"""Test servable whose code fails on purpose, chosen by the ``label`` of the first row.

``value`` / ``key`` / ``type`` raise ValueError / KeyError / TypeError; ``short`` answers one row
fewer than asked; anything else doubles ``x``.
"""

import numpy as np

from forestflow.core.frame import Frame

METADATA = {
    "inputs": [{"name": "label", "datatype": "BYTES"}, {"name": "x", "datatype": "FP64"}],
    "outputs": [{"name": "double", "datatype": "FP64"}],
}

_RAISES = {"value": ValueError, "key": KeyError, "type": TypeError}


def predict(frame: Frame) -> Frame:
    first = frame["label"][0]
    first = first.decode() if isinstance(first, bytes) else str(first)
    if first in _RAISES:
        raise _RAISES[first](f"model code failed on purpose ({first})")
    double = np.asarray(frame["x"], dtype=np.float64) * 2
    if first == "short":
        double = double[:-1]
    return Frame({"double": double})
