"""The ``Pipeline`` flavor: one servable made of steps wired by tensor id (``pipeline_definition``).

Deploy: ``{"flavor": {"Pipeline": {"definition": "pipeline.toml"}}}`` with the TOML and every
step's artifact in the servable directory. Each step is a servable of the flavor its platform
names in the flavor registry (``runtime/base.py``), loaded with its artifact and options; the
pipeline checks each step's declared ports against what the loaded model says it takes and gives.
Anything that fails unloads the steps already loaded: a failed deploy leaves nothing behind.

Scoring runs the steps in dependency order inside one ``predict`` call (one scheduler slot, one
prediction event). Every step sees the request's parameters (``configs`` / V2 ``parameters``); what
a step returns in its output frame's parameters (values the request did not carry) comes back to
the caller under the output parameter ``metadata``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from forestflow.core import input_report
from forestflow.core.frame import Frame, TensorSpec
from forestflow.errors import CreateServableRequestInvalidError, GatewayError, PredictionFailed
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.pipeline_definition import PipelineSpec, Port, StepSpec, read_definition
from forestflow.runtime.pipeline_steps import internal_frame

#: Output-frame parameter holding what steps returned as metadata (absent when none did).
RESPONSE_METADATA = "metadata"
#: Output-frame parameter listing request columns no step reads (as the H2O flavor does).
UNKNOWN_INPUTS = input_report.UNKNOWN
#: What a step's model lacked (H2O reports it); inside a pipeline that is the wiring's business.
MISSING_INPUTS = input_report.MISSING
#: Output-frame parameter with the tensors between steps, for the prediction log (only when the
#: definition sets ``[pipeline] log_intermediate = true``).
INTERMEDIATE = "intermediate"


class _Step:
    """A loaded step and how its ports map to the pipeline's tensors (precomputed for predict)."""

    __slots__ = ("name", "servable", "reads", "writes")

    def __init__(self, spec: StepSpec, servable: Servable) -> None:
        self.name = spec.name
        self.servable = servable
        #: (input name the model sees, whether it is a request column, column or tensor id)
        self.reads = tuple((p.name, not p.id, p.id or p.name) for p in spec.inputs)
        #: (output name the model gives, tensor id it is published as)
        self.writes = tuple((p.name, p.id) for p in spec.outputs)


