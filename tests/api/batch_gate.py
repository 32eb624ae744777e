"""State shared by the test model servables/batching.py and test_micro_batching.py (one process):
a gate that holds calls scoring a ``block`` row, and the rows of every call."""

from __future__ import annotations

import threading

GATE = threading.Event()
ROWS_PER_CALL: list[int] = []


def reset() -> None:
    """Close the gate and forget the calls (each test starts from here)."""
    GATE.clear()
    ROWS_PER_CALL.clear()
