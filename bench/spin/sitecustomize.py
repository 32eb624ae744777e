"""A known cost for calibrating bench/logging_cost.py: imported by a bench gateway started with this
directory on PYTHONPATH, it makes every scored request of a release whose logging settings name the
key feature ``spin`` busy-wait ``BENCH_SPIN_US`` microseconds (in ``Gateway._log_outcome``, which runs
once per answer whatever the log level). The calibration starts both gateways of its pair with it
and PUTs that key feature on one of them per round (a crossover, as the logging cells). Nothing
outside ``bench/logging_cost.py --calibrate-us`` puts it on a path."""

from __future__ import annotations

import os
import time
from typing import Any

_SPIN_S = float(os.environ.get("BENCH_SPIN_US", "0")) / 1e6
#: The key feature that turns the spin on for a release (a NONE release logs nothing, keys or not).
SPIN_FEATURE = "spin"

if _SPIN_S > 0:
    from forestflow import service

    _log_outcome = service.Gateway._log_outcome

    def _spinning(self: Any, entry: Any, *args: Any, **kwargs: Any) -> Any:
        if SPIN_FEATURE in entry.settings.logging.key_features:
            until = time.perf_counter() + _SPIN_S
            while time.perf_counter() < until:
                pass
        return _log_outcome(self, entry, *args, **kwargs)

    service.Gateway._log_outcome = _spinning  # type: ignore[method-assign]  # the calibration's known cost
