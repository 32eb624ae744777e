"""KernelSHAP (Lundberg & Lee 2017) for any servable: Shapley values against a background sample.

A coalition ``z`` of the explained columns is valued as the model's mean output over the background
rows with the columns in ``z`` taken from the explained row: ``v(z) = mean_b f(x_z, b_not z)``. The
values are the weighted least-squares fit of ``v`` under the Shapley kernel, constrained so that
they sum to ``f(x) - v(empty)``: exactly the Shapley values of ``v`` when every coalition is
enumerated (done whenever ``2^F - 2`` fits in ``samples``), an estimate from ``samples`` paired
coalitions drawn from the kernel otherwise (the generator is seeded: the same request gets the same
values). Every coalition of every explained row is scored in ONE call of the model.

Numeric outputs are explained, each column (or each column of a 2-D output) a group; the bias of a
group is ``v(empty)``, the mean output over the background.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from forestflow.core.frame import Frame
from forestflow.errors import CreateServableRequestInvalidError, InvalidInput


def read_background(source: str | list[dict[str, Any]], directory: Path, max_rows: int) -> Frame:
    """The background rows: a CSV file (header = column names) in the servable directory, or records."""
    if isinstance(source, str):
        base = directory.resolve()
        path = (base / source).resolve()
        if not path.is_relative_to(base) or not path.is_file():
            raise CreateServableRequestInvalidError(f"explainer background {source!r} is not a file in the servable directory")
        with path.open(newline="") as fh:
            records: list[dict[str, Any]] = list(csv.DictReader(fh))
    else:
        records = source
    if not records:
        raise CreateServableRequestInvalidError("the explainer's background has no rows")
    if len(records) > max_rows:
        raise CreateServableRequestInvalidError(
            f"the explainer's background has {len(records)} rows, over kernel_shap_max_background = {max_rows}"
        )
    names = list(records[0])
    columns: dict[str, np.ndarray] = {}
    for name in names:
        cells = [r.get(name) for r in records]
        try:
            columns[name] = np.array([np.nan if c in (None, "") else float(c) for c in cells], dtype=np.float64)
        except (TypeError, ValueError):
            columns[name] = np.array([None if c in (None, "") else str(c) for c in cells], dtype=object)
    return Frame(columns)


def _kernel_weight(f: int, k: int) -> float:
    return (f - 1) / (math.comb(f, k) * k * (f - k))


def coalitions(f: int, samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(masks [m, f] bool, weights [m])``: every proper coalition when they fit, else paired samples."""
    if f <= 1:
        return np.zeros((0, f), dtype=bool), np.zeros(0)
    if 2**f - 2 <= samples:
        masks = np.array([m for k in range(1, f) for m in _subsets(f, k)], dtype=bool)
        return masks, np.array([_kernel_weight(f, int(m.sum())) for m in masks])
    sizes = np.arange(1, f)
    p = np.array([_kernel_weight(f, int(k)) * math.comb(f, int(k)) for k in sizes])
    half = max(1, samples // 2)
    drawn = rng.choice(sizes, size=half, p=p / p.sum())
    masks = np.zeros((2 * half, f), dtype=bool)
    for i, k in enumerate(drawn):
        chosen = rng.choice(f, size=int(k), replace=False)
        masks[2 * i, chosen] = True
        masks[2 * i + 1] = ~masks[2 * i]  # its complement: paired sampling halves the variance
    return masks, np.ones(len(masks))


def _subsets(f: int, k: int) -> list[list[bool]]:
    return [[i in s for i in range(f)] for s in itertools.combinations(range(f), k)]


def numeric_outputs(frame: Frame) -> tuple[np.ndarray, list[str]]:
    """``([rows, groups] float64, group names)``: every numeric output column (2-D ones per column)."""
    parts, names = [], []
    for name, column in frame.columns.items():
        if column.dtype.kind not in "fiub":
            continue
        values = column.astype(np.float64).reshape(len(column), -1)
        parts.append(values)
        names += [name] if values.shape[1] == 1 else [f"{name}[{j}]" for j in range(values.shape[1])]
    if not parts:
        raise InvalidInput("the model answers no numeric output to explain")
    return np.concatenate(parts, axis=1), names


class KernelExplainer:
    """KernelSHAP for one release: its background, how many coalitions to value per row, and the most
    rows one explanation may have the model score (``max_rows``: the gateway's batch limit)."""

    def __init__(self, background: Frame, samples: int, max_rows: int = 1_000_000) -> None:
        self.background = background
        self.samples = samples
        self.max_rows = max_rows
        self.features = list(background.columns)
        #: The model's mean output over the background (every row's bias), set by :meth:`prepare`.
        self.background_mean: np.ndarray | None = None

    def describe(self) -> dict[str, Any]:
        """What ``/metadata`` says about it."""
        return {"method": "KernelSHAP", "backgroundRows": self.background.num_rows, "samples": self.samples}

    def design(self, frame: Frame) -> tuple[Frame, np.ndarray, np.ndarray]:
        """The frame to score (each row, then each coalition of it over every background row) and the
        coalitions with their weights."""
        missing = [name for name in self.features if name not in frame.columns]
        if missing:
            raise InvalidInput(f"KernelSHAP explains the columns {self.features}; the request lacks {missing}")
        n, f, b = frame.num_rows, len(self.features), self.background.num_rows
        masks, weights = coalitions(f, self.samples, np.random.default_rng(0))
        m = len(masks)
        # Row i's block: its own row once, then m coalitions x b background rows.
        block = 1 + m * b
        if n * block > self.max_rows:
            raise InvalidInput(
                f"explaining {n} records takes {n * block} model rows ({m} coalitions x {b} background rows each), "
                f"over the limit of {self.max_rows}: send fewer records"
            )
        keep = np.repeat(masks, b, axis=0)  # [m*b, f]: column j from the explained row?
        columns: dict[str, np.ndarray] = {}
        for j, name in enumerate(self.features):
            x = frame.columns[name]
            if x.ndim != 1:
                raise InvalidInput(f"KernelSHAP explains 1-D columns; {name!r} has shape {x.shape}")
            bg = self.background.columns[name]
            dtype = np.result_type(x.dtype, bg.dtype) if x.dtype != object and bg.dtype != object else object
            out = np.empty(n * block, dtype=dtype)
            tiled_bg = np.tile(bg, m)
            for i in range(n):
                start = i * block
                out[start] = x[i]
                out[start + 1 : start + block] = np.where(keep[:, j], x[i], tiled_bg)
            columns[name] = out
        for name, column in frame.columns.items():  # other inputs ride along as the row has them
            if name not in columns:
                columns[name] = np.repeat(column, block, axis=0)
        return Frame(columns, dict(frame.parameters)), masks, weights

    def solve(self, outputs: np.ndarray, n: int, masks: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """``[n, groups, f + 1]`` from the design's outputs ``[n * block, groups]``."""
        f, b, m = len(self.features), self.background.num_rows, len(masks)
        groups = outputs.shape[1]
        per_row = outputs.reshape(n, 1 + m * b, groups)
        full = per_row[:, 0]  # f(x)
        v = per_row[:, 1:].reshape(n, m, b, groups).mean(axis=2)  # v(z)
        out = np.zeros((n, groups, f + 1))
        if f == 0:
            out[:, :, 0] = full
            return out
        if self.background_mean is None or self.background_mean.shape != (groups,):
            raise RuntimeError("KernelExplainer.prepare() was not called with this model")
        empty = self.background_mean
        out[:, :, -1] = empty
        delta = full - empty  # [n, groups]: what the values must add up to
        if f == 1:
            out[:, :, 0] = delta
            return out
        # Eliminate the last column with the sum constraint, then weighted least squares.
        zl = masks[:, -1:].astype(np.float64)
        a = masks[:, :-1].astype(np.float64) - zl  # [m, f-1]
        sw = np.sqrt(weights)[:, None]
        for i in range(n):
            y = v[i] - empty - zl * delta[i]  # [m, groups]
            coef, *_ = np.linalg.lstsq(a * sw, y * sw, rcond=None)  # [f-1, groups]
            out[i, :, :-2] = coef.T
            out[i, :, -2] = delta[i] - coef.sum(axis=0)
        return out

    def prepare(self, predict: Callable[[Frame], Frame]) -> None:
        """Score the background once (its mean output is every row's bias)."""
        outputs, _ = numeric_outputs(predict(self.background))
        self.background_mean = outputs.mean(axis=0)

    def explain(self, frame: Frame, predict: Callable[[Frame], Frame]) -> tuple[Frame, np.ndarray, list[str]]:
        """``(the rows' own answer, values [n, groups, f + 1], group names)``, the model called once."""
        design, masks, weights = self.design(frame)
        return self.finish(frame.num_rows, predict(design), masks, weights)

    def finish(self, n: int, answer: Frame, masks: np.ndarray, weights: np.ndarray) -> tuple[Frame, np.ndarray, list[str]]:
        """The rows' own answer, the values and the group names from the model's answer to the design."""
        outputs, names = numeric_outputs(answer)
        rows = np.arange(n) * (1 + len(masks) * self.background.num_rows)
        own = Frame({name: column[rows] for name, column in answer.columns.items()}, answer.parameters)
        return own, self.solve(outputs, n, masks, weights), names


__all__ = ["KernelExplainer", "coalitions", "numeric_outputs", "read_background"]
