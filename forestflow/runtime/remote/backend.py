"""What a RemoteV2 servable needs of a backend client, whatever the transport (REST or gRPC).

Clients raise the gateway's own errors, so the servable and the front-ends treat a remote failure
like any other: :class:`~forestflow.errors.BackendUnavailable` (unreachable, reset, overloaded:
503), :class:`~forestflow.errors.DeadlineExceeded` (no answer in time: 504),
:class:`~forestflow.errors.InvalidInput` (the backend refused the request as malformed: 400, with
its message) and :class:`~forestflow.errors.BackendFailed` (a 5xx or an answer that cannot be
read: 502). :class:`NotSent` marks the one failure after which a retry cannot score twice.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forestflow.codecs.v2_tensor import Tensor
from forestflow.core.frame import TensorSpec
from forestflow.errors import BackendUnavailable


class NotSent(BackendUnavailable):
    """The connection could not be made: the backend never saw the request (safe to retry)."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A backend model's metadata (V2 ``$metadata_model_response``)."""

    name: str
    platform: str
    versions: tuple[str, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


class Backend(abc.ABC):
    """One backend model over one transport; pooled connections opened once, reused by every call."""

    #: The protocol name (``rest`` or ``grpc``), for metadata.
    protocol: str = ""
    #: Whether tensors travel in the binary layout (gRPC raw contents; REST's extension) or as JSON.
    binary: bool = False

    @abc.abstractmethod
    async def open(self) -> None:
        """Create the connection pool (channel); no I/O yet."""

    @abc.abstractmethod
    async def model_metadata(self, timeout_s: float) -> ModelInfo:
        """The model's metadata; raises the errors above (BackendFailed naming an unknown model)."""

    @abc.abstractmethod
    async def model_ready(self, timeout_s: float) -> bool:
        """Whether the backend says the model can score now (False too when unreachable)."""

    @abc.abstractmethod
    async def infer(
        self, inputs: Sequence[Tensor], parameters: dict[str, Any], timeout_s: float, headers: dict[str, str]
    ) -> list[Tensor]:
        """Score the tensors within ``timeout_s`` (the deadline passed on); the output tensors."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the pool; calls still running fail."""
