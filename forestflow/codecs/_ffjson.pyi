"""Types of the C extension forestflow/codecs/_ffjson.c (its docstrings say what each call does)."""

from typing import Any

import numpy as np

def score_request(body: bytes | bytearray | memoryview, /) -> tuple[dict[str, np.ndarray], dict[str, str] | None] | None: ...
def v2_request(body: bytes | bytearray | memoryview, /) -> dict[str, Any] | None: ...
