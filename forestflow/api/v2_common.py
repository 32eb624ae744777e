"""What the V2 REST and gRPC front-ends share: model names, metadata, readiness and scoring.

A V2 *model* is a contract, named ``org.project.N``; a model *version* is one of its releases.
Without a version, inference is routed by phase-in (with shadow copies and logging, as /score);
with one, that release scores directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import orjson

import forestflow
from forestflow.api.common import MAX_CACHED_CONTRACTS
from forestflow.codecs.v2 import NP, PD, Layout, decode_inputs, spec_json
from forestflow.codecs.v2_request import TRANSPORT_PARAMETERS, configs_from
from forestflow.codecs.v2_tensor import BASE64, Tensor
from forestflow.core.frame import DATATYPES, IMAGE, Frame, TensorSpec
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import InvalidInput, NoActiveServablesForContract, NotFound
from forestflow.predlog.record import Wire, WireBody
from forestflow.runtime.base import ServableMetadata
from forestflow.runtime.classification import CLASSIFICATION, classify, positive_count, require_classifier
from forestflow.runtime.explanation import EXPLANATION, Explanation
from forestflow.runtime.pipeline import RESPONSE_METADATA
from forestflow.service import Gateway, InferResult, Route

SERVER_NAME = "forestflow"
EXTENSIONS = ["binary_tensor_data", "parameters", "classification", "model_repository"]


def server_metadata() -> dict[str, Any]:
    """The V2 ``$metadata_server_response``."""
    return {"name": SERVER_NAME, "version": forestflow.__version__, "extensions": list(EXTENSIONS)}


#: Contracts of the model names already seen (as api/common.py's contract_from, and bounded alike).
_MODEL_CONTRACTS: dict[str, Contract] = {}


def model_contract(name: str) -> Contract:
    """The contract a V2 model name designates; a name that is no contract is an unknown model."""
    contract = _MODEL_CONTRACTS.get(name)
    if contract is not None:
        return contract
    try:
        contract = Contract.parse(name)
    except InvalidInput:
        raise NotFound(f"unknown model {name!r}: model names are contracts, org.project.N") from None
    if len(_MODEL_CONTRACTS) >= MAX_CACHED_CONTRACTS:
        _MODEL_CONTRACTS.clear()
    _MODEL_CONTRACTS[name] = contract
    return contract


def version_fqrv(contract: Contract, version: str) -> FQRV:
    """The servable a model version designates."""
    try:
        return FQRV(contract, version)
    except InvalidInput:
        raise NotFound(f"unknown version {version!r} of model {contract}") from None


def servable_metadata(gateway: Gateway, contract: Contract, version: str | None) -> tuple[FQRV, ServableMetadata]:
    """The metadata of a model version, or of the release that describes the model
    (:meth:`Gateway.describing_release`)."""
    if version:
        fqrv = version_fqrv(contract, version)
        gateway.entry(fqrv)
        return fqrv, gateway.metadata(fqrv)
    described = gateway.describing_release(gateway.contract_state(contract))
    if described is None:
        raise gateway.registry.inactive_error(contract)  # 503 while its releases load, else 422
    return described, gateway.metadata(described)


def model_metadata(gateway: Gateway, name: str, version: str | None) -> dict[str, Any]:
    """The V2 ``$metadata_model_response`` of a model (or one version)."""
    contract = model_contract(name)
    _, meta = servable_metadata(gateway, contract, version)
    versions = [e.fqrv.release for e in gateway.servable_entries(contract)]
    return {
        "name": name,
        "versions": versions,
        "platform": meta.platform,
        "inputs": [spec_json(s) for s in meta.inputs],
        "outputs": [spec_json(s) for s in meta.outputs],
    }


def model_ready(gateway: Gateway, name: str, version: str | None) -> bool:
    """Whether a model can score now; 404 (NotFound / UnknownContract / UnknownServable) if unknown."""
    contract = model_contract(name)
    if version:
        fqrv = version_fqrv(contract, version)
        gateway.entry(fqrv)
    else:
        gateway.contract_state(contract)
        try:
            fqrv = gateway.active_release(contract)
        except NoActiveServablesForContract:
            return False
    return gateway.release_ready(fqrv)  # a cold release that loads on demand is ready (lazy loading)


def decoding_specs(gateway: Gateway, route: Route) -> Sequence[TensorSpec]:
    """The model inputs a routed request's tensors are laid out against: those of the release that
    scores it (empty when nothing is loaded: the inference itself answers that)."""
    meta = gateway.decoding_metadata(route)
    return meta.inputs if meta is not None else ()


def output_parameters(wanted: Sequence[tuple[str, dict[str, Any]]]) -> tuple[dict[str, int], dict[str, Any]]:
    """From the requested outputs: the class count asked of each (``classification``), and the
    other model parameters they carry (adapter options such as ``top_k``), for the request."""
    ks: dict[str, int] = {}
    options: dict[str, Any] = {}
    for name, params in wanted:
        for key, value in params.items():
            if key == CLASSIFICATION:
                ks[name] = positive_count(value, f"output {name!r}: parameters.classification")
            elif key not in TRANSPORT_PARAMETERS:
                options[key] = value
    return ks, options


def check_can_classify(gateway: Gateway, route: Route, ks: dict[str, int]) -> None:
    """400 before scoring when the servable that will answer cannot classify."""
    if not ks or route.answered is None:
        return  # nothing active: the inference itself answers that
    fqrv = route.state.servables[route.answered].fqrv
    meta = gateway.decoding_metadata(route)
    if meta is None:
        return  # not loaded: the inference itself answers that
    require_classifier(meta, str(fqrv))
    names = {o.name for o in meta.outputs}
    for name in ks:
        if name not in names:
            raise InvalidInput(f"output {name!r}: not an output of {fqrv} (outputs: {', '.join(sorted(names))})")


def classify_outputs(gateway: Gateway, fqrv: FQRV, frame: Frame, outputs: list[Tensor], ks: dict[str, int]) -> list[Tensor]:
    """Replace each output asked with ``classification = k`` by its ``[N, k]`` "score:index:label" strings."""
    if not ks:
        return outputs
    source = require_classifier(gateway.metadata(fqrv), str(fqrv))
    return [Tensor(t.name, "BYTES", classify(source, frame, ks[t.name])) if t.name in ks else t for t in outputs]


def base64_images(gateway: Gateway, fqrv: FQRV, outputs: list[Tensor]) -> None:
    """Mark the outputs that hold encoded images (metadata ``content_type = "image"``) to go into
    JSON answers as base64 text; binary answers carry their bytes as they are."""
    if not any(t.datatype == "BYTES" and t.array.size and type(t.array.flat[0]) is bytes for t in outputs):
        return  # text (or no BYTES at all): the usual answer, no metadata looked up
    images = {s.name for s in gateway.metadata(fqrv).outputs if s.content_type == IMAGE}
    for tensor in outputs:
        if tensor.name in images and tensor.datatype == "BYTES":
            tensor.parameters = {**tensor.parameters, "content_type": BASE64}


def response_metadata(frame: Frame) -> dict[str, Any]:
    """What the model's steps returned as metadata (empty when none did)."""
    returned = frame.parameters.get(RESPONSE_METADATA)
    return returned if isinstance(returned, dict) else {}


