"""What the service hands to the prediction log: one prediction, served or shadow, ok or failed."""

from __future__ import annotations

from dataclasses import dataclass

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.core.policies import LoggingSettings


@dataclass(slots=True)
class PredictionRecord:
    """One scoring outcome to log (protocol-free; the encoder turns it into a PredictionEvent)."""

    fqrv: FQRV
    served: bool
    request: Frame
    configs: dict[str, str]
    logging: LoggingSettings
    request_id: str
    protocol: str
    event_time_ms: int
    latency_ms: float
    status: int = 200
    response: Frame | None = None
    error: str = ""
    error_code: str = ""
    #: GraphPipe: the raw request flatbuffer and the encoded response (PredictionEventGP).
    raw_request: bytes | None = None
    raw_response: bytes | None = None
    #: BASIC JSON: the request body as the client sent it and the Prediction JSON it got back,
    #: reused verbatim by the JSON-lines log (the protobuf event is built from the frames).
    request_json: bytes | None = None
    response_json: bytes | None = None

    @property
    def key(self) -> str | None:
        """The Kafka record key: the request's configs for the servable's key features."""
        return self.logging.key_for(self.configs)

    @property
    def is_graphpipe(self) -> bool:
        """Whether this goes to the GraphPipe topic as a PredictionEventGP."""
        return self.raw_request is not None
