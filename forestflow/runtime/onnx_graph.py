"""What the ONNX flavor reads from a model file before onnxruntime sees it.

The file is parsed with the ``onnx`` package (a model that does not parse is refused at load) to
read what onnxruntime does not expose: the producer, the opsets, the ``metadata_props`` and the
class labels of scikit-learn's ZipMap probability outputs. A ZipMap that produces a graph output
is cut off the graph: its input, the dense ``[N, classes]`` probability tensor, becomes the output
instead. onnxruntime would otherwise hand back one Python dict per row (slow), and the flavor
turns the dense tensor into one column per class anyway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from forestflow.errors import CreateServableRequestInvalidError

#: The metadata key some exporters (and users) set to the feature names of a 2-D input.
FEATURE_NAMES_KEY = "feature_names"


@dataclass(frozen=True, slots=True)
class ZipMapOutput:
    """A ZipMap graph output replaced by its dense probability tensor."""

    name: str  # the ZipMap's output name (the model's output as exported)
    tensor: str  # the dense [N, classes] float tensor the session now returns instead
    labels: tuple[str, ...]  # class labels, in column order (int64 labels as decimal text)
    int_labels: bool  # whether the model's labels are integers


@dataclass(slots=True)
class GraphInfo:
    """The parts of an ONNX model the flavor needs, and the (possibly rewritten) model bytes."""

    producer: str
    ir_version: int
    opsets: dict[str, int]
    graph_name: str
    doc: str
    properties: dict[str, str]
    zipmaps: list[ZipMapOutput] = field(default_factory=list)
    #: The rewritten model (ZipMaps cut off), or None to load the file itself.
    model_bytes: bytes | None = None

    def feature_names(self) -> list[str] | None:
        """``feature_names`` from the metadata props: a JSON list of strings, or comma-separated text."""
        raw = self.properties.get(FEATURE_NAMES_KEY)
        if raw is None or not raw.strip():
            return None
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(n, str) for n in parsed):
            return parsed
        return [n.strip() for n in raw.split(",")]


def _labels(node: onnx.NodeProto) -> tuple[tuple[str, ...], bool] | None:
    for attr in node.attribute:
        if attr.name == "classlabels_int64s" and attr.ints:
            return tuple(str(int(v)) for v in attr.ints), True
        if attr.name == "classlabels_strings" and attr.strings:
            return tuple(v.decode("utf-8", "replace") for v in attr.strings), False
    return None


def _cut_zipmaps(graph: onnx.GraphProto) -> list[ZipMapOutput]:
    """Replace every ZipMap graph output by the probability tensor it reads; returns what was cut."""
    outputs = [o.name for o in graph.output]
    consumed = {name for node in graph.node for name in node.input}
    cut: list[ZipMapOutput] = []
    for node in list(graph.node):
        if node.op_type != "ZipMap" or node.domain != "ai.onnx.ml" or len(node.output) != 1:
            continue
        out = node.output[0]
        labels = _labels(node)
        if out not in outputs or out in consumed or labels is None or node.input[0] in outputs:
            continue
        position = outputs.index(out)
        dense = helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, [None, len(labels[0])])
        graph.output.remove(graph.output[position])
        graph.output.insert(position, dense)
        outputs[position] = node.input[0]
        graph.node.remove(node)
        cut.append(ZipMapOutput(out, node.input[0], labels[0], labels[1]))
    return cut


def read_graph(path: Path, shown_name: str) -> GraphInfo:
    """Parse the model file; 422 (CreateServableRequestInvalidError) when it is no ONNX model."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError, or anything else protobuf raises on garbage
        raise CreateServableRequestInvalidError(
            f"{shown_name!r} is not a valid ONNX model (it does not parse as an ONNX ModelProto: {type(exc).__name__})"
        ) from None
    if not model.HasField("graph") or not model.opset_import:
        raise CreateServableRequestInvalidError(f"{shown_name!r} is not a valid ONNX model (no graph or no opset)")
    graph = model.graph
    info = GraphInfo(
        producer=" ".join(p for p in (model.producer_name, model.producer_version) if p),
        ir_version=int(model.ir_version),
        opsets={(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        graph_name=graph.name,
        doc=(model.doc_string or graph.doc_string).strip(),
        properties={p.key: p.value for p in model.metadata_props},
    )
    info.zipmaps = _cut_zipmaps(graph)
    if info.zipmaps:
        if any(
            t.data_location == TensorProto.EXTERNAL for t in graph.initializer
        ):  # the rewritten bytes must carry every weight: read the external files in
            onnx.load_external_data_for_model(model, str(path.parent))
        info.model_bytes = model.SerializeToString()
    return info