async def infer(
    gateway: Gateway,
    name: str,
    version: str | None,
    tensors: Sequence[Tensor],
    parameters: dict[str, Any],
    *,
    request_id: str,
    protocol: str,
    timeout_s: float | None,
    classification: dict[str, int] | None = None,
    wire_request: WireBody | None = None,
    encode_response: Callable[[FQRV, Frame, Layout], WireBody] | None = None,
    route: Route | None = None,
) -> tuple[InferResult, Layout]:
    """Route the request (routed, or on ``version``), lay the tensors out as the inputs of the
    release that will score them, and score them there.

    A front-end that routed already (to answer 404 before reading the body) passes its ``route``.
    With ``wire_request`` (the body as received) and ``encode_response`` (the answer as it will be
    sent), the prediction log keeps both as they are on the wire instead of re-encoding the frames,
    and ``result.response_json`` is the answer's body, encoded once for the client and the log.
    """
    configs = configs_from(parameters)
    if route is None:
        contract = model_contract(name)
        route = gateway.route(contract, version_fqrv(contract, version).release if version else None, configs=configs)
    else:  # routed by the front-end, which parsed the name already: not parsed a second time
        contract = route.state.contract
    await gateway.load_routed(route)  # a cold release: loaded before its inputs lay out the tensors
    if classification:
        check_can_classify(gateway, route, classification)
    explain = parameters.get("explain", False)
    if not isinstance(explain, bool):
        raise InvalidInput(f"parameters.explain must be true or false, got {explain!r}")
    model_parameters = {k: v for k, v in parameters.items() if k not in TRANSPORT_PARAMETERS and k != "explain"}
    meta = gateway.decoding_metadata(route)
    frame, layout = decode_inputs(tensors, meta.inputs if meta else (), model_parameters, meta.outputs if meta else ())
    result = await gateway.infer(
        contract,
        frame,
        configs=configs,
        request_id=request_id,
        protocol=protocol,
        timeout_s=timeout_s,
        route=route,
        explain=explain,
        wire=Wire(wire_request, partial(_with_layout, encode_response, layout))
        if wire_request is not None and encode_response is not None
        else None,
    )
    return result, layout


