"""The Servable interface every flavor implements, and the flavor registry."""

from __future__ import annotations

import abc
import asyncio
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
    A flavor that waits on another server instead (``runs_on_loop``) implements ``aload`` and
    ``apredict``, awaited on the loop; its ``load``/``predict`` serve callers on other threads
    (pipeline steps).
    """

    #: How many ``predict`` calls may run at once for this servable (None = scheduler default).
    max_concurrency: int | None = None
    #: Live batches of at most this many rows are scored on the event loop, without a thread hop.
    #: Only for flavors whose small batches take well under ~100 us and never block (0 = only empty
    #: batches; -1 = never, for servables whose ``predict`` must not run on the loop at all).
    inline_max_rows: int = 0
    #: Whether ``predict`` reads ``frame.parameters`` (request configs): if not, requests with
    #: different configs may be scored together in one call.
    reads_parameters: bool = True
    #: Whether the scheduler may score several requests' rows in one ``predict`` call (micro-batching,
    #: up to the servable's ``maxBatchRows``, on threads and on the loop): only for a ``predict`` that
    #: scores row by row, so every request can be handed its own rows of the answer.
    batchable: bool = False
    #: Whether the servable scores on the event loop, as a coroutine (``aload``/``apredict``), not
    #: in a thread: flavors that wait on the network (remote backends) rather than compute.
    runs_on_loop: bool = False
    #: Whether ``predict`` converts each declared input to its datatype itself (with its own 400s):
    #: the gateway then checks only the shapes of declared inputs, not their datatypes.
    converts_inputs: bool = False
    #: Whether the servable explains its trees exactly: it then implements
    #: ``runtime.treeshap.TreeExplainable`` (``shap_inputs``). A flavor may decide at load (an H2O
    #: MOJO scored natively does; one scored by genmodel does not). Other servables may still be
    #: explained model-agnostically when their definition declares an ``explainer`` (KernelSHAP).
    tree_explainable: bool = False

    def __init__(self, fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> None:
        self.fqrv = fqrv
        self.artifact_dir = artifact_dir
        self.settings = settings
        self.ready = False
        #: The gateway's Settings, set by the registry before ``load`` (flavors that compose others
        #: read its gates, e.g. ``allow_python``); None when a servable is built on its own.
        self.gateway_settings: Any = None
        #: The event loop the gateway serves on, set by the registry before ``load`` (flavors that
        #: run on it reach it from a pipeline's thread through this); None when built on its own.
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Set by the registry when it loads a definition it accepted before (at start, or learnt
        #: from the shared store): a servable that depends on another server then loads degraded,
        #: waiting for that server, rather than fail the gateway's readiness while it is away.
        self.restoring = False

    @abc.abstractmethod
    def load(self) -> None:
        """Load the artifact and warm the model; raise ``CreateServableRequestInvalidError`` on failure."""

    @abc.abstractmethod
    def predict(self, frame: Frame) -> Frame:
        """Score a batch: one output row per input row, in order."""

    @abc.abstractmethod
    def metadata(self) -> ServableMetadata:
        """Inputs and outputs of the loaded model."""

    async def aload(self) -> None:
        """``load`` of a servable that ``runs_on_loop``, awaited on the event loop instead."""
        raise NotImplementedError(f"{type(self).__name__} does not run on the event loop")

    async def apredict(self, frame: Frame, timeout_s: float) -> Frame:
        """``predict`` of a servable that ``runs_on_loop``: at most ``timeout_s``, cancellable."""
        raise NotImplementedError(f"{type(self).__name__} does not run on the event loop")

    def unload(self) -> None:
        """Release what ``load`` acquired."""
        self.ready = False

    async def aunload(self) -> None:
        """``unload`` on the event loop: servables that ``runs_on_loop`` close their connections here."""
        self.unload()

    def backend_state(self) -> dict[str, Any] | None:
        """Where a servable that scores on another server sends its work, and whether that server is
        up (``/metadata``, ``/metrics``, the page); None for servables that score here."""
        return None

    def health_problem(self) -> str | None:
        """Why this loaded servable cannot score now (None: it can); readiness reports it."""
        return None
