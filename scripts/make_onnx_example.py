"""Make the ONNX example: a scikit-learn logistic regression on the iris data set, exported with skl2onnx.

    python scripts/make_onnx_example.py              # writes servables/iris-onnx/model.onnx
    python scripts/make_onnx_example.py --out DIR    # elsewhere

The model reads one float input ``[N, 4]`` whose columns are named by the ``feature_names`` metadata
prop (the fields of servables/iris-score.json), and answers the species as a label and one
probability per class. Needs the ``test`` extra (scikit-learn, skl2onnx).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

ROOT = Path(__file__).resolve().parent.parent
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def make(out_dir: Path) -> Path:
    """Train, export and write ``model.onnx`` into ``out_dir``; returns its path."""
    iris = load_iris()
    x = iris.data.astype(np.float32)
    y = np.array([str(iris.target_names[t]) for t in iris.target])
    model = LogisticRegression(max_iter=500).fit(x, y)
    onx = convert_sklearn(
        model, "iris", [("input", FloatTensorType([None, len(FEATURES)]))], target_opset={"": 17, "ai.onnx.ml": 3}
    )
    onx.metadata_props.add(key="feature_names", value=",".join(FEATURES))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    path.write_bytes(onx.SerializeToString())
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "servables" / "iris-onnx", help="directory of model.onnx")
    path = make(parser.parse_args().out)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