@dataclass(frozen=True, slots=True)
class _PlainInputs:
    """What the plain path needs of a release's metadata, worked out once per release."""

    metadata: ServableMetadata | None
    #: Input names: a one-tensor request named after none of them is in the np layout.
    names: frozenset[str]
    #: Inputs that do not take a ``[n]`` tensor as it is (vectors per row).
    reshaped: frozenset[str]
    #: The layout of a plain request (pd, one axis), with the declared outputs the answer follows.
    layout: Layout
    #: The inputs in metadata order: the columns of an np tensor (empty when one input takes a vector).
    order: tuple[str, ...] = ()
    #: The layouts of an np request, without and with ``parameters.content_type`` naming it.
    np_layouts: tuple[Layout, Layout] = (Layout(NP, 2), Layout(NP, 2, True))


#: The plain inputs of the releases seen, by the id of their metadata (checked to be it).
_PLAIN: dict[int, _PlainInputs] = {}
_NO_METADATA = _PlainInputs(None, frozenset(), frozenset(), Layout(PD, 1))


def _plain_inputs(meta: ServableMetadata | None) -> _PlainInputs:
    """What the plain paths need of ``meta``, worked out on its first request."""
    if meta is None:
        return _NO_METADATA
    plain = _PLAIN.get(id(meta), _NO_METADATA)
    if plain.metadata is meta:
        return plain
    specs = meta.inputs
    declared = tuple((s.name, tuple(s.shape)) for s in meta.outputs)
    vector = len(specs) == 1 and len(specs[0].shape) > 1  # decode_inputs' "the one input takes a vector"
    plain = _PlainInputs(
        meta,
        frozenset(s.name for s in specs),
        frozenset(s.name for s in specs if len(s.shape) > 1 and tuple(s.shape[1:]) != (1,)),
        Layout(PD, 1, False, declared),
        () if vector else tuple(s.name for s in specs),
        (Layout(NP, 2, False, declared), Layout(NP, 2, True, declared)),
    )
    if len(_PLAIN) >= MAX_CACHED_CONTRACTS:
        _PLAIN.clear()
    _PLAIN[id(meta)] = plain
    return plain


