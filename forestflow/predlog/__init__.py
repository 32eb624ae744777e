"""The prediction log: events for every prediction, buffered in front of Kafka or a local file."""

from __future__ import annotations

from forestflow.predlog.log import PredictionLog, Sink
from forestflow.settings import Settings


def make_sink(settings: Settings) -> Sink:
    """Kafka when bootstrap servers are configured, else the local file under the data dir."""
    if settings.kafka_enabled:
        from forestflow.predlog.kafka_sink import KafkaSink

        return KafkaSink.from_settings(settings)
    from forestflow.predlog.file_sink import FileSink

    return FileSink(settings.data_dir / settings.log_file, settings.log_file_format, settings.log_file_cache_mb * 1024 * 1024)


def make_prediction_log(settings: Settings) -> PredictionLog:
    """The prediction log configured by ``settings``."""
    return PredictionLog(make_sink(settings), settings.log_buffer_bytes, linger_s=settings.log_linger_ms / 1000)
