"""The Pipeline servable on its own: steps resolved through the flavor registry, unloaded on failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import CreateServableRequestInvalidError, InvalidInput, PredictionFailed
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.flavors import create_servable, register_flavor
from forestflow.runtime.pipeline_definition import parse_definition
from forestflow.runtime.step_platforms import StepPlatform, register_platform
from tests.pipeline_support import pipeline_dir, port, toml

FQ = FQRV(Contract("t", "p", 1), "r1")
EVENTS: list[str] = []


class Recording(Servable):
    """A flavor registered by the test: adds ``offset`` to ``x``, records load and unload."""

    reads_parameters = False

    def load(self) -> None:
        EVENTS.append(f"load {self.settings['label']}")
        self.ready = True

    def predict(self, frame: Frame) -> Frame:
        return Frame({"y": np.asarray(frame["x"]) + self.settings["offset"]}, {"trace": self.settings["label"]})

    def metadata(self) -> ServableMetadata:
        return ServableMetadata("recording", "recording", (), ())

    def unload(self) -> None:
        EVENTS.append(f"unload {self.settings['label']}")
        super().unload()


register_flavor("TestRecording", lambda: Recording)
register_platform("test_recording", StepPlatform("TestRecording", None))


def step(label: str, reads: str, writes: str, offset: float = 1.0) -> dict[str, Any]:
    return {
        "name": label,
        "platform": "test_recording",
        "label": label,
        "offset": offset,
        "inputs": [port("x", tensor=reads)],
        "outputs": [port("y", tensor=writes)],
    }


def load(directory: Path) -> Servable:
    servable = create_servable("Pipeline", FQ, directory, {"definition": "pipeline.toml"})
    servable.load()
    return servable


def test_a_flavor_registered_later_is_a_step_and_steps_run_in_dependency_order(tmp_path: Path) -> None:
    EVENTS.clear()
    # Written out of order: c reads b's tensor, b reads a's, a reads the request.
    steps = [step("c", "tb", "tc", 100.0), step("b", "ta", "tb", 10.0), step("a", "", "ta", 1.0)]
    steps[2]["inputs"] = [port("x")]
    servable = load(pipeline_dir(tmp_path / "p", toml(steps)))
    assert EVENTS == ["load a", "load b", "load c"]
    out = servable.predict(Frame.from_columns({"x": [1.0, 2.0], "extra": ["u", "v"]}))
    assert list(out.columns) == ["tc"]
    assert out["tc"].tolist() == [112.0, 113.0]
    assert out.parameters["unknown_inputs"] == ["extra"]
    assert out.parameters["metadata"] == {"trace": "c"}  # later steps overwrite earlier keys
    servable.unload()
    assert EVENTS[3:] == ["unload c", "unload b", "unload a"]


def test_a_failed_load_unloads_the_steps_already_loaded(tmp_path: Path) -> None:
    EVENTS.clear()
    bad = {"name": "decide", "platform": "classifier", "inputs": [port("p", tensor="tb")], "outputs": [port("verdict", "BYTES")]}
    steps = [step("a", "", "ta"), step("b", "ta", "tb"), bad]
    steps[0]["inputs"] = [port("x")]
    with pytest.raises(CreateServableRequestInvalidError, match="step 'decide': classifier step: unknown output 'verdict'"):
        load(pipeline_dir(tmp_path / "p", toml(steps)))
    assert EVENTS == ["load a", "load b", "unload b", "unload a"]


def test_simple_one_model_toml_without_models_list(tmp_path: Path) -> None:
    text = (
        'name = "clip"\nplatform = "regressor"\nclamp = [0.0, 1.0]\nround = 2\n'
        '[[inputs]]\nname = "v"\n[[outputs]]\nname = "value"\n'
    )
    servable = load(pipeline_dir(tmp_path / "p", text))
    out = servable.predict(Frame.from_columns({"v": [-0.5, 0.123, 7.0]}))
    assert out["value"].tolist() == [0.0, 0.12, 1.0]
    assert [o.name for o in servable.metadata().outputs] == ["value"]


def test_map_step_renames_casts_maps_values_and_adds_constants(tmp_path: Path) -> None:
    steps = [
        {
            "name": "m",
            "platform": "map",
            "rename": {"AGE": "age"},
            "constants": {"SOURCE": "web"},
            "values": {"RACE": {"white": "1", "black": "2"}},
            "inputs": [port("age", "BYTES"), port("RACE", "BYTES")],
            "outputs": [port("AGE"), port("RACE", "BYTES"), port("SOURCE", "BYTES")],
        }
    ]
    servable = load(pipeline_dir(tmp_path / "p", toml(steps)))
    out = servable.predict(
        Frame.from_columns({"age": np.array(["65", None, "0x1p3", "oops"], dtype=object), "RACE": ["white", "black", "x", "2"]})
    )
    assert out["AGE"][[0, 2]].tolist() == [65.0, 8.0] and np.isnan(out["AGE"][[1, 3]]).all()
    assert out["RACE"].tolist() == ["1", "2", "x", "2"]
    assert out["SOURCE"].tolist() == ["web"] * 4
    with pytest.raises(InvalidInput, match="no column 'RACE'"):
        servable.predict(Frame.from_columns({"age": ["1"]}))


def test_classifier_top_k_per_request_and_threshold(tmp_path: Path) -> None:
    steps = [
        {
            "name": "c",
            "platform": "classifier",
            "labels": ["a", "b", "c"],
            "top_k": 2,
            "inputs": [port("p", shape=[-1, 3])],
            "outputs": [
                port("label", "BYTES"),
                port("score"),
                port("top_labels", "BYTES", shape=[-1, -1]),
                port("top_scores", shape=[-1, -1]),
            ],
        }
    ]
    servable = load(pipeline_dir(tmp_path / "p", toml(steps)))
    p = np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])
    out = servable.predict(Frame({"p": p}))
    assert out["label"].tolist() == ["b", "a"] and out["score"].tolist() == [0.5, 0.6]
    assert out["top_labels"].tolist() == [["b", "c"], ["a", "c"]]
    assert out["top_scores"].tolist() == [[0.5, 0.3], [0.6, 0.3]]
    out = servable.predict(Frame({"p": p}, {"top_k": "3"}))
    assert out["top_labels"].tolist() == [["b", "c", "a"], ["a", "c", "b"]]
    with pytest.raises(InvalidInput, match="top_k"):
        servable.predict(Frame({"p": p}, {"top_k": "zero"}))
    binomial = [
        {"name": "c", "platform": "classifier", "threshold": 0.3, "inputs": [port("p1")], "outputs": [port("label", "BYTES")]}
    ]
    servable = load(pipeline_dir(tmp_path / "q", toml(binomial)))
    assert servable.predict(Frame({"p1": np.array([0.2, 0.3, 0.9])}))["label"].tolist() == ["0", "1", "1"]


def test_pipeline_outputs_default_to_the_tensors_no_step_consumes(tmp_path: Path) -> None:
    steps = [
        {"name": "a", "platform": "map", "inputs": [port("x")], "outputs": [port("x", tensor="t1")]},
        {"name": "b", "platform": "regressor", "inputs": [port("v", tensor="t1")], "outputs": [port("value", tensor="r1")]},
        {
            "name": "c",
            "platform": "regressor",
            "round": 0,
            "inputs": [port("v", tensor="t1")],
            "outputs": [port("value", tensor="r2")],
        },
    ]
    spec = parse_definition(__import__("tomllib").loads(toml(steps)), tmp_path)
    assert spec.outputs == ("r1", "r2")
    assert [s.name for s in spec.steps] == ["a", "b", "c"]
    assert [p.name for p in spec.request_inputs] == ["x"]


def test_a_step_missing_its_declared_output_is_prediction_failed(tmp_path: Path) -> None:
    """A step whose model does not give a declared output is the server's failure (a 500), not a 400."""
    bad = {**step("a", "", "ta"), "outputs": [port("z", tensor="ta")]}  # the Recording model gives y only
    servable = load(pipeline_dir(tmp_path / "p", toml([bad])))
    with pytest.raises(PredictionFailed, match="step 'a' .* gave no output 'z'"):
        servable.predict(Frame({"x": np.array([1.0])}))
