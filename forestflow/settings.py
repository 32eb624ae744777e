"""Gateway settings: one typed object, from defaults, a TOML file, then ``FORESTFLOW_*`` variables.

Every field below can be set in the TOML file (flat, or in sections: ``[kafka] topic = "x"`` is
``kafka_topic``) and by the environment variable ``FORESTFLOW_<FIELD>`` in upper case. Values
are validated at start; a bad one raises :class:`SettingsError` with one clear line.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "FORESTFLOW_"
#: A legal Kafka topic name.
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class SettingsError(ValueError):
    """A setting that cannot be used; the message is one line naming it."""


def _doc(text: str, **kw: Any) -> Any:
    return field(metadata={"doc": text}, **kw)


@dataclass(frozen=True)
class Settings:
    """Everything the gateway can be configured with."""

    host: str = _doc("address the HTTP API binds", default="127.0.0.1")
    port: int = _doc("HTTP API port (0 = any free port)", default=8090)
    data_dir: Path = _doc("where registry state, the artifact cache and the local log live", default=Path("forestflow-data"))
    admin_token: str = _doc("bearer token required on admin routes (empty = no auth)", default="")
    insecure_admin: bool = _doc("allow a non-loopback bind without an admin token", default=False)
    allow_python: bool = _doc("allow the Python flavor (runs code an admin request names)", default=False)
    repository: str = _doc("model repository directory whose entries are deployed at start (empty = none)", default="")
    log_level: str = _doc("structlog level: debug, info, warning, error", default="info")
    access_log: bool = _doc("one JSON line per request", default=True)
    http_fast_path: bool = _doc(
        "answer scoring requests (/score, /explain, V2 infer, V1 :predict/:explain, GraphPipe) on the HTTP fast "
        "path, without aiohttp's request objects, middleware and router per request (docs/performance.md); "
        "false: every request goes through aiohttp",
        default=True,
    )
    event_loop: str = _doc(
        "asyncio, or uvloop (measured 0-5% fewer CPU microseconds per request here, within run-to-run "
        "noise; the whole suite passes on both with FF_TEST_LOOP=uvloop)",
        default="asyncio",
    )

    grpc_port: int = _doc("V2 gRPC port (-1 disables it, 0 = any free port)", default=8081)
    otel_exporter_otlp_endpoint: str = _doc(
        "OpenTelemetry collector base URL for traces over OTLP/HTTP protobuf (spans to <url>/v1/traces); "
        "empty = tracing off unless OTEL_EXPORTER_OTLP_ENDPOINT is set (the other OTEL_* variables are the SDK's)",
        default="",
    )
    otel_traces_sampler_ratio: float = _doc(
        "share of new traces sampled (a caller's sampled traceparent is followed)", default=1.0
    )

    workers: int = _doc(
        "worker processes serving the same ports (0 = one per available core); they share the registry "
        "through the file store (or Redis) and one prediction log",
        default=1,
    )
    file_sync_interval_s: float = _doc("how often a worker checks the file store for other workers' changes", default=0.25)
    worker_broken_restart_s: float = _doc(
        "restart a worker of --workers N whose release loads have kept failing this long while another "
        "worker is ready (0 = never)",
        default=300.0,
    )
    load_retry_first_s: float = _doc(
        "delay before a failed load of a release learnt from the store (or restored, or from the model "
        "repository) is tried again; doubled after each failure, cut by up to half at random",
        default=0.5,
    )
    load_retry_max_s: float = _doc("the longest delay between two load attempts of one release", default=30.0)
    lazy_loading: bool = _doc(
        "restore (at start) and follow (from the store) releases without loading them: the gateway is ready "
        "once routing state is restored; a release loads on its first request and in the background",
        default=False,
    )
    warm_concurrency: int = _doc(
        "background loads at once of releases not loaded yet (lazy loading; routed, most used first; 0 = none)",
        default=2,
    )
    model_memory_budget_mb: int = _doc(
        "memory for loaded releases per process, in MiB (0 = no budget); least recently used idle releases "
        "are unloaded to make room; implies lazy_loading",
        default=0,
    )

    redis_url: str = _doc("redis://... to share the registry between replicas (empty = file store)", default="")
    redis_sync_interval_s: float = _doc("period of the registry version check against Redis", default=2.0)

    kafka_bootstrap_servers: str = _doc("host:port[,host:port] of Kafka (empty = local file log)", default="")
    kafka_topic: str = _doc("topic for BASIC and V2 prediction events", default="forestflow.predictions")
    kafka_gp_topic: str = _doc("topic for GraphPipe prediction events", default="forestflow.predictions.gp")
    kafka_compression: str = _doc("none, gzip, lz4 or zstd", default="zstd")
    kafka_acks: str = _doc("0, 1 or all", default="all")
    kafka_linger_ms: int = _doc(
        "batching delay of the Kafka ingest replies' producer (the prediction log batches by log_linger_ms)", default=5
    )
    kafka_enable_idempotence: bool = _doc("idempotent producer (off for brokers that lack it)", default=True)
    kafka_request_timeout_ms: int = _doc("per produce request", default=10000)
    kafka_ingest_topics: str = _doc(
        "comma-separated topics whose messages are scoring requests (empty = no Kafka ingestion; uses kafka_bootstrap_servers)",
        default="",
    )
    kafka_ingest_group: str = _doc(
        "consumer group of the gateway replicas reading kafka_ingest_topics", default="forestflow-ingest"
    )
    kafka_reply_topic: str = _doc(
        "where answers go when a request names no forestflow-reply-topic header (empty = such requests are dropped and counted)",
        default="forestflow.replies",
    )
    kafka_create_topics: bool = _doc(
        "create the ingestion and reply topics at start when they are missing (needs the broker's permission)",
        default=True,
    )
    kafka_ingest_session_timeout_ms: int = _doc(
        "how long a replica may be silent before the group hands its partitions to the others", default=10000
    )
    kafka_ingest_fetch_max_wait_ms: int = _doc(
        "longest a fetch of request messages waits on the broker when there are none (Kafka answers as soon "
        "as one arrives; a broker that holds every fetch this long, like the test broker, needs a small value)",
        default=500,
    )

    log_file: str = _doc("local prediction log (relative to data_dir) used without Kafka", default="predictions.jsonl")
    log_file_format: str = _doc("jsonl or protobuf (length-delimited)", default="jsonl")
    log_file_cache_mb: int = _doc(
        "MiB of the local prediction log's end kept in the page cache for readers (logs tail, a log shipper); "
        "older parts are handed to writeback and dropped from the cache as the file grows (0: left to the kernel)",
        default=64,
    )
    log_buffer_bytes: int = _doc("bytes of prediction events held while the sink is slow or away", default=64 * 1024 * 1024)
    log_linger_ms: int = _doc(
        "how long the prediction log gathers events into one write/produce batch, at most (a batch of 500 "
        "events, or shutdown, ends it sooner); each Kafka produce costs the gateway ~0.7 ms of CPU however "
        "few events it carries",
        default=200,
    )
    log_sample_every: int = _doc("SAMPLE logging shadows one request in this many", default=100)
    log_flush_timeout_s: float = _doc("how long shutdown waits to flush the prediction log", default=10.0)

    request_timeout_ms: int = _doc("default deadline of a scoring request", default=30000)
    scoring_slots: int = _doc("concurrent predict calls per servable (when its flavor sets none)", default=2)
    scoring_threads: int = _doc(
        "most threads one servable's predict calls may occupy: its slots plus calls still running after "
        "their deadline (at least 2 x its slots; threads start only when needed)",
        default=16,
    )
    live_queue: int = _doc("live requests queued per servable before 503", default=64)
    shadow_queue: int = _doc("shadow copies queued per servable before they are dropped", default=64)
    max_batch_rows: int = _doc(
        "most rows scored in one combined call of concurrent requests (0 or 1 = no micro-batching); "
        "a servable's flavor setting maxBatchRows overrides it",
        default=512,
    )
    max_batch_wait_us: int = _doc(
        "how long a request may wait for others to share its model call, only while other requests of "
        "its servable are being scored (0 = never waits: under load, waiting requests are combined "
        "anyway); a servable's flavor setting maxBatchWaitUs overrides it",
        default=0,
    )
    max_body_bytes: int = _doc("largest request body accepted (after decompression)", default=64 * 1024 * 1024)
    max_rows: int = _doc("largest batch (records) accepted", default=100000)
    max_image_pixels: int = _doc(
        "largest image (width x height, read from its header before any pixel is decoded) an image_decode "
        "pipeline step accepts: a larger one is a 400, so a small file cannot decompress into gigabytes",
        default=40_000_000,
    )
    explain_max_rows: int = _doc("largest batch (records) one explanation request may hold", default=1000)
    kernel_shap_max_samples: int = _doc(
        "most coalitions KernelSHAP evaluates per explained record (a definition's samples above it are refused)",
        default=4096,
    )
    kernel_shap_max_background: int = _doc("most background rows a KernelSHAP explainer may declare", default=1000)
    evaluation_interval_s: float = _doc("contract re-evaluation period (phase-in, validity)", default=5.0)
    metrics_flush_interval_s: float = _doc("how often counters are persisted", default=1.0)
    feedback_index_size: int = _doc(
        "recent answers kept per process for reward feedback (request id -> the release that answered)",
        default=100000,
    )
    feedback_ttl_s: float = _doc("how long an answer accepts reward feedback (POST .../feedback)", default=3600.0)
    shutdown_timeout_s: float = _doc("grace period for in-flight requests at shutdown", default=30.0)
    h2o_scorer: str = _doc(
        "how H2O MOJOs are scored: auto (GBM/DRF natively, without Java; other kinds with genmodel in the "
        "JVM), jvm (everything with genmodel) or native (GBM/DRF only, never a JVM); a servable's flavor "
        'object may override it with "scorer"',
        default="auto",
    )
    jvm_opts: str = _doc(
        "extra options of the in-process JVM that scores H2O MOJOs, split like a shell line (e.g. -Xmx1g); "
        "read when the JVM starts (the first JVM-scored model load)",
        default="",
    )
    genmodel_jar: str = _doc(
        "jar holding the H2O genmodel classes (e.g. a standalone h2o-genmodel.jar; empty = the h2o wheel's h2o.jar)",
        default="",
    )

    # Model sources (docs/sources.md).
    artifact_roots: str = _doc(
        "comma-separated directories file:// deploys may read (empty = the data dir and the working directory)",
        default="",
    )
    artifact_max_bytes: int = _doc("largest artifact fetched or copied (a directory counts whole)", default=2 * 1024**3)
    artifact_download_timeout_s: float = _doc("time allowed to fetch one artifact (HTTP, S3, Git)", default=300.0)
    git_ssh_scheme: str = _doc("git@host:org/project.git is fetched as <scheme>://host/org/project.git", default="https")
    git_ssl_verify: bool = _doc("verify TLS certificates of Git servers", default=True)

    # Remote backends (RemoteV2 servables: models served by another V2 server).
    remote_max_concurrency: int = _doc(
        "requests in flight to one RemoteV2 backend (more wait in its queue); a servable's maxConcurrency overrides it",
        default=16,
    )
    remote_failure_threshold: int = _doc(
        "consecutive failures of a RemoteV2 backend (unreachable, 5xx, timeouts) that open its circuit: "
        "requests then answer 503 at once until a probe finds it ready again",
        default=5,
    )
    remote_cooldown_s: float = _doc(
        "how long an open circuit waits before it probes its backend (and between probes)", default=2.0
    )

    drain_grace_s: float = _doc(
        "on SIGTERM, how long the gateway keeps accepting requests with readiness failing (so load balancers "
        "stop sending) before it stops listening and finishes what is in flight",
        default=5.0,
    )
    metrics: bool = _doc("count requests for /metrics (Prometheus); off only to measure what counting costs", default=True)

    def __post_init__(self) -> None:
        _check(0 <= self.port <= 65535, "port", self.port, "an integer 0..65535")
        _check(-1 <= self.grpc_port <= 65535, "grpc_port", self.grpc_port, "an integer -1..65535")
        _check(bool(self.host), "host", self.host, "an address")
        _check(
            self.log_level in ("debug", "info", "warning", "error"), "log_level", self.log_level, "debug, info, warning or error"
        )
        _check(self.event_loop in ("uvloop", "asyncio"), "event_loop", self.event_loop, "uvloop or asyncio")
        _check(
            self.kafka_compression in ("none", "gzip", "lz4", "zstd"),
            "kafka_compression",
            self.kafka_compression,
            "none, gzip, lz4 or zstd",
        )
        _check(self.kafka_acks in ("0", "1", "all"), "kafka_acks", self.kafka_acks, "0, 1 or all")
        _check(self.h2o_scorer in ("auto", "jvm", "native"), "h2o_scorer", self.h2o_scorer, "auto, jvm or native")
        _check(self.log_file_format in ("jsonl", "protobuf"), "log_file_format", self.log_file_format, "jsonl or protobuf")
        _check(bool(self.kafka_topic), "kafka_topic", self.kafka_topic, "a topic name")
        _check(bool(self.kafka_gp_topic), "kafka_gp_topic", self.kafka_gp_topic, "a topic name")
        if self.kafka_ingest_topics:
            _check(self.kafka_enabled, "kafka_ingest_topics", self.kafka_ingest_topics, "kafka_bootstrap_servers to be set too")
            for topic in self.kafka_ingest_topic_list:
                _check(bool(_TOPIC.match(topic)), "kafka_ingest_topics", self.kafka_ingest_topics, "comma-separated topic names")
            _check(bool(self.kafka_ingest_group.strip()), "kafka_ingest_group", self.kafka_ingest_group, "a group id")
        _check(
            not self.kafka_reply_topic or bool(_TOPIC.match(self.kafka_reply_topic)),
            "kafka_reply_topic",
            self.kafka_reply_topic,
            "a topic name (or empty)",
        )
        _check(
            not self.redis_url or self.redis_url.startswith(("redis://", "rediss://", "unix://")),
            "redis_url",
            self.redis_url,
            "a redis:// URL",
        )
        for name in (
            "kafka_ingest_session_timeout_ms",
            "kafka_ingest_fetch_max_wait_ms",
            "scoring_slots",
            "scoring_threads",
            "remote_max_concurrency",
            "remote_failure_threshold",
            "remote_cooldown_s",
            "log_sample_every",
            "request_timeout_ms",
            "max_body_bytes",
            "max_rows",
            "max_image_pixels",
            "explain_max_rows",
            "kernel_shap_max_samples",
            "kernel_shap_max_background",
            "log_buffer_bytes",
        ):
            _check(getattr(self, name) > 0, name, getattr(self, name), "a positive number")
        for name in (
            "live_queue",
            "shadow_queue",
            "max_batch_rows",
            "max_batch_wait_us",
            "kafka_linger_ms",
            "workers",
            "log_linger_ms",
            "log_file_cache_mb",
            "warm_concurrency",
            "model_memory_budget_mb",
        ):
            _check(getattr(self, name) >= 0, name, getattr(self, name), "zero or more")
        _check(self.max_batch_wait_us <= 1_000_000, "max_batch_wait_us", self.max_batch_wait_us, "0..1000000 microseconds")
        _check(self.drain_grace_s >= 0, "drain_grace_s", self.drain_grace_s, "zero or more seconds")
        for name in (
            "evaluation_interval_s",
            "metrics_flush_interval_s",
            "redis_sync_interval_s",
            "log_flush_timeout_s",
            "file_sync_interval_s",
            "feedback_ttl_s",
            "load_retry_first_s",
        ):
            _check(getattr(self, name) > 0, name, getattr(self, name), "a positive number of seconds")
        _check(self.feedback_index_size > 0, "feedback_index_size", self.feedback_index_size, "a positive number of answers")
        _check(
            self.load_retry_max_s >= self.load_retry_first_s,
            "load_retry_max_s",
            self.load_retry_max_s,
            "seconds, at least load_retry_first_s",
        )
        _check(self.worker_broken_restart_s >= 0, "worker_broken_restart_s", self.worker_broken_restart_s, "zero or more seconds")
        _check(not self.repository or Path(self.repository).is_dir(), "repository", self.repository, "an existing directory")
        _check(self.artifact_max_bytes > 0, "artifact_max_bytes", self.artifact_max_bytes, "a positive number of bytes")
        _check(
            self.artifact_download_timeout_s > 0,
            "artifact_download_timeout_s",
            self.artifact_download_timeout_s,
            "a positive number of seconds",
        )
        _check(
            not self.genmodel_jar or Path(self.genmodel_jar).is_file(),
            "genmodel_jar",
            self.genmodel_jar,
            "an existing jar file (or empty)",
        )
        try:
            shlex.split(self.jvm_opts)
        except ValueError:
            _check(False, "jvm_opts", self.jvm_opts, "JVM options split like a shell line (unbalanced quotes?)")
        _check(self.git_ssh_scheme in ("http", "https"), "git_ssh_scheme", self.git_ssh_scheme, "http or https")
        if not self.admin_token and not self.insecure_admin and not _is_loopback(self.host):
            raise SettingsError(
                f"refusing to bind {self.host} with no admin token: set FORESTFLOW_ADMIN_TOKEN or pass --insecure-admin"
            )

    @property
    def file_roots(self) -> list[Path]:
        """Directories file:// deploys may read (resolved): ``artifact_roots`` or the data dir and cwd."""
        named = [Path(p.strip()) for p in self.artifact_roots.split(",") if p.strip()]
        return [p.expanduser().resolve() for p in (named or [self.data_dir, Path.cwd()])]

    @property
    def lazy(self) -> bool:
        """Whether releases load on first use (``lazy_loading``, or a memory budget)."""
        return self.lazy_loading or self.model_memory_budget_mb > 0

    @property
    def memory_budget_bytes(self) -> int:
        """``model_memory_budget_mb`` in bytes (0 = no budget)."""
        return self.model_memory_budget_mb * 1024 * 1024

    @property
    def kafka_enabled(self) -> bool:
        """Whether prediction events go to Kafka (else to the local file)."""
        return bool(self.kafka_bootstrap_servers)

    @property
    def kafka_ingest_topic_list(self) -> tuple[str, ...]:
        """The topics named by ``kafka_ingest_topics``."""
        return tuple(t.strip() for t in self.kafka_ingest_topics.split(",") if t.strip())

    @classmethod
    def load(
        cls,
        config_file: str | Path | None = None,
        environ: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> Settings:
        """Defaults <- TOML file <- environment <- explicit overrides (CLI flags)."""
        values: dict[str, Any] = {}
        if config_file:
            values.update(_read_toml(Path(config_file)))
        env = os.environ if environ is None else environ
        names = {f.name for f in dataclasses.fields(cls)}
        for name in names:
            key = ENV_PREFIX + name.upper()
            if key in env:
                values[name] = env[key]
        unknown_env = [k for k in env if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :].lower() not in names]
        if unknown_env:
            raise SettingsError(f"unknown setting {unknown_env[0]}")
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls(**{name: _coerce(cls, name, value) for name, value in values.items()})


def _check(ok: bool, name: str, value: Any, expected: str) -> None:
    if not ok:
        raise SettingsError(f"invalid {name} = {value!r}: expected {expected} (FORESTFLOW_{name.upper()})")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file {path} not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    flat: dict[str, Any] = {}

    def walk(prefix: str, table: dict[str, Any]) -> None:
        for key, value in table.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(f"{name}_", value)
            else:
                flat[name] = value

    walk("", data)
    names = {f.name for f in dataclasses.fields(Settings)}
    for name in flat:
        if name not in names:
            raise SettingsError(f"unknown setting {name!r} in {path}")
    return flat


def _coerce(cls: type[Settings], name: str, value: Any) -> Any:
    if name not in {f.name for f in dataclasses.fields(cls)}:
        raise SettingsError(f"unknown setting {name!r}")
    default = next(f.default for f in dataclasses.fields(cls) if f.name == name)
    try:
        if isinstance(default, bool):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError
        if isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(str(value).strip()) if not isinstance(value, (int, float)) else int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, Path):
            return Path(str(value))
        return str(value)
    except (TypeError, ValueError):
        kind = type(default).__name__
        raise SettingsError(f"invalid {name} = {value!r}: expected {kind} (FORESTFLOW_{name.upper()})") from None
