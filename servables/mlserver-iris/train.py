"""Trains the iris model MLServer serves in docs/remote.md and the RemoteV2 tests.

    .venv-mlserver/bin/python servables/mlserver-iris/train.py DEST

writes into DEST (made if missing) what ``mlserver start`` loads: ``model.joblib`` (a scikit-learn
LogisticRegression on the iris data set scikit-learn ships, dumped with joblib by the interpreter
that will load it, so the versions match) and this directory's ``model-settings.json``; and
``weights.json``, the model's coefficients, from which the tests' local twin of the model scores.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import joblib
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

HERE = Path(__file__).resolve().parent


def main(dest: Path) -> None:
    """Train, then write the three files into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    features, labels = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=1000).fit(features, labels)
    joblib.dump(model, dest / "model.joblib")
    shutil.copyfile(HERE / "model-settings.json", dest / "model-settings.json")
    weights = {"coef": model.coef_.tolist(), "intercept": model.intercept_.tolist()}
    (dest / "weights.json").write_text(json.dumps(weights))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
