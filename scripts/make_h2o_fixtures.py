"""Train small real H2O models, export them as MOJOs and record genmodel's own predictions.

Run with the project venv (needs ``h2o==3.46.0.11``, which still exports MOJOs, and Java)::

    .venv/bin/python scripts/make_h2o_fixtures.py [--out tests/fixtures/h2o]

For every model ``<name>`` it writes ``<name>.zip`` (the MOJO), ``<name>.json`` (category, input
columns with types and domains, output columns) and, for scorable categories,
``<name>.golden.csv``: input rows exactly as text (blank = missing) plus genmodel's predictions
for them, produced by ``EasyPredictModelWrapper`` (unknown levels and invalid numbers -> NA)
through JPype after the H2O cluster is shut down. Output cells are ``repr(float)``.

The training data is the ``prostate.csv`` / ``iris.csv`` the h2o wheel ships; the script blanks a
few cells (missing values) and adds a derived categorical column to iris, in CSV files it writes
to a temporary directory and imports with ``h2o.import_file`` (never through pandas).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import h2o

DATA = Path(h2o.__file__).parent / "h2o_data"
JAR = Path(h2o.__file__).parent / "backend" / "bin" / "h2o.jar"

PROSTATE_X = ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "VOL", "GLEASON"]
PROSTATE_FACTORS = ["CAPSULE", "RACE", "DPROS", "DCAPS"]
IRIS_X = ["Sepal.Length", "Sepal.Width", "Petal.Length", "Petal.Width", "SepalSize"]


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a CSV file, as text."""
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    """Write rows of text with a header."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def blank_cells(header: list[str], rows: list[list[str]], columns: list[str], rate: float, seed: int) -> list[list[str]]:
    """A copy of ``rows`` with about ``rate`` of the cells of ``columns`` made empty (missing)."""
    rng = random.Random(seed)
    idx = [header.index(c) for c in columns]
    out = []
    for row in rows:
        row = list(row)
        for i in idx:
            if rng.random() < rate:
                row[i] = ""
        out.append(row)
    return out


def sepal_size(length: str) -> str:
    """The derived categorical column for iris: sepal length binned into three levels."""
    value = float(length)
    return "small" if value < 5.4 else ("medium" if value < 6.3 else "large")


def dataset(name: str) -> tuple[list[str], list[list[str]]]:
    """A shipped data set as text, with the derived columns the fixtures use.

    prostate gets ``OFFSET`` (AGE / 100, for the offset models), ``PSA_LEVEL`` (PSA truncated
    to an integer, as a categorical of more than 32 levels) and ``MARK_NUM`` / ``MARK_CAT`` (a
    single value or missing); iris gets ``SepalSize``.
    """
    if name == "prostate":
        header, rows = read_csv(DATA / "prostate.csv")
        age, psa, capsule, ident = (header.index(c) for c in ("AGE", "PSA", "CAPSULE", "ID"))
        # MARK_NUM / MARK_CAT: one value or missing, so a tree can only split them NA-vs-rest.
        marks = ["1" if r[capsule] == "1" and int(r[ident]) % 2 == 0 else "" for r in rows]
        return header + ["OFFSET", "PSA_LEVEL", "MARK_NUM", "MARK_CAT"], [
            r + [repr(float(r[age]) / 100), f"psa{int(float(r[psa]))}", m, "yes" if m else ""] for r, m in zip(rows, marks)
        ]
    header, rows = read_csv(DATA / "iris.csv")
    return header[:4] + ["SepalSize", header[4]], [r[:4] + [sepal_size(r[0]), r[4]] for r in rows]


def training_files(tmp: Path) -> dict[str, Path]:
    """Write the training CSVs (with blanked cells) and return their paths."""
    paths = {}
    for name, columns, seed in (("prostate", PROSTATE_X, 7), ("iris", IRIS_X, 11)):
        header, rows = dataset(name)
        paths[name] = tmp / f"{name}_train.csv"
        rows = blank_cells(header, rows, columns, 0.05, seed=seed)
        if name == "prostate":  # blanked in a pass of its own: the other columns stay as before
            rows = blank_cells(header, rows, ["PSA_LEVEL"], 0.05, seed=8)
        write_csv(paths[name], header, rows)
    return paths


def train_and_export(files: dict[str, Path], out: Path, only: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """Train every model (or those named in ``only``) on a local H2O cluster; export ``out/<name>.zip``."""
    from h2o.estimators import (
        H2ODeepLearningEstimator,
        H2OGeneralizedLinearEstimator,
        H2OGradientBoostingEstimator,
        H2OIsolationForestEstimator,
        H2OKMeansEstimator,
        H2OPrincipalComponentAnalysisEstimator,
        H2ORandomForestEstimator,
    )

    h2o.init(nthreads=2, max_mem_size="1G")
    try:
        prostate = h2o.import_file(
            str(files["prostate"]),
            col_types={c: "enum" for c in PROSTATE_FACTORS + ["PSA_LEVEL", "MARK_CAT"]} | {"MARK_NUM": "numeric"},
            destination_frame="prostate",
        )
        iris = h2o.import_file(str(files["iris"]), col_types={"SepalSize": "enum", "Species": "enum"}, destination_frame="iris")
        prostate["GLEASON_F"] = prostate["GLEASON"].asfactor()
        tree = {"ntrees": 25, "max_depth": 3, "seed": 42}
        specs: list[tuple[str, Any, list[str], str | None, Any]] = [
            ("prostate_gbm_binomial", H2OGradientBoostingEstimator(**tree), PROSTATE_X, "CAPSULE", prostate),
            ("iris_gbm_multinomial", H2OGradientBoostingEstimator(**tree), IRIS_X, "Species", iris),
            (
                "prostate_gbm_regression",
                H2OGradientBoostingEstimator(**tree),
                ["AGE", "RACE", "DPROS", "DCAPS", "VOL", "GLEASON"],
                "PSA",
                prostate,
            ),
            (
                "prostate_drf_regression",
                H2ORandomForestEstimator(ntrees=20, max_depth=4, seed=42),
                ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "GLEASON"],
                "VOL",
                prostate,
            ),
            (
                "prostate_glm_binomial",
                H2OGeneralizedLinearEstimator(family="binomial", lambda_=0.001, seed=42),
                PROSTATE_X,
                "CAPSULE",
                prostate,
            ),
            (
                "prostate_kmeans",
                H2OKMeansEstimator(k=3, seed=42, standardize=True, max_iterations=20),
                PROSTATE_X,
                None,
                prostate,
            ),
            (
                "prostate_isolation_forest",
                H2OIsolationForestEstimator(ntrees=25, max_depth=6, seed=42),
                PROSTATE_X,
                None,
                prostate,
            ),
            (
                "prostate_autoencoder",
                H2ODeepLearningEstimator(autoencoder=True, hidden=[3], epochs=5, seed=42, reproducible=True, activation="Tanh"),
                PROSTATE_X,
                None,
                prostate,
            ),
            (
                "prostate_pca",
                H2OPrincipalComponentAnalysisEstimator(
                    k=3, transform="standardize", pca_method="GramSVD", seed=42, impute_missing=True
                ),
                PROSTATE_X,
                None,
                prostate,
            ),
            # Categorical encoding other than AUTO: scored through EasyPredict's own encoder.
            (
                "prostate_gbm_onehot",
                H2OGradientBoostingEstimator(ntrees=20, max_depth=3, seed=42, categorical_encoding="one_hot_explicit"),
                PROSTATE_X,
                "CAPSULE",
                prostate,
            ),
            # A model trained with an offset column (the offset is an input at scoring time).
            (
                "prostate_glm_offset",
                H2OGeneralizedLinearEstimator(family="gaussian", offset_column="OFFSET", lambda_=0.001, seed=42),
                ["AGE", "RACE", "DPROS", "VOL", "GLEASON"],
                "PSA",
                prostate,
            ),
            # Only for the "unsupported category" test: an ordinal GLM (category Ordinal).
            (
                "prostate_glm_ordinal",
                H2OGeneralizedLinearEstimator(family="ordinal", lambda_=0.001, seed=42),
                ["AGE", "RACE", "PSA", "VOL"],
                "GLEASON_F",
                prostate,
            ),
            # Tree models for the native scorer (runtime/h2o_native.py): each covers a case of
            # genmodel's tree format or of its unifyPreds.
            # A categorical of more than 32 levels: bitsets in the large form (offset + length).
            (
                "prostate_gbm_highcard",
                H2OGradientBoostingEstimator(ntrees=20, max_depth=4, seed=42),
                ["AGE", "RACE", "DPROS", "DCAPS", "VOL", "GLEASON", "PSA_LEVEL"],
                "CAPSULE",
                prostate,
            ),
            (
                "prostate_gbm_multinomial4",
                H2OGradientBoostingEstimator(**tree),
                ["AGE", "RACE", "DCAPS", "PSA", "VOL", "GLEASON"],
                "DPROS",
                prostate,
            ),
            (
                "prostate_gbm_balanced",
                H2OGradientBoostingEstimator(balance_classes=True, **tree),
                PROSTATE_X,
                "CAPSULE",
                prostate,
            ),
            (
                "prostate_gbm_bernoulli_offset",
                H2OGradientBoostingEstimator(offset_column="OFFSET", **tree),
                ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "VOL", "GLEASON"],
                "CAPSULE",
                prostate,
            ),
            (
                "prostate_gbm_gaussian_offset",
                H2OGradientBoostingEstimator(offset_column="OFFSET", **tree),
                ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "GLEASON"],
                "VOL",
                prostate,
            ),
            (
                "prostate_gbm_poisson_offset",
                H2OGradientBoostingEstimator(distribution="poisson", offset_column="OFFSET", **tree),
                ["AGE", "RACE", "DPROS", "DCAPS", "VOL", "GLEASON"],
                "PSA",
                prostate,
            ),
            (
                "prostate_gbm_gamma",
                H2OGradientBoostingEstimator(distribution="gamma", **tree),
                ["AGE", "RACE", "DPROS", "DCAPS", "VOL", "GLEASON"],
                "PSA",
                prostate,
            ),
            (
                "prostate_gbm_tweedie",
                H2OGradientBoostingEstimator(distribution="tweedie", tweedie_power=1.5, **tree),
                ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "GLEASON"],
                "VOL",
                prostate,
            ),
            ("prostate_drf_binomial", H2ORandomForestEstimator(ntrees=20, max_depth=5, seed=42), PROSTATE_X, "CAPSULE", prostate),
            (
                "prostate_drf_binomial_double",
                H2ORandomForestEstimator(ntrees=20, max_depth=5, seed=42, binomial_double_trees=True),
                PROSTATE_X,
                "CAPSULE",
                prostate,
            ),
            ("iris_drf_multinomial", H2ORandomForestEstimator(ntrees=15, max_depth=4, seed=42), IRIS_X, "Species", iris),
            # The other GBM regression distributions (identity link).
            (
                "prostate_gbm_laplace",
                H2OGradientBoostingEstimator(distribution="laplace", ntrees=10, max_depth=3, seed=42),
                ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "GLEASON"],
                "VOL",
                prostate,
            ),
            (
                "prostate_gbm_quantile",
                H2OGradientBoostingEstimator(distribution="quantile", quantile_alpha=0.8, ntrees=10, max_depth=3, seed=42),
                ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "GLEASON"],
                "VOL",
                prostate,
            ),
            (
                "prostate_gbm_huber",
                H2OGradientBoostingEstimator(distribution="huber", ntrees=10, max_depth=3, seed=42),
                ["AGE", "RACE", "DPROS", "DCAPS", "PSA", "GLEASON"],
                "VOL",
                prostate,
            ),
            # The explanation benchmark's models (bench/explain.py): 50 trees, and 200 trees of depth 6.
            ("prostate_gbm_50", H2OGradientBoostingEstimator(ntrees=50, max_depth=5, seed=42), PROSTATE_X, "CAPSULE", prostate),
            (
                "prostate_gbm_200x6",
                H2OGradientBoostingEstimator(ntrees=200, max_depth=6, min_rows=2, seed=42),
                PROSTATE_X,
                "CAPSULE",
                prostate,
            ),
            # Columns holding one value or NA: their splits are "NA vs rest" (no threshold, no bitset).
            (
                "prostate_gbm_na_vs_rest",
                H2OGradientBoostingEstimator(**tree),
                ["AGE", "DPROS", "PSA", "MARK_NUM", "MARK_CAT"],
                "CAPSULE",
                prostate,
            ),
        ]
        if only is not None:
            specs = [spec for spec in specs if spec[0] in only]
        results: dict[str, dict[str, Any]] = {}
        for name, est, x, y, frame in specs:
            try:
                if y is None:
                    est.train(x=x, training_frame=frame)
                else:
                    est.train(x=x, y=y, training_frame=frame)
                exported = Path(est.download_mojo(path=str(out)))
                target = out / f"{name}.zip"
                if exported != target:
                    shutil.move(str(exported), target)
                results[name] = {"algo": est.algo, "trained_on": frame.frame_id}
                print(f"exported {target.name} ({target.stat().st_size} bytes)")
            except Exception as exc:  # report and keep going: a category we cannot export is skipped
                print(f"SKIPPED {name}: {type(exc).__name__}: {exc}")
        return results
    finally:
        h2o.cluster().shutdown()


def golden_rows(model_inputs: list[dict[str, Any]], data: str, n_data: int = 30) -> list[tuple[str, dict[str, str]]]:
    """Input rows as text: real data rows plus missing / unseen-level / number-as-string rows."""
    header, rows = dataset(data)
    names = [c["name"] for c in model_inputs]
    cats = [c["name"] for c in model_inputs if c["type"] == "categorical"]
    nums = [c["name"] for c in model_inputs if c["type"] == "numeric"]
    rng = random.Random(2024)
    picked = rng.sample(rows, n_data)
    out: list[tuple[str, dict[str, str]]] = [("data", {n: r[header.index(n)] for n in names}) for r in picked]
    base = dict(out[0][1])
    for i, col in enumerate(names):  # one missing cell per column, then two at once
        row = dict(out[i % n_data][1])
        row[col] = ""
        out.append(("missing", row))
    out.append(("missing", {**base, nums[0]: "", cats[0]: ""}))
    out.append(("allna", {n: "" for n in names}))
    for col in cats:  # a level the model never saw
        out.append(("unseen", {**base, col: "no-such-level"}))
    out.append(("unseen", {**base, cats[0]: "1.0"}))  # "1.0" is not the level "1"
    odd = [" {} ", "{}e0", "+{}", "0{}"]
    for i, col in enumerate(nums):  # numbers written in other ways, and one unparsable
        row = dict(out[(i + 3) % n_data][1])
        value = row[col]
        row[col] = odd[i % len(odd)].format(value) if value else value
        out.append(("numstr", row))
    out.append(("numstr", {**base, nums[-1]: "not-a-number"}))
    return out


def describe(model: Any) -> dict[str, Any]:
    """Category, inputs with types/domains and response of a genmodel model, from genmodel itself.

    The inputs are what ``EasyPredictModelWrapper`` reads from a row: the original columns when
    the model encodes categoricals itself (one-hot, binary, ...), else the model's feature columns;
    then the offset column, if the model was trained with one.
    """
    if model.getOrigNames() is not None:
        names = [str(n) for n in model.getOrigNames()][: int(model.getOrigNumCols())]
        domains = list(model.getOrigDomainValues())[: len(names)]
    else:
        names = [str(n) for n in model.getNames()][: int(model.nfeatures())]
        domains = [model.getDomainValues(i) for i in range(len(names))]
    inputs = []
    for name, dom in zip(names, domains):
        inputs.append(
            {
                "name": name,
                "type": "categorical" if dom is not None else "numeric",
                "domain": [str(d) for d in dom] if dom is not None else None,
            }
        )
    offset = str(model.getOffsetName()) if model.getOffsetName() is not None else None
    if offset is not None:
        inputs.append({"name": offset, "type": "numeric", "domain": None, "role": "offset"})
    resp = None
    resp_domain = None
    if model.isSupervised():
        resp = str(model.getResponseName())
        dom = model.getDomainValues(model.getResponseIdx())
        resp_domain = [str(d) for d in dom] if dom is not None else None
    return {
        "category": str(model.getModelCategory().toString()),
        "inputs": inputs,
        "response": resp,
        "response_domain": resp_domain,
        "preds_size": int(model.getPredsSize(model.getModelCategory())),
        "categorical_encoding": str(model.getCategoricalEncoding().toString()),
        "offset": offset,
    }


def predict_row(wrapper: Any, info: dict[str, Any], row: dict[str, str]) -> dict[str, Any]:
    """genmodel's prediction for one text row (blank cells are left out = NA).

    For a model with an offset column the offset is parsed by Java's ``Double.parseDouble``;
    missing or unparsable offsets count as 0 (the offset-free call's default).
    """
    import jpype

    RowData = jpype.JClass("hex.genmodel.easy.RowData")
    data = RowData()
    for key, value in row.items():
        if value != "":
            data.put(key, jpype.JString(value))
    category = info["category"]
    if info["offset"] is not None:
        try:
            offset = float(jpype.JClass("java.lang.Double").parseDouble(row.get(info["offset"], "")))
        except Exception:
            offset = 0.0
        offset = 0.0 if offset != offset else offset
        p = getattr(wrapper, f"predict{category}")(data, offset)
    else:
        p = wrapper.predict(data)
    if category == "Regression":
        return {"predict": float(p.value)}
    if category in ("Binomial", "Multinomial"):
        return {"predict": str(p.label), "probabilities": [float(v) for v in p.classProbabilities]}
    if category == "Clustering":
        return {"cluster": int(p.cluster)}
    if category == "AnomalyDetection":
        return {"score": float(p.score), "normalizedScore": float(p.normalizedScore)}
    if category == "AutoEncoder":
        return {"reconstruction": [float(v) for v in p.reconstructed]}
    if category == "DimReduction":
        return {"dimensions": [float(v) for v in p.dimensions]}
    raise ValueError(category)


def output_columns(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The output columns the flavor should produce, named like H2O's prediction frame."""
    cat = info["category"]
    if cat == "Regression":
        return [{"name": "predict", "datatype": "FP64", "shape": [-1]}]
    if cat in ("Binomial", "Multinomial"):
        return [{"name": "predict", "datatype": "BYTES", "shape": [-1]}] + [
            {"name": d, "datatype": "FP64", "shape": [-1]} for d in info["response_domain"]
        ]
    if cat == "Clustering":
        return [{"name": "cluster", "datatype": "INT32", "shape": [-1]}]
    if cat == "AnomalyDetection":
        return [
            {"name": "score", "datatype": "FP64", "shape": [-1]},
            {"name": "normalizedScore", "datatype": "FP64", "shape": [-1]},
        ]
    if cat == "AutoEncoder":
        return [{"name": "reconstruction", "datatype": "FP64", "shape": [-1, info["preds_size"]]}]
    if cat == "DimReduction":
        return [{"name": "dimensions", "datatype": "FP64", "shape": [-1, info["preds_size"]]}]
    return []


def flatten(category: str, pred: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """One golden-row's output cells as text (full-precision repr of floats)."""
    if category in ("Binomial", "Multinomial"):
        return [pred["predict"]] + [repr(v) for v in pred["probabilities"]]
    if category in ("AutoEncoder", "DimReduction"):
        return [repr(v) for v in next(iter(pred.values()))]
    return [repr(v) if isinstance(v, float) else str(v) for v in pred.values()]


def write_goldens(out: Path, exported: dict[str, dict[str, Any]]) -> None:
    """Load each MOJO with genmodel (JPype) and write its JSON description and golden CSV."""
    import jpype

    jpype.startJVM(classpath=[str(JAR)], convertStrings=False)
    MojoModel = jpype.JClass("hex.genmodel.MojoModel")
    Config = jpype.JClass("hex.genmodel.easy.EasyPredictModelWrapper$Config")
    Wrapper = jpype.JClass("hex.genmodel.easy.EasyPredictModelWrapper")
    for name, meta in exported.items():
        model = MojoModel.load(str(out / f"{name}.zip"))
        info = describe(model)
        info.update(name=name, algo=meta["algo"], mojo=f"{name}.zip", h2o_version=h2o.__version__)
        outputs = output_columns(info)
        info["outputs"] = outputs
        if outputs:
            config = Config().setModel(model)
            config.setConvertUnknownCategoricalLevelsToNa(True).setConvertInvalidNumbersToNa(True)
            wrapper = Wrapper(config)
            inputs = info["inputs"]
            rows = golden_rows(inputs, "iris" if name.startswith("iris") else "prostate")
            cat = info["category"]
            if cat in ("AutoEncoder", "DimReduction"):
                out_names = [f"{outputs[0]['name']}[{i}]" for i in range(info["preds_size"])]
            else:
                out_names = [o["name"] for o in outputs]
            header = ["kind"] + [c["name"] for c in inputs] + [f"out:{n}" for n in out_names]
            table = []
            for kind, row in rows:
                cells = flatten(cat, predict_row(wrapper, info, row), info)
                assert len(cells) == len(out_names), (name, len(cells), len(out_names))
                table.append([kind] + [row[c["name"]] for c in inputs] + cells)
            write_csv(out / f"{name}.golden.csv", header, table)
            info["golden"] = f"{name}.golden.csv"
            info["golden_rows"] = len(table)
        (out / f"{name}.json").write_text(json.dumps(info, indent=2) + "\n")
        print(f"described {name}: {info['category']}, {info.get('golden_rows', 0)} golden rows")


def main() -> None:
    """Train, export and record goldens."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/h2o"))
    parser.add_argument("--only", default="", help="comma-separated fixture names to (re)make; default all")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    only = {n.strip() for n in args.only.split(",") if n.strip()} or None
    with tempfile.TemporaryDirectory() as tmp:
        exported = train_and_export(training_files(Path(tmp)), args.out, only)
    write_goldens(args.out, exported)


if __name__ == "__main__":
    main()
