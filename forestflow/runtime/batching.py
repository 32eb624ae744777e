"""A servable's micro-batching settings: ``maxBatchRows`` and ``maxBatchWaitUs`` from its flavor
settings (camel or snake case), the gateway's ``max_batch_rows`` / ``max_batch_wait_us`` otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forestflow.errors import CreateServableRequestInvalidError

#: The flavor settings read here (flavors that refuse unknown settings accept these).
BATCH_SETTINGS = ("maxBatchRows", "max_batch_rows", "maxBatchWaitUs", "max_batch_wait_us")
#: A batch wait longer than this would be a latency bug, not a tuning choice.
_MAX_WAIT_US = 1_000_000


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How one servable's concurrent requests may share model calls."""

    #: Most rows in one combined call (0 or 1: requests are never combined).
    max_rows: int
    #: How long an unfilled batch may wait for more while other work scores (0: never waits).
    wait_us: int


def _setting(settings: Mapping[str, Any], camel: str, snake: str, default: int, upper: int, what: str) -> int:
    if camel in settings and snake in settings:
        raise CreateServableRequestInvalidError(f"flavor settings: give {camel} or {snake}, not both")
    key = camel if camel in settings else snake
    value = settings.get(key, default)
    if type(value) is not int or not 0 <= value <= upper:
        raise CreateServableRequestInvalidError(f"flavor setting {key}: expected an integer 0..{upper} ({what}), got {value!r}")
    return value


def batch_policy(flavor_settings: Mapping[str, Any], default_rows: int, default_wait_us: int) -> BatchPolicy:
    """The servable's policy; a bad value is a 422 naming the setting."""
    rows = _setting(flavor_settings, "maxBatchRows", "max_batch_rows", default_rows, 1 << 31, "0 or 1 = no batching")
    wait = _setting(flavor_settings, "maxBatchWaitUs", "max_batch_wait_us", default_wait_us, _MAX_WAIT_US, "0 = never waits")
    return BatchPolicy(rows, wait)