def plain_layout(meta: ServableMetadata | None, columns: dict[str, np.ndarray]) -> Layout | None:
    """The layout :func:`~forestflow.codecs.v2.decode_inputs` gives 1-D pd tensors ``columns`` for a
    release of this metadata when it takes them as they are (each a one-value-per-row input, or no
    input), else None (a vector input; or one tensor named after no input, which is np)."""
    plain = _plain_inputs(meta)
    if plain.reshaped and not plain.reshaped.isdisjoint(columns):
        return None
    if len(columns) == 1 and plain.names and next(iter(columns)) not in plain.names:
        return None
    return plain.layout


def np_plain(
    meta: ServableMetadata | None, name: str, values: tuple[np.ndarray, ...], explicit: bool
) -> tuple[dict[str, np.ndarray], Layout] | None:
    """The columns and layout :func:`~forestflow.codecs.v2.decode_inputs` gives one ``[N, F]`` tensor
    ``name`` whose F columns are ``values``, for a release of this metadata, when it reads it as np
    (``explicit``: the request said so; else the tensor is named after no input), one column per
    input in metadata order; None for any other case (no inputs declared, one vector input, a
    width that is not the input count, a tensor named after an input), which the general path decodes."""
    plain = _plain_inputs(meta)
    order = plain.order
    if len(values) != len(order) or not order or (not explicit and name in plain.names):
        return None
    return dict(zip(order, values)), plain.np_layouts[explicit]


def plain_answer(name: str, request_id: str, fqrv: FQRV, frame: Frame, layout: Layout) -> bytes | None:
    """The V2 response body of an answer whose every output is a 1-D column of numbers or of text,
    with nothing else to say (no explanation, no metadata returned by the model's steps): what
    the general encoding writes for it, in fewer steps; None for any other answer."""
    parameters = frame.parameters
    if parameters and (RESPONSE_METADATA in parameters or EXPLANATION in parameters):
        return None
    declared = dict(layout.outputs) if layout.rank != 2 and layout.outputs else None
    outputs = []
    for output, column in frame.columns.items():
        datatype = _PLAIN_DATATYPES.get(column.dtype)
        if datatype is None or column.ndim != 1:
            return None
        if datatype == "BYTES":
            data: Any = column.tolist()
            if not _ONLY_STR.issuperset(map(type, data)):
                return None  # bytes (images, not UTF-8) or other objects: the general encoding
        else:
            data = column if column.flags.c_contiguous else np.ascontiguousarray(column)
        shape = declared.get(output) if declared is not None else None
        if layout.rank == 2 or (shape is not None and len(shape) >= 2):
            outputs.append({"name": output, "datatype": datatype, "shape": [len(column), 1], "data": data})
        else:
            outputs.append({"name": output, "datatype": datatype, "shape": [len(column)], "data": data})
    reply: dict[str, Any] = {"model_name": name, "model_version": fqrv.release, "id": request_id}
    if layout.explicit:
        reply["parameters"] = {"content_type": layout.content_type}
    reply["outputs"] = outputs
    return orjson.dumps(reply, option=orjson.OPT_SERIALIZE_NUMPY)


#: The dtypes whose 1-D columns :func:`plain_answer` writes, and their V2 datatype.
_PLAIN_DATATYPES = {dtype: name for name, dtype in DATATYPES.items()}
_ONLY_STR = frozenset({str})


def explanation_tensor(fqrv: FQRV, frame: Frame) -> Tensor | None:
    """The ``contributions`` output of an explained answer (``[n, F+1]``, or ``[n, groups, F+1]``),
    its parameters naming the columns (the bias last), the groups, the method and the release."""
    explanation = frame.parameters.get(EXPLANATION)
    if not isinstance(explanation, Explanation):
        return None
    values = explanation.values
    array = values[:, 0, :] if values.shape[1] == 1 else values
    parameters = {"columns": explanation.names, "groups": explanation.groups, "method": explanation.method, "release": str(fqrv)}
    return Tensor("contributions", "FP64", np.ascontiguousarray(array), parameters)


def _with_layout(encode: Callable[[FQRV, Frame, Layout], WireBody], layout: Layout, fqrv: FQRV, frame: Frame) -> WireBody:
    return encode(fqrv, frame, layout)
