"""The RemoteV2 pieces on their own: the circuit breaker's states and the Frame <-> V2 tensor rules."""

from __future__ import annotations

import numpy as np

from forestflow.codecs.v2_tensor import Tensor
from forestflow.core.frame import Frame, TensorSpec
from forestflow.runtime.remote.breaker import CircuitBreaker
from forestflow.runtime.remote.wire import answer_frame, forwarded_parameters, request_tensors


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_threshold_failures_in_a_row_and_closes_on_success() -> None:
    clock = Clock()
    breaker = CircuitBreaker(3, 2.0, clock)
    assert not breaker.failure() and not breaker.failure()
    breaker.success()  # a success in between: the count starts again
    assert not breaker.failure() and not breaker.failure() and not breaker.open
    assert breaker.failure() and breaker.open and breaker.opened_count == 1
    assert breaker.retry_after() == 2.0
    clock.now += 1.5
    assert breaker.retry_after() == 0.5
    assert not breaker.failure()  # already open: not opened again
    clock.now += 1.0
    breaker.probe_failed()  # still down: another full cool-down from now
    assert breaker.open and breaker.retry_after() == 2.0
    breaker.success()
    assert not breaker.open and breaker.consecutive_failures == 0 and breaker.retry_after() == 0.0
    breaker.trip()  # found down before any call
    assert breaker.open and breaker.opened_count == 2 and breaker.consecutive_failures == 3


def test_columns_named_after_inputs_go_as_they_are_cast_to_the_inputs_datatypes() -> None:
    frame = Frame.from_columns({"x": [1.0, 2.0], "label": ["a", "b"], "extra": [1, 2]})
    inputs = (TensorSpec("x", "FP32"), TensorSpec("label", "BYTES"))
    tensors = {t.name: t for t in request_tensors(frame, inputs)}
    assert set(tensors) == {"x", "label"}  # what the model does not take stays here
    assert tensors["x"].datatype == "FP32" and tensors["x"].array.dtype == np.float32
    assert tensors["label"].datatype == "BYTES" and tensors["label"].array.tolist() == ["a", "b"]
    # Nothing the backend describes: every column as it is.
    assert [t.name for t in request_tensors(frame, ())] == ["x", "label", "extra"]


def test_scalar_columns_fill_a_single_vector_input_in_order() -> None:
    frame = Frame.from_columns({"a": [1.0, 5.0], "b": [2.0, 6.0], "c": [3.0, 7.0]})
    (tensor,) = request_tensors(frame, (TensorSpec("predict", "FP32", (-1, 3)),))
    assert tensor.name == "predict" and tensor.datatype == "FP32"
    assert tensor.array.tolist() == [[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]]
    # Not when the widths disagree, the input is named in the request, or a column is text.
    assert [t.name for t in request_tensors(frame, (TensorSpec("predict", "FP32", (-1, 4)),))] == ["a", "b", "c"]
    named = Frame.from_columns({"predict": [[1.0, 2.0, 3.0]]})
    assert request_tensors(named, (TensorSpec("predict", "FP32", (-1, 3)),))[0].array.shape == (1, 3)
    text = Frame.from_columns({"a": [1.0], "b": ["x"], "c": [2.0]})
    assert len(request_tensors(text, (TensorSpec("predict", "FP32", (-1, 3)),))) == 3


def test_parameters_and_answers() -> None:
    params = {"content_type": "pd", "top_k": 2, "flag": True, "name": "n", "array": np.zeros(2), "nested": {"a": 1}}
    assert forwarded_parameters(params) == {"top_k": 2, "flag": True, "name": "n"}
    frame, problem = answer_frame([Tensor("y", "FP64", np.array([1.0, 2.0]))], 2)
    assert frame is not None and frame["y"].tolist() == [1.0, 2.0] and problem == ""
    frame, problem = answer_frame([Tensor("y", "FP64", np.array([1.0]))], 2)
    assert frame is None and "shape [1] for 2 input row(s)" in problem
    assert answer_frame([], 1) == (None, "the answer has no outputs")
