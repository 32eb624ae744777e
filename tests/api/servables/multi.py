"""Test servable with three inputs: a vector, a scalar and a string per record.

SCALED = INPUT0 * SCALE (FP32 [-1, 4]); LABEL = "<TAG>:<sum of SCALED>" (BYTES [-1]).
"""

import numpy as np

from forestflow.core.frame import Frame

METADATA = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "SCALE", "datatype": "FP64", "shape": [-1]},
        {"name": "TAG", "datatype": "BYTES", "shape": [-1]},
    ],
    "outputs": [
        {"name": "SCALED", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "LABEL", "datatype": "BYTES", "shape": [-1]},
    ],
}


def predict(frame: Frame) -> Frame:
    x, scale, tag = frame["INPUT0"], frame["SCALE"], frame["TAG"]
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != 4:
        raise ValueError(f"INPUT0 must be float32 [N, 4], got {x.dtype} {list(x.shape)}")
    if scale.ndim != 1 or tag.ndim != 1:
        raise ValueError(f"SCALE and TAG must be one value per row, got {list(scale.shape)} and {list(tag.shape)}")
    scaled = (x * scale.astype(np.float32)[:, None]).astype(np.float32)
    tags = [t.decode() if isinstance(t, bytes) else str(t) for t in tag]
    label = np.array([f"{t}:{s:g}" for t, s in zip(tags, scaled.sum(axis=1))], dtype=object)
    return Frame({"SCALED": scaled, "LABEL": label})
