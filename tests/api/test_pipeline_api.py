"""Pipelines deployed and scored through the real HTTP API, with the real H2O fixture MOJOs."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.pipeline_support import (
    PROSTATE,
    h2o_step,
    pipeline_dir,
    port,
    prostate_map_step,
    servable_request,
    toml,
)
from tests.support import H2O_DIR, ROOT, InProcessGateway, prediction_columns, wait_for

EXAMPLE = ROOT / "servables" / "prostate-pipeline"
GBM = "prostate_gbm_binomial.zip"
GLM = "prostate_glm_binomial.zip"
LABELS = ["no capsule", "capsule"]


def golden_rows() -> list[dict[str, str]]:
    with (H2O_DIR / "prostate_gbm_binomial.golden.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def string_body(
    rows: list[dict[str, str]], names: list[str], configs: dict[str, str] | None = None, rename: dict[str, str] | None = None
) -> dict[str, Any]:
    """Every value as a String (blank -> null), columns named ``rename[c]`` (default: as is)."""
    rename = rename or {}
    return {
        "schema": [{"type": "String", "fields": [rename.get(c, c) for c in names]}],
        "datum": [{"tensors": [{"String": {"data": [r[c] or None for c in names]}}]} for r in rows],
        "configs": configs or {},
    }


def columns(prediction: dict[str, Any], widths: dict[str, int] | None = None) -> dict[str, list[Any]]:
    """Output columns of a Prediction: one field name per value (a vector's ``name.0``, ``name.1``, ...
    gathered back into a list per row, ``widths[name]`` long, or one value's lone column)."""
    out = prediction_columns(prediction)
    for name, width in (widths or {}).items():
        if width == 1 and name in out and not isinstance(out[name][0], list):
            out[name] = [[v] for v in out[name]]  # a vector of one value a row keeps its plain name
        assert all(len(row) == width for row in out.get(name, [])), (name, out.get(name))
    return out


EXAMPLE_WIDTHS = {"probabilities": 2, "top_labels": 2, "top_scores": 2}


async def post(gw: InProcessGateway, path: str, body: Any) -> tuple[int, Any]:
    async with gw.session.post(gw.url + path, json=body) as r:
        return r.status, await r.json(content_type=None)


def h2o_definition(mojo: str, contract: tuple[str, str, int], release: str = "m1", log_level: str = "NONE") -> dict[str, Any]:
    org, project, n = contract
    return {
        "path": H2O_DIR.as_uri(),
        "fqrv": {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": release},
        "flavor": {"H2OMojo": {"mojoPath": mojo}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": log_level, "keyFeatures": [] if log_level == "NONE" else ["reqid"]},
        },
    }


async def test_example_pipeline_equals_the_manual_composition_of_its_steps_on_every_row(gw: InProcessGateway) -> None:
    status, body = await post(gw, "/servable", servable_request(EXAMPLE))
    assert status == 200, body
    status, body = await post(gw, "/servable", h2o_definition(GBM, ("bare", "gbm", 1)))
    assert status == 200, body
    rows = golden_rows()
    rows.append({**rows[0], "RACE": "white"})  # the map step's value map: white -> "1"
    # The pipeline: lower-case request columns, every value a string.
    status, piped = await post(gw, "/pipe/prostate/1/score", string_body(rows, PROSTATE, rename={c: c.lower() for c in PROSTATE}))
    assert status == 200, piped
    got = columns(piped["Prediction"], EXAMPLE_WIDTHS)
    # one field name per value: a vector output's values are fields top_labels.0, top_labels.1, ...
    names = [f for group in piped["Prediction"]["schema"] for f in group["fields"]]
    assert {"top_labels.0", "top_labels.1", "probabilities.0", "probabilities.1"} <= set(names) and "top_labels" not in names
    # The manual composition: the map's renames and value map by hand, the bare GBM, the classifier by hand.
    mapped = [{**r, "RACE": {"white": "1", "black": "2", "other": "0"}.get(r["RACE"], r["RACE"])} for r in rows]
    status, bare = await post(gw, "/bare/gbm/1/score", string_body(mapped, PROSTATE))
    assert status == 200, bare
    direct = columns(bare["Prediction"])
    probs = np.column_stack([direct["0"], direct["1"]])
    assert np.array_equal(np.array(got["probabilities"]), probs)
    assert got["label"] == [LABELS[i] for i in probs.argmax(axis=1)]
    order = np.argsort(-probs, axis=1, kind="stable")
    assert got["top_labels"] == [[LABELS[i] for i in row] for row in order]
    assert got["top_scores"] == [[float(p[i]) for i in row] for p, row in zip(probs, order)]
    # ... and the golden predictions of genmodel itself.
    expected = [float(r["out:1"]) for r in rows]
    assert [p[1] for p in got["probabilities"]] == pytest.approx(expected, rel=1e-9, abs=0)
    assert got["probabilities"][-1] == got["probabilities"][0]


async def test_fan_out_and_join_dag_equals_the_models_scored_alone(gw: InProcessGateway, tmp_path: Path) -> None:
    """map -> (GBM, GLM) both reading the map's tensors -> a Python step averaging them -> classifier."""
    average = (
        "import numpy as np\n"
        "METADATA = {'inputs': [{'name': 'a'}, {'name': 'b'}], 'outputs': [{'name': 'p'}]}\n"
        "def predict(frame):\n"
        "    return {'p': (np.asarray(frame['a']) + np.asarray(frame['b'])) / 2}\n"
    )
    steps = [
        prostate_map_step(),
        {
            "name": "average",
            "platform": "python",
            "id": "average.py",
            "inputs": [port("a", tensor="gbm_yes"), port("b", tensor="glm_yes")],
            "outputs": [port("p", tensor="mean_yes")],
        },
        h2o_step("gbm", GBM, [port("1", tensor="gbm_yes")]),
        h2o_step("glm", GLM, [port("1", tensor="glm_yes")]),
        {
            "name": "decide",
            "platform": "classifier",
            "threshold": 0.5,
            "inputs": [port("p", tensor="mean_yes")],
            "outputs": [port("label", "BYTES"), port("score")],
        },
    ]
    directory = pipeline_dir(
        tmp_path / "dag", toml(steps, outputs=["gbm_yes", "glm_yes", "mean_yes", "label"]), (GBM, GLM), {"average.py": average}
    )
    status, body = await post(gw, "/servable", servable_request(directory))
    assert status == 200, body
    for n, mojo in ((1, GBM), (2, GLM)):
        status, body = await post(gw, "/servable", h2o_definition(mojo, ("bare", "m", n)))
        assert status == 200, body
    rows = [r for r in golden_rows() if r["kind"] == "data"]
    status, piped = await post(gw, "/pipe/prostate/1/score", string_body(rows, PROSTATE, rename={c: c.lower() for c in PROSTATE}))
    assert status == 200, piped
    got = columns(piped["Prediction"])
    alone = []
    for n in (1, 2):
        status, bare = await post(gw, f"/bare/m/{n}/score", string_body(rows, PROSTATE))
        assert status == 200
        alone.append(columns(bare["Prediction"])["1"])
    assert got["gbm_yes"] == alone[0] and got["glm_yes"] == alone[1]
    mean = [(a + b) / 2 for a, b in zip(*alone)]
    assert got["mean_yes"] == mean
    assert got["label"] == ["1" if m >= 0.5 else "0" for m in mean]
    async with gw.session.get(gw.url + "/pipe/prostate/1/p1/metadata") as r:
        meta = (await r.json())["BasicMetaData"]
    assert [i["name"] for i in meta["inputs"]] == [c.lower() for c in PROSTATE]
    assert [o["name"] for o in meta["outputs"]] == ["gbm_yes", "glm_yes", "mean_yes", "label"]


VECTOR_STEPS = (
    "import numpy as np\n"
    "from forestflow.core.frame import Frame\n"
    "def stack(frame):\n"
    "    cols = [np.asarray(frame[c], dtype=float) for c in ('sl', 'sw', 'pl', 'pw')]\n"
    "    return {'features': np.stack(cols, axis=1)}\n"
    "def total(frame):\n"
    "    x = frame['x']\n"
    "    assert x.ndim == 2 and x.shape[1] == 4, x.shape\n"
    "    note = {'seen_shape': f'{x.shape[0]}x{x.shape[1]}', 'greeting': 'hello ' + str(frame.parameters.get('who', 'nobody'))}\n"
    "    return Frame({'sum': x.sum(axis=1)}, {**frame.parameters, **note})\n"
)


def vector_pipeline(tmp_path: Path, log_intermediate: bool = False) -> Path:
    steps = [
        {
            "name": "stack",
            "platform": "python",
            "id": "steps.py",
            "entry_point": "stack",
            "inputs": [port(c) for c in ("sl", "sw", "pl", "pw")],
            "outputs": [port("features", tensor="vec", shape=[-1, 4])],
        },
        {
            "name": "total",
            "platform": "python",
            "id": "steps.py",
            "entry_point": "total",
            "inputs": [port("x", tensor="vec", shape=[-1, 4])],
            "outputs": [port("sum")],
        },
    ]
    text = ("[pipeline]\nlog_intermediate = true\n" if log_intermediate else "") + toml(steps)
    return pipeline_dir(tmp_path / "vector", text, files={"steps.py": VECTOR_STEPS})


async def test_python_step_reads_a_vector_tensor_and_metadata_goes_both_ways(gw: InProcessGateway, tmp_path: Path) -> None:
    directory = vector_pipeline(tmp_path, log_intermediate=True)
    status, body = await post(gw, "/servable", servable_request(directory, contract=("pipe", "vec", 1), log_level="FULL"))
    assert status == 200, body
    rows = [[5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3]]
    request = {
        "schema": [{"type": "Float64", "fields": ["sl", "sw", "pl", "pw"]}],
        "datum": [{"tensors": [{"Float64": {"data": r}}]} for r in rows],
        "configs": {"who": "basic"},
    }
    status, body = await post(gw, "/pipe/vec/1/score", request)
    assert status == 200, body
    assert columns(body["Prediction"])["sum"] == [sum(r) for r in rows]
    assert body["Metadata"] == {"seen_shape": "2x4", "greeting": "hello basic"}  # request configs are not echoed
    v2 = {
        "inputs": [
            {"name": n, "datatype": "FP64", "shape": [2], "data": [r[i] for r in rows]}
            for i, n in enumerate(("sl", "sw", "pl", "pw"))
        ],
        "parameters": {"who": "v2"},
    }
    status, body = await post(gw, "/v2/models/pipe.vec.1/infer", v2)
    assert status == 200, body
    assert body["outputs"][0]["data"] == [sum(r) for r in rows]
    assert body["parameters"] == {"seen_shape": "2x4", "greeting": "hello v2"}
    # One prediction event per request, carrying the returned metadata.
    log = gw.gateway.settings.data_dir / "predictions.jsonl"

    def events() -> list[dict[str, Any]]:
        return [orjson.loads(line)["event"] for line in log.read_bytes().splitlines()] if log.exists() else []

    await wait_for(lambda: len(events()) >= 2, 10, "two prediction events")
    evts = events()
    assert len(evts) == 2
    assert [e["metadata"]["greeting"] for e in evts] == ["hello basic", "hello v2"]
    # [pipeline] log_intermediate = true: the tensor between the steps is in the event, not in the answer.
    assert evts[0]["intermediate"] == {"vec": rows}
    assert "vec" not in str(body["outputs"])


async def test_steps_without_returned_metadata_add_no_field(gw: InProcessGateway) -> None:
    status, body = await post(gw, "/servable", servable_request(EXAMPLE))
    assert status == 200, body
    rows = golden_rows()[:1]
    status, body = await post(
        gw, "/pipe/prostate/1/score", string_body(rows, PROSTATE, {"top_k": "1"}, rename={c: c.lower() for c in PROSTATE})
    )
    assert status == 200
    assert set(body) == {"Prediction"}
    assert columns(body["Prediction"], {"probabilities": 2, "top_labels": 1, "top_scores": 1})["top_labels"] == [
        ["no capsule"]
    ]  # configs.top_k reached the classifier


async def test_model_step_without_declared_inputs_reads_its_models_inputs_from_the_request(
    gw: InProcessGateway, tmp_path: Path
) -> None:
    """An h2o_mojo step with no [[models.inputs]]: its MOJO's own columns come from the request (issue 33 item 1)."""
    step = {"name": "gbm", "platform": "h2o_mojo", "id": GBM, "outputs": [port("1", tensor="yes")]}
    directory = pipeline_dir(tmp_path / "bare_step", toml([step], outputs=["yes"]), (GBM,))
    status, body = await post(gw, "/servable", servable_request(directory))
    assert status == 200, body
    status, body = await post(gw, "/servable", h2o_definition(GBM, ("bare", "m", 1)))
    assert status == 200, body
    rows = [r for r in golden_rows() if r["kind"] == "data"][:2]
    status, piped = await post(gw, "/pipe/prostate/1/score", string_body(rows, PROSTATE))
    assert status == 200, piped
    got = columns(piped["Prediction"])
    assert len(got["yes"]) == 2 and "unknownInputs" not in str(piped), piped
    status, bare = await post(gw, "/bare/m/1/score", string_body(rows, PROSTATE))
    assert status == 200, bare
    assert got["yes"] == columns(bare["Prediction"])["1"]
    async with gw.session.get(gw.url + "/pipe/prostate/1/p1/metadata") as r:
        meta = (await r.json())["BasicMetaData"]
    assert {i["name"] for i in meta["inputs"]} >= set(PROSTATE)
