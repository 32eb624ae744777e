"""Which tier runs: the whole suite, or the quick tier (``pytest -m "not slow"``, the inner loop).

The quick tier runs a fifth of the hypothesis examples of the fuzz tests that use ``examples``; the whole
suite (CI, ``bash .ci/run``) runs every one of them.
"""

from __future__ import annotations

#: Set by tests/conftest.py (pytest_configure, before any test module is imported).
QUICK = False


def examples(n: int) -> int:
    """The whole suite's ``n`` hypothesis examples; in the quick tier a fifth of them (at least 20)."""
    return max(20, n // 5) if QUICK else n
