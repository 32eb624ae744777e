"""What the service hands to the prediction log: one prediction, served or shadow, ok or failed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.core.policies import LoggingSettings
from forestflow.predlog import _kafka_records


class WireBody(bytes):
    """A V2 request or answer exactly as it was on the wire; logged as is, not re-encoded.

    ``json_length`` is how many bytes of JSON start the body when binary tensors follow it
    (Triton's binary extension); None when the whole body is JSON (REST) or protobuf (gRPC,
    ``protocol`` "v2-grpc"). A V2 front-end hands these to the log as ``request_json`` /
    ``response_json``; the encoders then write a wire event instead of ForestFlow's shape.
    """

    json_length: int | None = None

    @classmethod
    def of(cls, body: bytes, json_length: int | None = None) -> WireBody:
        """``body`` marked as wire bytes."""
        wire = cls(body)
        if json_length is not None:
            wire.json_length = json_length
        return wire


@dataclass(frozen=True, slots=True)
class Wire:
    """A request's body as it came on the wire and the encoder of an answer in the same protocol.

    A front-end hands it to ``Gateway.infer`` so the prediction log keeps the request as sent
    instead of encoding it again. JSON (BASIC ``/score``) and V2 (``request`` a :class:`WireBody`):
    the served answer is encoded once, on the request path, for the caller and the log alike.
    GraphPipe (``graphpipe``): the request is logged as PredictionEventGP's bytes and answers are
    encoded for the log only (the front-end builds its own reply).
    """

    request: bytes
    encode: Callable[[FQRV, Frame], bytes]
    graphpipe: bool = False


@dataclass(slots=True)
class PredictionRecord:
    """One scoring outcome to log (protocol-free; the encoder turns it into a PredictionEvent).

    The service builds it with positional arguments (cheaper than keywords on the request path):
    a new field goes last, and the order of these fields does not change.
    """

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
    #: V2: :class:`WireBody` values, logged as they were on the wire by both encoders.
    request_json: bytes | None = None
    response_json: bytes | None = None
    #: The OpenTelemetry trace id (hex) of the request, "" when tracing is off.
    trace_id: str = ""
    #: Answered by the release the caller pinned (``X-Forestflow-Release``), not by the router.
    pinned: bool = False
    #: A feedback event: the reward reported for the answer to ``request_id`` (no request or
    #: response then; ``configs`` holds the answered request's key features).
    feedback: float | None = None

    @property
    def key(self) -> str | None:
        """The Kafka record key: the request's configs for the servable's key features."""
        return self.logging.key_for(self.configs)

    @property
    def is_wire(self) -> bool:
        """Whether this is a V2 event carrying its request as it was on the wire."""
        return isinstance(self.request_json, WireBody)

    @property
    def is_graphpipe(self) -> bool:
        """Whether this goes to the GraphPipe topic as a PredictionEventGP."""
        return self.raw_request is not None


_kafka_records.set_record_type(
    PredictionRecord,
    tuple(f.name for f in fields(PredictionRecord)),
    tuple(PredictionRecord if f.default is MISSING else f.default for f in fields(PredictionRecord)),
)
#: ``new_record(fqrv, served, request, ...)``: a :class:`PredictionRecord` of positional fields (the later
#: ones at their defaults), built in C without the dataclass's ``__init__``: the service builds one per
#: logged prediction, and the generated ``__init__`` cost about 4.5k instructions of the request.
new_record: Callable[..., PredictionRecord] = _kafka_records.new_record
