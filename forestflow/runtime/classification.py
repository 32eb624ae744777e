"""Triton's classification extension for every servable that gives class probabilities.

A requested output with ``parameters.classification = k`` is answered as BYTES strings
``"score:index:label"``, the k most probable classes of each row, best first (shape ``[N, k]``).
A servable can classify when its metadata says where its class probabilities are: either
``extra["classification"] = {"scores": <[N, K] output>, "labels": [...]}`` (the classifier step,
pipelines ending in one), or an output with a domain of class labels each of which is also an
FP64 output (H2O binomial and multinomial: ``predict`` plus one probability column per class).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forestflow.core.frame import Frame
from forestflow.errors import InvalidInput
from forestflow.runtime.base import ServableMetadata

#: The requested-output parameter of the extension.
CLASSIFICATION = "classification"


@dataclass(frozen=True, slots=True)
class ClassSource:
    """Where a servable's class probabilities are in its output frame."""

    labels: tuple[str, ...]
    #: One ``[N, K]`` output ...
    matrix: str | None = None
    #: ... or one FP64 output per class, in label order.
    columns: tuple[str, ...] = ()


def class_source(meta: ServableMetadata) -> ClassSource | None:
    """Where the class probabilities of a servable are, None if it gives none."""
    declared = meta.extra.get("classification")
    if isinstance(declared, dict) and declared.get("scores"):
        return ClassSource(tuple(str(x) for x in declared.get("labels", ())), matrix=str(declared["scores"]))
    fp64 = {o.name for o in meta.outputs if o.datatype in ("FP64", "FP32") and len(o.shape) == 1}
    for spec in meta.outputs:
        if spec.domain and len(spec.domain) >= 2 and all(label in fp64 for label in spec.domain):
            return ClassSource(tuple(spec.domain), columns=tuple(spec.domain))
    return None


def positive_count(value: object, where: str) -> int:
    """A requested class count: a positive integer (400 otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        raise InvalidInput(f"{where}: expected a positive integer, got {value!r}")
    try:
        k = int(value)
    except ValueError:
        raise InvalidInput(f"{where}: expected a positive integer, got {value!r}") from None
    if k < 1 or (isinstance(value, float) and not value.is_integer()):
        raise InvalidInput(f"{where}: expected a positive integer, got {value!r}")
    return k


def require_classifier(meta: ServableMetadata, servable: str) -> ClassSource:
    """The class source of a servable, or a 400 saying why it cannot classify."""
    source = class_source(meta)
    if source is None:
        raise InvalidInput(
            f"servable {servable} cannot classify: the classification parameter needs class probabilities, "
            f"and its outputs ({', '.join(o.name for o in meta.outputs)}) carry none"
        )
    return source


def classify(source: ClassSource, frame: Frame, k: int) -> np.ndarray:
    """``[N, k]`` BYTES strings ``"score:index:label"`` of the k most probable classes of each row."""
    try:
        if source.matrix is not None:
            probs = np.asarray(frame.columns[source.matrix], dtype=np.float64)
        else:
            probs = np.column_stack([np.asarray(frame.columns[c], dtype=np.float64) for c in source.columns])
    except KeyError as exc:
        raise InvalidInput(f"classification: the answer has no output {exc.args[0]!r}") from None
    n, classes = probs.shape
    k = min(k, classes)
    labels = source.labels if len(source.labels) == classes else tuple(str(i) for i in range(classes))
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    out = np.empty((n, k), dtype=object)
    for i, (row, indices) in enumerate(zip(probs.tolist(), order.tolist())):
        for j, index in enumerate(indices):
            out[i, j] = f"{row[index]:f}:{index}:{labels[index]}"
    return out
