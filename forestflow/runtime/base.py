"""The Servable interface every flavor implements, and the flavor registry."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forestflow.core.frame import Frame, TensorSpec
from forestflow.core.ids import FQRV


@dataclass(frozen=True, slots=True)
class ServableMetadata:
    """What a servable takes and gives: used by every protocol's metadata call."""

    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Servable(abc.ABC):
    """One loaded release of a model.

    ``load`` and ``predict`` are synchronous and may be CPU-bound: the registry runs ``load`` in a
    worker thread and the scheduler runs ``predict`` off the event loop. ``predict`` must be safe
    to call from several threads at once unless the flavor says otherwise via ``max_concurrency``.
    """

    #: How many ``predict`` calls may run at once for this servable (None = scheduler default).
    max_concurrency: int | None = None
    #: Live batches of at most this many rows are scored on the event loop, without a thread hop.
    #: Only for flavors whose small batches take well under ~100 us and never block (0 = never).
    inline_max_rows: int = 0
    #: Whether ``predict`` reads ``frame.parameters`` (request configs): if not, requests with
    #: different configs may be scored together in one call.
    reads_parameters: bool = True
    #: Whether the scheduler may score several requests' rows in one ``predict`` call (micro-batching,
    #: up to the servable's ``maxBatchRows``, on threads and on the loop): only for a ``predict`` that
    #: scores row by row, so every request can be handed its own rows of the answer.
    batchable: bool = False

    def __init__(self, fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> None:
        self.fqrv = fqrv
        self.artifact_dir = artifact_dir
        self.settings = settings
        self.ready = False
        #: The gateway's Settings, set by the registry before ``load`` (flavors that compose others
        #: read its gates, e.g. ``allow_python``); None when a servable is built on its own.
        self.gateway_settings: Any = None

    @abc.abstractmethod
    def load(self) -> None:
        """Load the artifact and warm the model; raise ``CreateServableRequestInvalidError`` on failure."""

    @abc.abstractmethod
    def predict(self, frame: Frame) -> Frame:
        """Score a batch: one output row per input row, in order."""

    @abc.abstractmethod
    def metadata(self) -> ServableMetadata:
        """Inputs and outputs of the loaded model."""

    def unload(self) -> None:
        """Release what ``load`` acquired."""
        self.ready = False

    def health_problem(self) -> str | None:
        """Why this loaded servable cannot score now (None: it can); readiness reports it."""
        return None
