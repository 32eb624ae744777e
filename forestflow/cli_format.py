"""Human output of the ``forestflow`` command line: aligned tables, durations, percentages, counts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds of ``90``, ``90s``, ``10m``, ``1h30m``, ``2d``; ValueError with the reason otherwise."""
    text = text.strip().lower()
    if text.isdigit():
        return int(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 1h30m)")
    return round(sum(float(n) * _UNIT_S[u] for n, u in parts))


def duration(seconds: float) -> str:
    """``0.4s``, ``45s``, ``10m``, ``1h 5m``, ``2d 3h``: the two largest units."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    out: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size or (unit == "s" and not out):
            out.append(f"{whole // size}{unit}")
            whole %= size
        if len(out) == 2:
            break
    return " ".join(out)


def percent(value: Any) -> str:
    """``100%``, ``57.3%``, ``0.04%``; ``-`` for no value. ``value`` is a fraction (0..1)."""
    if value is None:
        return "-"
    pct = float(value) * 100
    if pct == round(pct):
        return f"{pct:.0f}%"
    return f"{pct:.1f}%" if abs(pct) >= 1 else f"{pct:.2g}%"


def count(value: Any) -> str:
    """An integer with thousands separators (``12,345``); ``-`` for no value."""
    return "-" if value is None else f"{int(value):,}"


def _numeric(text: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d,]*\.?\d+(e[-+]?\d+)?( ?(%|ms|s|/s))?", text))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns aligned under their headers; numbers right-aligned, everything else left-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    numeric = [bool(cells) and all(_numeric(row[i]) or row[i] == "-" for row in cells) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        out = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(out).rstrip()

    return "\n".join([line(list(headers)), *(line(row) for row in cells)])