class PipelineServable(Servable):
    """Several servables run as one, in dependency order, tensors passed by id."""

    def __init__(
        self,
        fqrv: Any,
        artifact_dir: Path,
        settings: dict[str, Any],
        *,
        create_step: Callable[[str, Any, Path, dict[str, Any]], Servable],
    ) -> None:
        super().__init__(fqrv, artifact_dir, settings)
        #: Builds a step's servable from its flavor name (runtime/flavors.py's create_servable).
        self._create_step = create_step
        self._steps: list[_Step] = []
        self._spec: PipelineSpec | None = None
        self._meta: ServableMetadata | None = None
        self._request_names: frozenset[str] = frozenset()
        self._outputs: tuple[str, ...] = ()
        self._log_intermediate = False

    # -- loading -----------------------------------------------------------------------------
    def load(self) -> None:
        """Read and check the definition, load every step; on any failure unload what loaded."""
        body = self.settings.get("Pipeline", self.settings)
        file_name = body.get("definition") if isinstance(body, dict) else None
        if not isinstance(file_name, str) or not file_name:
            raise CreateServableRequestInvalidError(
                'the Pipeline flavor needs "definition": the TOML file name inside the servable directory'
            )
        spec = read_definition(Path(self.artifact_dir), file_name)
        for step in spec.steps:
            gate = step.flavor.gate
            if gate is not None and not getattr(self.gateway_settings, gate, False):
                raise CreateServableRequestInvalidError(
                    f"step {step.name!r}: platform {step.platform!r} is disabled on this gateway "
                    f"(it runs code named by the request); the {gate} setting allows it"
                )
        loaded: list[_Step] = []
        implied: list[Port] = []  # request columns read by steps that declare no inputs
        try:
            for step in spec.steps:
                servable = self._create_step(step.flavor.flavor, self.fqrv, self.artifact_dir, step.flavor_settings())
                servable.gateway_settings = self.gateway_settings
                servable.loop = self.loop  # steps that run on the loop (remote_v2) are called through it
                servable.restoring = self.restoring
                try:
                    servable.load()
                except GatewayError as exc:
                    raise CreateServableRequestInvalidError(f"step {step.name!r}: {exc.message}") from None
                except Exception as exc:  # a model's own failure while loading: 422 with the reason
                    raise CreateServableRequestInvalidError(
                        f"step {step.name!r}: loading failed: {type(exc).__name__}: {exc}"
                    ) from exc
                step = _with_model_inputs(step, servable.metadata())
                loaded.append(_Step(step, servable))
                _check_ports(step, servable.metadata())
                implied.extend(p for p in step.inputs if not p.id)
        except BaseException:
            for done in reversed(loaded):
                done.servable.unload()
            raise
        known = {p.name for p in spec.request_inputs}
        extra: list[Port] = []
        for port in implied:
            if port.name not in known:
                known.add(port.name)
                extra.append(port)
        if extra:
            spec = dataclasses.replace(spec, request_inputs=spec.request_inputs + tuple(extra))
        self._spec, self._steps = spec, loaded
        self._request_names = frozenset(p.name for p in spec.request_inputs)
        self._outputs = spec.outputs
        self._log_intermediate = spec.log_intermediate
        servables = [s.servable for s in loaded]
        self.inline_max_rows = min(s.inline_max_rows for s in servables)
        if spec.log_intermediate:
            # Inline calls may score several requests in one batch and slice the answer per request;
            # the intermediate tensors are not sliced with it, so these pipelines score one by one.
            self.inline_max_rows = 0
        # Combined calls are sliced per request, so, as above, not with intermediate tensors logged.
        self.batchable = not spec.log_intermediate and all(s.batchable for s in servables)
        limits = [s.max_concurrency for s in servables if s.max_concurrency is not None]
        self.max_concurrency = min(limits) if limits else None
        # Request parameters reach every step, so requests are only scored together when theirs agree.
        self.reads_parameters = any(s.reads_parameters for s in servables)
        # A step that converts what it is given (H2O, ONNX) is held to its own checks, not the gateway's.
        self.converts_inputs = any(s.converts_inputs for s in servables)
        self._meta = self._build_metadata(spec, file_name)
        self.ready = True

    def unload(self) -> None:
        """Unload every step."""
        for step in reversed(self._steps):
            step.servable.unload()
        self._steps = []
        super().unload()

    async def aunload(self) -> None:
        """Unload every step on the loop (at gateway stop): steps that run on it close their
        connections there, awaited, rather than in a task the stopping loop may never run."""
        for step in reversed(self._steps):
            await step.servable.aunload()
        self._steps = []
        Servable.unload(self)

    # -- scoring -----------------------------------------------------------------------------
    def predict(self, frame: Frame) -> Frame:
        """Run every step in order; the answer holds the pipeline's output tensors."""
        request = frame.columns
        parameters = frame.parameters
        tensors: dict[str, np.ndarray] = {}
        returned: dict[str, Any] | None = None
        for step in self._steps:
            inputs = {}
            for name, from_request, key in step.reads:
                if from_request:
                    column = request.get(key)
                    if column is not None:
                        inputs[name] = column
                else:
                    inputs[name] = tensors[key]
            out = step.servable.predict(internal_frame(inputs, parameters))
            produced = out.columns
            try:
                for name, key in step.writes:
                    tensors[key] = produced[name]
            except KeyError as exc:
                # The step's model broke its declared ports: the server's failure, not the caller's.
                reason = f"step {step.name!r} of {self.fqrv} gave no output {exc.args[0]!r}"
                raise PredictionFailed(self.fqrv, reason) from ValueError(reason)
            if out.parameters:
                returned = _returned_metadata(out.parameters, parameters, returned)
        result: dict[str, Any] = {}
        unknown = [c for c in request if c not in self._request_names]
        if unknown:
            result[UNKNOWN_INPUTS] = unknown
        if returned:
            result[RESPONSE_METADATA] = returned
        if self._log_intermediate:
            result[INTERMEDIATE] = {k: v for k, v in tensors.items() if k not in self._outputs}
        return Frame({key: tensors[key] for key in self._outputs}, result)  # checked: steps may misbehave

    # -- metadata ----------------------------------------------------------------------------
    def metadata(self) -> ServableMetadata:
        """Request inputs and final outputs; ``extra`` lists the steps."""
        assert self._meta is not None, "metadata before load"
        return self._meta

    def _request_content_types(self) -> dict[str, str]:
        """The content type of each request column as the first step reading it declares it
        (an ``image_decode`` step's input is ``"image"``)."""
        found: dict[str, str] = {}
        for step in self._steps:
            declared = {i.name: i.content_type for i in step.servable.metadata().inputs if i.content_type}
            for name, from_request, key in step.reads:
                if from_request and key not in found and name in declared:
                    found[key] = declared[name]
        return found

    def _build_metadata(self, spec: PipelineSpec, file_name: str) -> ServableMetadata:
        content_types = self._request_content_types()
        inputs = tuple(
            TensorSpec(p.name, p.datatype, p.shape, "request input", content_type=content_types.get(p.name))
            for p in spec.request_inputs
        )
        outputs = []
        classification = None
        for key in spec.outputs:
            producer, port = spec.producers[key]
            step = next(s for s in self._steps if s.name == producer.name)
            meta = step.servable.metadata()
            model_spec = next((o for o in meta.outputs if o.name == port.name), None)
            outputs.append(
                TensorSpec(
                    key,
                    port.datatype,
                    port.shape,
                    f"{port.name} of step {producer.name!r}",
                    model_spec.domain if model_spec else None,
                    model_spec.content_type if model_spec else None,
                )
            )
            source = meta.extra.get("classification")
            if source and source.get("scores") == port.name:
                classification = {"scores": key, "labels": list(source["labels"])}
        extra: dict[str, Any] = {
            "definition": file_name,
            "steps": [{"name": s.name, "platform": s.platform, "artifact": s.artifact} for s in spec.steps],
        }
        if classification is not None:
            extra["classification"] = classification
        names = " -> ".join(s.name for s in spec.steps)
        return ServableMetadata(
            name="pipeline",
            platform="pipeline",
            inputs=inputs,
            outputs=tuple(outputs),
            description=f"pipeline {names}",
            extra=extra,
        )


