"""Test model: doubles ``x`` row by row; a ``block`` label holds the call until the test opens the
gate; a ``bad`` label fails the whole call. ``Model`` lets concurrent requests share calls."""

from __future__ import annotations

from typing import Any

from forestflow.core.frame import Frame
from tests.api import batch_gate


class Unbatched:
    """Scores each call as it comes (no ``batchable``: never given several requests at once)."""

    def predict(self, frame: Frame) -> dict[str, Any]:
        labels = [str(v) for v in frame["label"]]
        batch_gate.ROWS_PER_CALL.append(frame.num_rows)
        if "block" in labels:
            assert batch_gate.GATE.wait(10), "test gate never opened"
        if "bad" in labels:
            raise ValueError("a bad row, on purpose")
        return {"label": frame["label"], "y": frame["x"] * 2}


class Model(Unbatched):
    """The same model, opted in to micro-batching."""

    batchable = True
