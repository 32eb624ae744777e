"""Rows/s of ``H2OMojoServable.predict`` with the native and the JVM scorer, and genmodel's EasyPredict.

All run in the same process on the same rows (the prostate / iris data the h2o wheel ships,
cycled), for batches of 1, 10, 100 and 1,000 rows:

* **native** / **jvm**: ``predict(frame)`` on a Frame as the codecs build it (float64 arrays for
  numeric columns, object arrays of strings for categoricals), input mapping and output columns
  included; scored by the C kernel (``h2o_native``, ``_h2o_trees.c``) or by one Java call per batch (JPype).
* **score0 native** / **score0 jvm**: the two scorers alone on the already encoded matrix.
* **easypredict**: what ForestFlow did, driven from Python through JPype: per row a ``RowData``
  (strings for categoricals, Doubles for numbers), ``wrapper.predict``, then the label and class
  probabilities (or value) read back.

Run: ``.venv/bin/python bench/h2o_scoring.py [--seconds 0.25] [--clock wall|cpu]``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.runtime import jvm
from forestflow.runtime.h2o_inputs import build_matrix
from forestflow.runtime.h2o_mojo import H2OMojoServable

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "h2o"
BATCHES = (1, 10, 100, 1000)
MODELS = {  # fixture -> data set it was trained on
    "prostate_gbm_binomial": "prostate",
    "iris_gbm_multinomial": "iris",
    "prostate_drf_regression": "prostate",
}


def data_rows(dataset: str) -> list[dict[str, str]]:
    """The shipped CSV as text rows (iris gets the fixtures' derived SepalSize column)."""
    spec = importlib.util.find_spec("h2o")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "h2o_data" / f"{dataset}.csv"
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if dataset == "iris":
        for r in rows:
            length = float(r["Sepal.Length"])
            r["SepalSize"] = "small" if length < 5.4 else ("medium" if length < 6.3 else "large")
    return rows


def frame_of(servable: H2OMojoServable, rows: list[dict[str, str]]) -> Frame:
    """A Frame as a codec would build it: float64 numerics, object arrays of strings."""
    columns = {}
    for spec in servable.metadata().inputs:
        if spec.datatype == "FP64":
            columns[spec.name] = np.array([float(r[spec.name]) for r in rows])
        else:
            columns[spec.name] = np.array([r[spec.name] for r in rows], dtype=object)
    return Frame(columns)


def easypredict_scorer(servable: H2OMojoServable) -> Callable[[list[dict[str, Any]]], list[Any]]:
    """ForestFlow's path: one RowData and one EasyPredictModelWrapper.predict per row."""
    config = jvm.jclass("hex.genmodel.easy.EasyPredictModelWrapper$Config")().setModel(servable._model)
    config.setConvertUnknownCategoricalLevelsToNa(True).setConvertInvalidNumbersToNa(True)
    wrapper = jvm.jclass("hex.genmodel.easy.EasyPredictModelWrapper")(config)
    row_data = jvm.jclass("hex.genmodel.easy.RowData")
    category = servable.metadata().extra["category"]

    def score(rows: list[dict[str, Any]]) -> list[Any]:
        out = []
        for row in rows:
            data = row_data()
            for key, value in row.items():
                data.put(key, value)
            p = wrapper.predict(data)
            if category == "Regression":
                out.append(float(p.value))
            else:
                out.append((str(p.label), list(p.classProbabilities)))
        return out

    return score


def typed_rows(servable: H2OMojoServable, rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Rows for RowData: strings for categoricals, floats (-> java.lang.Double) for numerics."""
    numeric = {s.name for s in servable.metadata().inputs if s.datatype == "FP64"}
    names = [s.name for s in servable.metadata().inputs]
    return [{n: float(r[n]) if n in numeric else r[n] for n in names} for r in rows]


#: The clock rounds are timed with: wall time, or this thread's CPU time (``--clock cpu``: steadier
#: when other work shares the machine; the JVM's JIT and GC threads are then not counted).
CLOCK = time.perf_counter


def rates(fns: dict[str, Callable[[], Any]], rows: int, seconds: float, rounds: int = 7) -> dict[str, float]:
    """Median rows/s of each function over alternating rounds of about ``seconds`` each.

    Alternating keeps the comparison fair on a shared machine whose load drifts; one warm-up
    round each first.
    """

    def round_rate(fn: Callable[[], Any]) -> float:
        calls, start = 0, CLOCK()
        while True:
            fn()
            calls += 1
            elapsed = CLOCK() - start
            if elapsed >= seconds:
                return calls * rows / elapsed

    for fn in fns.values():
        round_rate(fn)
    got: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            got[name].append(round_rate(fn))
    return {name: statistics.median(values) for name, values in got.items()}


def load(name: str, scorer: str) -> tuple[H2OMojoServable, float]:
    """A loaded servable of a fixture with the given scorer, and the seconds its load took."""
    servable = H2OMojoServable(FQRV(Contract("bench", "h2o", 1), name), FIXTURES, {"mojoPath": f"{name}.zip", "scorer": scorer})
    start = time.perf_counter()
    servable.load()
    return servable, time.perf_counter() - start


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.25, help="length of one timing round")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="time rounds by wall or thread CPU time")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    print(f"# rows/s by {args.clock} clock")
    print(
        f"{'model':<24} {'batch':>5} {'native rows/s':>14} {'jvm rows/s':>11} {'easypredict':>12} "
        f"{'native/jvm':>10} {'score0 native':>14} {'score0 jvm':>11} {'ratio':>6}"
    )
    loads = []
    for name, dataset in MODELS.items():
        native, native_load = load(name, "native")
        servable, jvm_load = load(name, "jvm")
        loads.append(f"{name}: native {native_load * 1000:.0f} ms, jvm {jvm_load * 1000:.0f} ms")
        source = data_rows(dataset)
        easy = easypredict_scorer(servable)
        for n in BATCHES:
            rows = [source[i % len(source)] for i in range(n)]
            frame, typed = frame_of(servable, rows), typed_rows(servable, rows)
            # Same answers from every path before timing them.
            first = easy(typed[:1])[0]
            for s in (servable, native):
                got = s.predict(frame.slice(0, 1))
                assert (got["predict"][0] == first) if isinstance(first, float) else (got["predict"][0] == first[0])
            flavor = rates(
                {
                    "native": lambda native=native, frame=frame: native.predict(frame),
                    "jvm": lambda servable=servable, frame=frame: servable.predict(frame),
                    "easy": lambda easy=easy, typed=typed: easy(typed),
                },
                n,
                args.seconds,
            )
            # The scorers alone, on the encoded matrix (input mapping and output columns left out).
            X, _, _ = build_matrix(frame, servable._columns, None)
            model, size = servable._model, servable._preds_size
            raw = rates(
                {
                    "native": lambda native=native, X=X: native._native.score(X),
                    "jvm": lambda model=model, X=X, size=size: jvm.score_batch(model, X, None, size),
                },
                n,
                args.seconds,
            )
            print(
                f"{name:<24} {n:>5} {flavor['native']:>14,.0f} {flavor['jvm']:>11,.0f} {flavor['easy']:>12,.0f} "
                f"{flavor['native'] / flavor['jvm']:>9.1f}x {raw['native']:>14,.0f} {raw['jvm']:>11,.0f} "
                f"{raw['native'] / raw['jvm']:>5.1f}x"
            )
    print("# load (read + warm-up) per model:")
    for line in loads:
        print("#   " + line)


if __name__ == "__main__":
    main()