def _returned_metadata(out: dict[str, Any], request: dict[str, Any], so_far: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a step returned as metadata: its output parameters the request did not carry as such."""
    for key, value in out.items():
        if key in (UNKNOWN_INPUTS, MISSING_INPUTS, RESPONSE_METADATA, INTERMEDIATE):  # bookkeeping, not metadata
            if key == RESPONSE_METADATA and isinstance(value, dict):  # a nested pipeline's metadata
                so_far = {**(so_far or {}), **value}
            continue
        if key in request and request[key] is value:
            continue
        try:
            same = key in request and bool(request[key] == value)
        except Exception:  # arrays compare element-wise: treat as different
            same = False
        if not same:
            so_far = so_far if so_far is not None else {}
            so_far[key] = value
    return so_far


def _with_model_inputs(step: StepSpec, meta: ServableMetadata) -> StepSpec:
    """A model step that declares no ``[[models.inputs]]`` reads its model's own inputs (as its
    flavor reports them) from the request columns of the same names."""
    if step.inputs or step.flavor.takes_ports or not meta.inputs:
        return step
    return dataclasses.replace(step, inputs=tuple(Port(i.name, i.datatype, tuple(i.shape), "") for i in meta.inputs))


def _check_ports(step: StepSpec, meta: ServableMetadata) -> None:
    """A step's declared ports must exist in what its loaded model says it takes and gives."""
    if meta.outputs:
        known = {o.name: o for o in meta.outputs}
        for port in step.outputs:
            model = known.get(port.name)
            if model is None:
                raise CreateServableRequestInvalidError(
                    f"{port.describe(step.name, 'output')}: the model has no output {port.name!r} "
                    f"(its outputs: {', '.join(known)})"
                )
            if model.datatype != port.datatype:
                raise CreateServableRequestInvalidError(
                    f"{port.describe(step.name, 'output')}: declared {port.datatype} but the model gives {model.datatype}"
                )
            if len(model.shape) != len(port.shape):
                raise CreateServableRequestInvalidError(
                    f"{port.describe(step.name, 'output')}: declared shape {list(port.shape)} "
                    f"but the model gives {list(model.shape)}"
                )
    if meta.inputs:
        known_inputs = {i.name for i in meta.inputs}
        for port in step.inputs:
            if port.name not in known_inputs:
                raise CreateServableRequestInvalidError(
                    f"{port.describe(step.name, 'input')}: the model has no input {port.name!r} "
                    f"(its inputs: {', '.join(sorted(known_inputs))})"
                )


__all__ = ["INTERMEDIATE", "PipelineServable", "RESPONSE_METADATA", "UNKNOWN_INPUTS"]
